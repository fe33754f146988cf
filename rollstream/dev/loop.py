"""The closed RL loop as real processes: policy server, controller, INIT, RUN, EVAL, trainer.

Used by `rollstream demo` and by the test that checks learning. The environment is
`copy_letter`; the base policy (version 0) is the seed model with its output restricted to the
task's alphabet: like an instruction-tuned model that answers in the right format but does not
yet know which answer is right, it scores about 1/8 before training.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.contracts.events import SCORED_TRAJECTORY
from rollstream.contracts.graph import BY_ATTR, STAGES, input_of, partition_count
from rollstream.dev.processes import ProcessGroup, free_port, wait_http
from rollstream.envs.copy_letter import LETTERS, demo_tasks
from rollstream.policy_versions import PolicyReader


def write_base_policy(path: Path, alphabet: str = LETTERS, seed: int = 0) -> None:
    """Version 0: seed weights whose output layer favours the alphabet and the end token."""
    import torch

    from rollstream.contracts.inference import END
    from rollstream.policy_server.model import build_model, save

    model = build_model(seed)
    with torch.no_grad():
        bias = model.head.bias
        bias.fill_(-8.0)
        for ch in alphabet:
            bias[ord(ch)] = 0.0
        bias[END] = -1.0
    save(model, path, version=0)


@dataclass
class LoopConfig:
    tasks: int = 450
    group_size: int = 8
    # One letter's prompts share most weights with the others': with 4 groups a step, a letter
    # absent from a few batches in a row lost ground to those present, fell below p = 0.05 on its
    # own prompt, and its groups then scored all 0 and were dropped (a collapsed letter in a
    # quarter of the runs, two in some, ending near 0.7). With 8 groups a step most letters are
    # in every batch: 2 collapses in 120 seeded runs of the same learner without Kafka. The loop
    # also ends in about half the time: 33-35 steps instead of 41-48, each a checkpoint to reload.
    groups_per_batch: int = 8
    # The window lets rollouts run three batches ahead, and servers load a version after the
    # trainer publishes it (a version or two later on a busy machine): with a bound of 2, a
    # quarter to a third of the samples were dropped as stale under load.
    max_staleness: int = 4
    admission_window: int = 24  # tasks (groups) in flight ahead of the trainer
    # Adam moves every weight by about lr per step: at 1e-2 a step's KL was 0.03-0.18, and early
    # noise drove a letter to p < 0.01 on its own prompt; its groups then scored all 0, were dropped
    # as zero-variance, and nothing brought it back (runs ended near 5/8 = 0.6). At 5e-3 the KL
    # is about 0.01 and such a collapse is rarer (and learning no slower).
    lr: float = 5e-3
    seed: int = 0
    # A Hugging Face model directory (rollstream.dev.tiny_model) served by vLLM's CPU build
    # instead of the embedded policy: RUN renders its chat template and the trainer trains it
    # (`--hf-model`). Its random weights score about 0 on copy_letter, so zero-variance groups
    # are trained too: the loop's versions are what it shows, not learning.
    hf_model: Path | None = None
    # False: no `rollstream train` process; another trainer (e.g. a TRL adapter) consumes the
    # scored topic and publishes the versions.
    trainer: bool = True


@dataclass
class Progress:
    """What the loop has produced so far, read from <p>.scored and <p>.policy."""

    scored: list[dict] = field(default_factory=list)
    versions: list[dict] = field(default_factory=list)
    scored_times: list[float] = field(default_factory=list)

    def reward_by_version(self) -> dict[int, tuple[float, int]]:
        """Mean reward (and count) of the samples each policy version produced."""
        by: dict[int, list[float]] = {}
        for s in self.scored:
            turns = s["trajectory"]["turns"]
            if s["reward"] is not None and turns:
                by.setdefault(turns[0]["policy_version"], []).append(s["reward"])
        return {v: (statistics.fmean(r), len(r)) for v, r in sorted(by.items())}


class ClosedLoop:
    def __init__(self, settings: Settings, workdir: Path, config: LoopConfig) -> None:
        self.settings = settings
        self.workdir = workdir
        self.config = config
        self.procs = ProcessGroup(workdir / "logs")
        self.checkpoints = workdir / "checkpoints"
        self.progress = Progress()
        self._consumers: list[Consumer] = []
        self._probes: dict[str, Consumer] = {}

    def start(self, policy_url: str | None = None) -> None:
        """Start the loop's processes; `policy_url`: a running server of `config.hf_model` to
        use instead of starting one."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        model = self.config.hf_model
        port = free_port()
        url = policy_url or f"http://127.0.0.1:{port}"
        common = self.settings.client_flags()
        if model is None:
            base = self.checkpoints / "policy-v0.safetensors"
            write_base_policy(base, seed=self.config.seed)
            server = self.procs.start("policy", "serve-policy", "--port", str(port),
                                      "--checkpoint", str(base), "--seed", str(self.config.seed))
            run_args, train_args = [], ["--init-checkpoint", str(base)]
        else:
            server = None if policy_url else self._start_vllm(model, port)
            run_args = ["--tokenizer-path", str(model)]
            train_args = ["--hf-model", str(model), "--keep-zero-variance"]
        self.procs.start("controller", "controller", *common, "--policy-url", url)
        self.procs.start("init", "stage", "init", *common,
                         "--admission-window", str(self.config.admission_window))
        self.procs.start("run", "stage", "run", *common, "--policy-url", url, *run_args)
        self.procs.start("eval", "stage", "eval", *common)
        if self.config.trainer:
            self.procs.start("train", "train", *common, "--checkpoint-dir",
                             str(self.checkpoints), *train_args,
                             "--groups-per-batch", str(self.config.groups_per_batch),
                             "--max-staleness", str(self.config.max_staleness),
                             "--lr", str(self.config.lr))
        if server is not None:  # vLLM's CPU build takes up to minutes on a busy machine
            wait_http(f"{url}/health", proc=server, timeout=120 if model is None else 600)
        if model is not None:
            self._serve_version_0(url, model)

    @staticmethod
    def _serve_version_0(url: str, model: Path) -> None:
        """The model the trainer starts from, labelled version 0 (a fresh vLLM's label is
        "default": its turns would record -1, unknown), through the controller's own path."""
        import asyncio

        from rollstream.controller.apply import apply_policy

        event = {"version": 0, "kind": "full", "uri": str(model), "step_id": "base",
                 "metrics": {}, "created_at_ms": 0}
        [applied] = asyncio.run(apply_policy(event, [url]))
        if not applied.ok:
            raise RuntimeError(f"could not serve the base model as version 0: {applied.detail}")

    def _start_vllm(self, model: Path, port: int) -> subprocess.Popen:
        from rollstream.broker.local import project_root
        from rollstream.dev import vllm_launch

        root = project_root()
        if not (vllm_launch.venv(root) / ".installed").is_file():
            raise RuntimeError("vLLM's CPU build is not installed: run `make vllm-deps`")
        argv, env = vllm_launch.serve_command(root, model, port)
        return self.procs.start_program("policy", argv, env)

    def tasks(self) -> list[dict]:
        from producers.publish import validate_task

        return [validate_task(t) for t in demo_tasks(self.config.tasks, self.config.group_size,
                                                     self.config.seed)]

    def follow(self, deadline: float) -> Iterator[Progress]:
        """Yield the progress every half second until the deadline (or the caller stops)."""
        scored = self._reader("scored")
        policy = PolicyReader(self.settings)
        try:
            while time.time() < deadline:
                self.procs.check_alive()
                for msg in scored.consume(1000, timeout=0.25):
                    if msg.error() is None:
                        self.progress.scored.append(
                            codec().decode_as(SCORED_TRAJECTORY, msg.value()))
                        self.progress.scored_times.append(time.time())
                self.progress.versions.extend(policy.poll(0.25))
                yield self.progress
        finally:
            policy.close()
        raise TimeoutError("the loop did not finish in time")

    def _reader(self, attr: str) -> Consumer:
        """A reader of every partition of the graph's topic `attr`, from the start."""
        topic = BY_ATTR[attr]
        name = topic.name(self.settings.topics)
        parts = range(partition_count(topic, self.settings.partitions))
        c = kafka.reader(self.settings, [TopicPartition(name, p, 0) for p in parts])
        self._consumers.append(c)
        return c

    def stage_lag(self) -> dict[str, int]:
        """Events waiting in each stage's input topic (end offset minus committed offset)."""
        if not self._probes:  # one per stage group, made once: the display asks every refresh
            for stage in STAGES:
                self._probes[stage] = Consumer({**self.settings.kafka(),
                                                "group.id": self.settings.topics.group(stage)})
            self._consumers.extend(self._probes.values())
        topics = self.settings.topics
        lag = {}
        for stage, probe in self._probes.items():
            source = input_of(stage)
            parts = [TopicPartition(source.name(topics), p)
                     for p in range(partition_count(source, self.settings.partitions))]
            committed = kafka.retrying(partial(probe.committed, parts, timeout=5))
            ends = [kafka.watermarks(probe, tp, timeout_s=5)[1] for tp in parts]
            # Transaction markers take offsets too: a small overcount while work flows.
            lag[stage] = sum(max(end - max(tp.offset, 0), 0)
                             for tp, end in zip(committed, ends, strict=True))
        return lag

    def stop(self) -> None:
        for consumer in self._consumers:
            consumer.close()
        self.procs.stop_all()
