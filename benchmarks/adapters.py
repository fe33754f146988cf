"""Do the trainer adapters slow the bridge down? Trajectories/s from <p>.scored through each
adapter into its trainer's types, against the plain iterator, in the same run on one topic.

N scored trajectories (one turn: 3/4 prompt, 1/4 sampled tokens, groups of 8 with varied
rewards) are pre-filled once; each design reads all of them in a consumer group of its own
with a TrainerBridge (decode, groups, GRPO advantages, batches of 4 groups) and acks each batch
(offsets committed) after building its output:

- plain: `to_tensors(batch.trainable)`, the iterator API's tensors;
- trl: `rollout_columns`, GRPOTrainer's rollout_func output;
- trl_async: a TRL `RolloutSample` per sample (`to_rollout_sample`);
- verl: an `AgentLoopOutput` per sample (`agent_loop_output`, verl's pydantic model);
- slime: `group_fields`, the keyword arguments of slime's Sample (slime is not installable);
- tinker: `tinker.Datum`s (`data`).

The trainers come from `make trainer-deps` (.rollstream/trainers first on PYTHONPATH); a design
whose package does not import is recorded as skipped. Target: every adapter >= 0.5 x plain.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import print_table, write_result
from benchmarks.bridge import GROUP, scored_topic
from rollstream.broker import local
from rollstream.cluster.topics import delete_topics
from rollstream.config import Settings

NAME = "adapters"
TARGET_RATIO = 0.5
TOKENS = 2048
GROUPS_PER_BATCH = 4


def _designs() -> dict[str, Callable[[Any], Any] | str]:
    """Each design's work on a batch, or why it cannot run here."""
    from trainer_bridge.tensors import to_tensors

    designs: dict[str, Callable[[Any], Any] | str] = {
        "plain": lambda batch: to_tensors(batch.trainable)}
    try:
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        from trainer_bridge.adapters import trl_adapter

        designs["trl"] = lambda batch: trl_adapter.rollout_columns(
            [s for g in batch.groups for s in g.samples])
        designs["trl_async"] = lambda batch: [
            trl_adapter.to_rollout_sample(RolloutSample, s, i)
            for i, s in enumerate(batch.trainable)]
    except ImportError as exc:
        designs["trl"] = designs["trl_async"] = f"skipped: {exc}"
    try:
        from trainer_bridge.adapters.verl_adapter import agent_loop_output

        designs["verl"] = lambda batch: [agent_loop_output(s) for s in batch.trainable]
    except ImportError as exc:
        designs["verl"] = f"skipped: {exc}"
    from trainer_bridge.adapters.slime_adapter import group_fields

    designs["slime"] = lambda batch: group_fields(batch.groups)
    try:
        import tinker  # noqa: F401

        from trainer_bridge.adapters.tinker_adapter import data

        designs["tinker"] = lambda batch: data(batch.trainable)
    except ImportError as exc:
        designs["tinker"] = f"skipped: {exc}"
    return designs


def through(settings: Settings, name: str, work: Callable[[Any], Any],
            trajectories: int) -> dict[str, Any]:
    from trainer_bridge.bridge import TrainerBridge

    group = f"{settings.prefix}.bench-{name}"
    with TrainerBridge(settings, GROUPS_PER_BATCH, group=group) as bridge:
        start = time.perf_counter()
        seen = 0
        for batch in bridge.batches(trajectories // (GROUP * GROUPS_PER_BATCH),
                                    idle_timeout_s=30):
            work(batch)
            seen += len(batch.samples)
            batch.ack()
        elapsed = time.perf_counter() - start
    return {"trajectories": seen, "seconds": round(elapsed, 3),
            "trajectories_per_s": round(seen / elapsed, 1)}


def run(quick: bool = False) -> dict[str, Any]:
    bootstrap = local.resolve_bootstrap()
    trajectories = 128 if quick else 512
    settings = scored_topic(bootstrap, "adapters", trajectories, TOKENS)
    results: dict[str, Any] = {}
    try:
        for name, work in _designs().items():
            results[name] = (work if isinstance(work, str)
                             else through(settings, name, work, trajectories))
    finally:
        delete_topics(bootstrap, settings.prefix)
    plain = results["plain"]["trajectories_per_s"]
    ratios = {name: round(r["trajectories_per_s"] / plain, 2)
              for name, r in results.items() if isinstance(r, dict) and name != "plain"}
    worst = min(ratios.values())
    doc = {
        "quick": quick,
        "parameters": {"trajectories": trajectories, "tokens_per_trajectory": TOKENS,
                       "group_size": GROUP, "groups_per_batch": GROUPS_PER_BATCH,
                       "work": "bridge (decode + group + advantages + ack) + the design's "
                               "output per batch"},
        "results": results,
        "baseline": {"design": "plain iterator (to_tensors)", "trajectories_per_s": plain},
        "ratios": ratios,
        "ratio_meaning": "adapter trajectories/s / plain iterator trajectories/s",
        "target": {"description": f"every adapter >= {TARGET_RATIO}x the plain iterator",
                   "ratio": worst, "met": worst >= TARGET_RATIO},
    }
    path = write_result(NAME, doc)
    print_table(f"bridge through each adapter -> results/{path.name}",
                ["design", "trajectories/s", "ratio to plain"],
                [[name, r["trajectories_per_s"] if isinstance(r, dict) else r,
                  ratios.get(name, "")] for name, r in results.items()])
    print(f"  target: worst ratio {worst} >= {TARGET_RATIO} -> "
          f"{'MET' if doc['target']['met'] else 'NOT MET'}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
