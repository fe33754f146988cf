"""The closed loop's trainer process: bridge batches → trainer step → PolicyVersion, atomically.

Each step's PolicyVersion is published in the same Kafka transaction that commits the batch's
offsets. A restarted trainer loads the checkpoint of the newest *committed* PolicyVersion (a
checkpoint written by a step whose transaction never committed is ignored and overwritten), and
the bridge hands it exactly the batches that version was not trained on: no batch is lost, none
is trained twice. Adam's moments are not checkpointed; a restart begins them anew.

The same happens inside a running trainer when a step's commit fails (aborted, fenced, the
bridge's partitions lost; `rollstream.cluster.transaction.Rewind`): the in-memory model has learned
from a batch that is not committed, so the trainer reloads the newest committed version and opens a
new bridge, which hands that batch out again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from rollstream import policy_versions
from rollstream.admission import CONSUMED
from rollstream.cluster.transaction import Rewind
from rollstream.config import Settings
from rollstream.contracts.events import POLICY_VERSION
from rollstream.runtime import Output
from rollstream.telemetry import metrics
from trainer_bridge.bridge import TrainerBridge
from trainer_bridge.groups import GroupPolicy
from trainer_bridge.trainer import GRPOConfig, GRPOTrainer, HFPolicy, TinyPolicy

log = logging.getLogger("rollstream.train")


def groups_consumed(trained: int, stats: dict[str, int]) -> int:
    """Groups the trainer is done with: trained in a step, or dropped for any reason. Groups the
    bridge has released but no step has taken yet are not: counting them would let INIT admit
    work that waits behind them, to be dropped as stale when the trainer gets there."""
    return trained + sum(v for k, v in stats.items() if k.startswith("groups_dropped"))


def train(settings: Settings, checkpoint_dir: Path, *, groups_per_batch: int = 4,
          group_policy: GroupPolicy | None = None, config: GRPOConfig | None = None,
          init_checkpoint: Path | None = None, hf_model: Path | None = None,
          max_steps: int | None = None,
          idle_timeout_s: float | None = None,
          on_step: Callable[[dict], None] | None = None) -> int:
    """Run training steps until max_steps or idle; return the number of steps committed.

    Training the embedded policy (no hf_model) sets this process to one torch thread: its ops
    are too small to gain from more, and threads that meet at every op crawl on a busy machine
    (a step: 6 s on one, 11-65 s on two, load 20)."""
    if hf_model is None:
        torch.set_num_threads(1)
    steps = 0

    def committed(event: dict) -> None:
        nonlocal steps
        steps += 1
        if on_step is not None:
            on_step(event)

    while max_steps is None or steps < max_steps:
        try:
            _train_from_latest(
                settings, checkpoint_dir, groups_per_batch=groups_per_batch,
                group_policy=group_policy, config=config, init_checkpoint=init_checkpoint,
                hf_model=hf_model, idle_timeout_s=idle_timeout_s, on_step=committed,
                max_steps=None if max_steps is None else max_steps - steps)
            break
        except Rewind as exc:
            log.warning("a step did not commit (%s); starting again from the newest committed "
                        "policy version", exc)
    return steps


def _train_from_latest(settings: Settings, checkpoint_dir: Path, *, groups_per_batch: int,
                       group_policy: GroupPolicy | None, config: GRPOConfig | None,
                       init_checkpoint: Path | None, hf_model: Path | None,
                       max_steps: int | None, idle_timeout_s: float | None,
                       on_step: Callable[[dict], None]) -> None:
    latest = policy_versions.latest(settings)
    start = Path(latest["uri"]) if latest is not None else (hf_model or init_checkpoint)
    # With an HF model, start is never None: the latest version's weights, or the model's.
    policy = HFPolicy(start) if hf_model is not None and start is not None else TinyPolicy(start)
    trainer = GRPOTrainer(policy, checkpoint_dir, policy.version, config)
    base_consumed = int(latest["metrics"].get(CONSUMED, 0)) if latest is not None else 0
    log.info("training from policy version %d (%s)", policy.version, start or "seed weights")
    steps = trained = 0
    with TrainerBridge(settings, groups_per_batch, group_policy) as bridge:
        bridge.current_version = policy.version
        for batch in bridge.batches(max_steps, idle_timeout_s):
            event = trainer.step(batch)
            trained += len(batch.groups)
            event["metrics"][CONSUMED] = float(
                base_consumed + groups_consumed(trained, bridge.stats))
            for key, value in bridge.stats.items():
                event["metrics"][f"bridge_{key}"] = float(value)
            batch.ack([Output(settings.topics.policy, "policy", POLICY_VERSION, event)])
            bridge.current_version = event["version"]
            metrics.trained(event["version"], batch.trainable, event["metrics"]["tokens"])
            steps += 1
            log.info("step %d: version %d, mean reward %.3f, loss %.4f", steps, event["version"],
                     event["metrics"]["mean_reward"], event["metrics"]["loss"])
            on_step(event)
