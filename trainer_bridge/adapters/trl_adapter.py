"""TRL: Rollstream's scored groups as TRL's rollouts.

- `BridgeRollouts`: a `rollout_func` for `trl.GRPOTrainer(rollout_func=...)` that hands the
  trainer the bridge's next batch (groups of `num_generations` samples from a job's scored topic),
  with `callback()` to add to the trainer's callbacks: at each step's end it saves the weights,
  then acknowledges the batch and publishes the step's PolicyVersion in one Kafka transaction
  (with a transactional bridge). A restarted trainer starts from the newest committed version's
  weights (`start_from`) and gets exactly the batches no committed version was trained on.
- `TaskRollouts`: the same in service mode: the trainer's prompts are published as tasks (one
  per distinct prompt, `num_generations` samples each) and their scored groups come back.
- `RolloutWorker`: a rollout worker for `trl.experimental.async_grpo.AsyncGRPOTrainer`, putting
  TRL's `RolloutSample`s on its `rollout_buffer`; each weight sync TRL reports after its first
  (the starting weights) acknowledges the batches the steps since consumed, with `SavedWeights`
  (a `weight_transfer`) giving the weights' path for the PolicyVersion.

The reward TRL trains on is the episode's score from EVAL: pass `rollstream_reward` as the
trainer's reward function (the rollouts carry it as an extra column).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rollstream import policy_versions
from rollstream.config import Settings
from rollstream.contracts.events import POLICY_VERSION, PolicyVersion
from rollstream.runtime import Output
from trainer_bridge.adapters.sequences import split
from trainer_bridge.adapters.tasks import publish_tasks
from trainer_bridge.bridge import Batch, TrainerBridge
from trainer_bridge.groups import Group, GroupPolicy, Sample

REWARD_COLUMN = "rollstream_reward"


def rollstream_reward(completions: list, rollstream_reward: list[float | None],
                      **_: Any) -> list[float | None]:
    """TRL reward function: the score EVAL gave each episode (None for an infra failure, which
    TRL leaves out of the group's statistics)."""
    return list(rollstream_reward)


def start_from(settings: Settings, base: Path) -> tuple[Path, int]:
    """The weights to load and their version: the newest committed PolicyVersion's, else `base`
    as version 0."""
    latest = policy_versions.latest(settings)
    return (Path(latest["uri"]), latest["version"]) if latest is not None else (base, 0)


def check_start(settings: Settings, version: int) -> None:
    """Refuse to start below the newest committed version: the versions this trainer publishes
    would come after newer ones (1 and 2 after 5), and the servers never go back to them."""
    latest = policy_versions.latest(settings)
    if latest is not None and latest["version"] > version:
        raise ValueError(
            f"{settings.topics.policy} holds version {latest['version']} already and this "
            f"trainer starts at version {version}: start from the newest committed weights, "
            "`start, version = trl_adapter.start_from(settings, base_model_dir)`, load `start` "
            "and pass `version` (or use a fresh prefix)")


def version_event(settings: Settings, version: int, uri: Path, step_id: str,
                  metrics: dict[str, float]) -> tuple[Output, PolicyVersion]:
    """The PolicyVersion of a step, and the output its batch's ack commits it as."""
    event: PolicyVersion = {
        "version": version, "kind": "full", "uri": str(uri), "step_id": step_id,
        "metrics": metrics, "created_at_ms": int(time.time() * 1000)}
    return Output(settings.topics.policy, "policy", POLICY_VERSION, event), event


def rollout_columns(samples: list[Sample]) -> dict[str, list]:
    """The rollout_func output of samples, in order: TRL's required keys, `env_mask` (0 on
    observation tokens between turns) and the reward column."""
    seqs = [split(s) for s in samples]
    return {"prompt_ids": [q.prompt_ids for q in seqs],
            "completion_ids": [q.response_ids for q in seqs],
            "logprobs": [q.response_logprobs for q in seqs],
            "env_mask": [q.response_mask for q in seqs],
            REWARD_COLUMN: [s.reward for s in samples]}


def _ordered(groups: list[Group], size: int) -> list[Sample]:
    samples: list[Sample] = []
    for g in groups:
        if len(g.samples) != size:
            raise ValueError(f"task {g.task_id} has {len(g.samples)} samples, the trainer's "
                             f"num_generations is {size}: set the tasks' group_size to it")
        samples += sorted(g.samples, key=lambda s: s.scored["trajectory"]["sample_index"])
    return samples


class BridgeRollouts:
    """`rollout_func` over a TrainerBridge whose batches hold as many samples as the trainer's
    generation batch (groups_per_batch * num_generations)."""

    def __init__(self, bridge: TrainerBridge, checkpoint_dir: Path, version: int = 0,
                 idle_timeout_s: float | None = None) -> None:
        check_start(bridge.settings, version)
        self.bridge = bridge
        self.settings = bridge.settings
        self.checkpoint_dir = Path(checkpoint_dir)
        self.version = version
        self.idle_timeout_s = idle_timeout_s
        self.taken: Batch | None = None
        self.published: list[PolicyVersion] = []  # the events this process committed
        bridge.current_version = version
        self._batches: Iterator[Batch] | None = None

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        if self.taken is not None and not self.taken.acked:
            raise RuntimeError("the previous batch was never acknowledged: add the adapter's "
                               "callback() to the trainer's callbacks")
        groups = self._groups(prompts, trainer.num_generations)
        self.taken = Batch(groups, self.bridge)
        samples = _ordered(groups, trainer.num_generations)
        if len(samples) != len(prompts):
            raise ValueError(f"the bridge's batch has {len(samples)} samples, the trainer asked "
                             f"for {len(prompts)}: make groups_per_batch * num_generations "
                             "the trainer's generation batch size")
        return rollout_columns(samples)

    def _groups(self, prompts: list, num_generations: int) -> list[Group]:
        if self._batches is None:
            self._batches = self.bridge.batches(idle_timeout_s=self.idle_timeout_s)
        batch = next(self._batches, None)
        if batch is None:
            raise RuntimeError(f"no scored batch on {self.bridge.topic} within "
                               f"{self.idle_timeout_s} s")
        return batch.groups

    def step_done(self, model: Any, metrics: dict[str, float] | None = None) -> PolicyVersion:
        """The trainer has stepped on the taken batch: save the weights, then commit the batch
        with its PolicyVersion."""
        if self.taken is None or self.taken.acked:
            raise RuntimeError("a step ended with no batch taken")
        self.version += 1
        path = self.checkpoint_dir / f"policy-v{self.version}"
        model.save_pretrained(path, safe_serialization=True)
        out, event = version_event(self.settings, self.version, path, self.taken.step_id, {
            "samples": float(len(self.taken.samples)), **(metrics or {})})
        self.taken.ack([out])
        self.bridge.current_version = self.version
        self.published.append(event)
        return event

    def callback(self) -> Any:
        """A `transformers.TrainerCallback` calling `step_done` at each step's end."""
        from transformers import TrainerCallback

        adapter = self

        class RollstreamStep(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                adapter.step_done(kw["model"], {"global_step": float(state.global_step)})

        return RollstreamStep()


class TaskRollouts(BridgeRollouts):
    """Service mode: each distinct prompt becomes a task of `env` (`data(prompt)` its data) with
    `num_generations` samples; the call returns once every task's group is scored. Groups of
    other tasks on the scored topic wait for the call that asked for them. The bridge must hand
    out the groups whose rewards are all equal (`GroupPolicy(drop_zero_variance=False)`): a
    dropped group would leave its call waiting."""

    def __init__(self, bridge: TrainerBridge, checkpoint_dir: Path, env: str,
                 data: Callable[[Any], dict] = lambda prompt: {}, version: int = 0,
                 idle_timeout_s: float | None = None) -> None:
        if bridge.assembler.policy.drop_zero_variance:
            raise ValueError("TaskRollouts needs a bridge that keeps zero-variance groups "
                             "(GroupPolicy(drop_zero_variance=False)): TRL asked for every "
                             "prompt's group, and a dropped one would never come back")
        super().__init__(bridge, checkpoint_dir, version, idle_timeout_s)
        self.env = env
        self.data = data
        self._waiting: dict[str, Group] = {}

    def _groups(self, prompts: list, num_generations: int) -> list[Group]:
        distinct = prompts[::num_generations]
        wanted = publish_tasks(self.settings, "trl", self.env, [_text(p) for p in distinct],
                               [self.data(p) for p in distinct], num_generations)
        while not all(t in self._waiting for t in wanted):
            for group in super()._groups(prompts, num_generations):
                self._waiting[group.task_id] = group
        return [self._waiting.pop(t) for t in wanted]


def _text(prompt: Any) -> str:
    """A dataset prompt as a task prompt: a string as it is, a conversation's last message."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


class SavedWeights:
    """A `weight_transfer` for AsyncGRPOTrainer that writes each synced weight set as a
    safetensors file the inference controller can load; `latest` is the newest one's path."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.latest: Path | None = None
        self._count = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        from safetensors.torch import save_file

        self._count += 1
        path = self.directory / f"weights-{self._count}.safetensors"
        save_file({name: t.detach().cpu().contiguous() for name, t in iterator}, str(path))
        self.latest = path

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


class RolloutWorker:
    """AsyncGRPOTrainer's rollout worker over a TrainerBridge.

    TRL reports a version at each weight sync: first at train start (the weights it starts from,
    `version` here, with nothing trained yet), then every `sync_steps` optimizer steps, each
    step consuming `samples_per_step` samples of the buffer in the order they were put there.
    So when it reports its `n`-th version after the first, `n * sync_steps * samples_per_step`
    samples are trained: every batch inside that count is acknowledged with the PolicyVersion
    `version + n` (`weights.latest` as its weights). Samples carry their policy version in
    TRL's numbering, so its staleness check compares like with like. The bridge's staleness
    bound (GroupPolicy.max_staleness) should be the trainer's or tighter, so that the trainer
    drops none and the count holds. The bridge is used only from the worker's thread.

    Give the trainer `AsyncGRPOConfig(token_budget=0)` (each micro-batch
    `per_device_train_batch_size` samples) or a positive per-row token cap: its default, None,
    asks TRL's vLLM server for its max_model_len and waits up to `vllm_server_timeout` (240 s)
    for one, which a worker fed by Rollstream does not need.
    """

    def __init__(self, bridge: TrainerBridge, samples_per_step: int, weights: SavedWeights,
                 version: int = 0, sync_steps: int = 1, max_batches_ahead: int = 2) -> None:
        check_start(bridge.settings, version)
        self.bridge = bridge
        self.samples_per_step = samples_per_step
        self.weights = weights
        self.version = version
        self.sync_steps = sync_steps
        self.max_batches_ahead = max_batches_ahead
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.published: list[PolicyVersion] = []  # the events this worker committed
        self._versions: queue.Queue[int] = queue.Queue()
        self._handed: deque[tuple[int, Batch]] = deque()  # (samples handed through it, batch)
        self._handed_count = 0
        self._base_version: int | None = None  # TRL's number for `version`, its first report
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rollstream-rollouts",
                                        daemon=True)
        bridge.current_version = version

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker; a no-op before `start` (TRL stops it when its setup failed, and
        that failure is the error to see)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)

    def update_model_version(self, model_version: int) -> None:
        self._versions.put(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError(f"the Rollstream rollout worker failed: {self._error!r}")
        idle = time.monotonic() - self._last_progress
        if not self._thread.is_alive() or idle > stale_after_s:
            raise RuntimeError(f"the Rollstream rollout worker has produced nothing for "
                               f"{idle:.0f} s (alive: {self._thread.is_alive()})")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._acknowledge()
                # Nothing is handed before TRL's first report: its numbering is not known yet.
                if self._base_version is None or len(self._handed) >= self.max_batches_ahead:
                    time.sleep(0.05)
                    continue
                for batch in self.bridge.batches(max_batches=1, idle_timeout_s=0.5):
                    self._hand(batch)
            self._acknowledge()  # TRL reports its last step's version just before stop()
        except BaseException as exc:  # surfaced to the trainer by check_health
            self._error = exc

    def _hand(self, batch: Batch) -> None:
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        assert self._base_version is not None
        samples = batch.trainable
        group_ids = {g.task_id: i for i, g in enumerate(batch.groups, start=self._handed_count)}
        for s in samples:
            self.rollout_buffer.put(to_rollout_sample(
                RolloutSample, s, group_ids[s.scored["trajectory"]["task"]["task_id"]],
                self._base_version - self.version))
        self._handed_count += len(samples)
        self._handed.append((self._handed_count, batch))
        self._last_progress = time.monotonic()

    def _acknowledge(self) -> None:
        while True:
            try:
                reported = self._versions.get_nowait()
            except queue.Empty:
                return
            if self._base_version is None:
                self._base_version = reported  # the starting weights: nothing trained yet
                continue
            syncs = reported - self._base_version
            trained = syncs * self.sync_steps * self.samples_per_step
            done = []
            while self._handed and self._handed[0][0] <= trained:
                done.append(self._handed.popleft()[1])
            if done:
                merged = Batch([g for b in done for g in b.groups], self.bridge)
                uri = self.weights.latest or Path("")
                out, event = version_event(self.bridge.settings, self.version + syncs, uri,
                                           merged.step_id, {"samples": float(len(merged.samples))})
                merged.ack([out])
                self.bridge.current_version = self.version + syncs
                self.published.append(event)


def to_rollout_sample(cls: type, sample: Sample, group_id: int, version_offset: int = 0) -> Any:
    """TRL's RolloutSample of a trainable sample: arrays over the whole sequence, the completion
    mask on sampled tokens, old logprobs 0.0 elsewhere; its model version is the oldest policy
    version that sampled it plus `version_offset` (TRL's numbering)."""
    q = split(sample)
    mask = np.array([0] * len(q.prompt_ids) + q.response_mask, np.int64)
    old = np.array([0.0] * len(q.prompt_ids) + q.response_logprobs, np.float32)
    versions = [v for v in q.response_versions if v >= 0]
    task = sample.scored["trajectory"]["task"]
    return cls(prompt=[{"role": "user", "content": task["prompt"]}],
               completion=[{"role": "assistant", "content": ""}],
               input_ids=np.array(q.prompt_ids + q.response_ids, np.int64),
               completion_mask=mask, old_log_probs=old, advantage=float(sample.advantage or 0.0),
               model_version=min(versions) + version_offset, group_id=group_id,
               metrics={"reward": float(sample.reward or 0.0)}, enqueued_at=time.time())


def grpo_trainer(rollouts: BridgeRollouts, model_dir: Path, start: Path, prompts: list,
                 *, max_steps: int, groups_per_batch: int = 2, num_generations: int = 4,
                 learning_rate: float = 1e-3, **config: Any) -> Any:
    """TRL's GRPOTrainer of the model at `start` (tokenizer from `model_dir`) taking its rollouts
    from `rollouts`, one generation batch (`groups_per_batch` prompts of `num_generations`) per
    step, with the adapter's callback; `config` goes to GRPOConfig."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**{
        "output_dir": str(rollouts.checkpoint_dir / "trl"),
        "per_device_train_batch_size": groups_per_batch * num_generations,
        "num_generations": num_generations, "gradient_accumulation_steps": 1,
        "steps_per_generation": 1, "max_steps": max_steps, "learning_rate": learning_rate,
        "beta": 0.0, "use_vllm": False, "bf16": False, "report_to": [], "save_strategy": "no",
        "logging_steps": 1, "seed": rollouts.version, **config})
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(start),
                       processing_class=AutoTokenizer.from_pretrained(model_dir),
                       reward_funcs=rollstream_reward, args=args,
                       train_dataset=Dataset.from_dict({"prompt": prompts}),
                       rollout_func=rollouts, callbacks=[rollouts.callback()])


def train(settings: Settings, model_dir: Path, checkpoint_dir: Path, *, max_steps: int,
          groups_per_batch: int = 2, num_generations: int = 4, learning_rate: float = 1e-3,
          idle_timeout_s: float | None = 120.0, policy: GroupPolicy | None = None,
          **config: Any) -> BridgeRollouts:
    """TRL's GRPOTrainer on the CPU (or its accelerator) trained from the scored topic through
    `BridgeRollouts`, from the newest committed version's weights; returns the adapter (its
    `published` lists the versions this run committed). `policy` is the bridge's group policy;
    `config` goes to GRPOConfig."""
    start, version = start_from(settings, Path(model_dir))
    bridge = TrainerBridge(settings, groups_per_batch, policy)
    rollouts = BridgeRollouts(bridge, checkpoint_dir, version, idle_timeout_s)
    # The prompts are only a count here: the rollouts are the scored topic's, prompts included.
    trainer = grpo_trainer(rollouts, Path(model_dir), start,
                           ["rollstream"] * (max_steps * groups_per_batch), max_steps=max_steps,
                           groups_per_batch=groups_per_batch, num_generations=num_generations,
                           learning_rate=learning_rate, **config)
    try:
        trainer.train()
    finally:
        bridge.close()
    return rollouts
