"""mini-swe-agent, installed from its package index and unmodified, plays the shipped SWE tasks
through RUN's gateway, end to end on the real broker (INIT, RUN, EVAL and the policy server as
separate processes). The policy is the scripted one answering in mini-swe-agent's format with
each task's gold patch, so every task must be resolved; every LLM call the harness makes is a
Turn; the scored trajectories train in the trainer like any others; and a RUN process killed
mid-episode neither loses nor duplicates the episode: the episode restarts cleanly in the RUN
that takes over and is scored once.

ROLLSTREAM_MINI_SWE_TASKS sets how many shipped tasks run (default 1, with two episodes to train
on; 26 is the whole set). One pipeline run covers all of it: every mini-swe-agent start imports
litellm (seconds of CPU), which makes a pipeline run long on a small machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import load_tasks, publish, validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup, free_port, wait_http
from rollstream.envs import mini_swe_agent
from tests.helpers.sandbox_helpers import needs_bwrap, sandbox_root
from tests.helpers.swe_helpers import HARNESS_BIN, SHIPPED, needs_mini, scored
from trainer_bridge.groups import GroupPolicy
from trainer_bridge.train_loop import train

__all__ = ["sandbox_root"]

COUNT = int(os.environ.get("ROLLSTREAM_MINI_SWE_TASKS", "1"))
pytestmark = [needs_bwrap, needs_mini, pytest.mark.slow,
              pytest.mark.timeout(600 + 120 * COUNT)]


def harness_tasks(count: int) -> list[dict]:
    """The first `count` shipped tasks; the first one with two episodes (a group to train)."""
    tasks = []
    for i, task in enumerate(load_tasks(SHIPPED, "swe-bench")[:count]):
        task = mini_swe_agent.harness_task(task, mini_swe_agent.harness(wall_clock_s=900))
        tasks.append(validate_task({**task, "group_size": 2 if i == 0 else 1, "max_turns": 6,
                                    "sampling": {
            **task["sampling"], "max_tokens": 4096, "seed": i}}))
    return tasks


class Pipeline:
    """The policy server and one process per stage, RUN with mini-swe-agent on its PATH."""

    def __init__(self, settings: Settings, tmp: Path, tasks: list[dict]) -> None:
        self.settings, self.tasks = settings, tasks
        self.episodes = sum(t["group_size"] for t in tasks)
        self.procs = ProcessGroup(tmp / "logs")
        scripts = tmp / "scripts.jsonl"
        scripts.write_text("".join(json.dumps(s) + "\n"
                                   for s in mini_swe_agent.gold_scripts(tasks)))
        port = free_port()
        self.common = ["--bootstrap-servers", settings.bootstrap_servers,
                       "--prefix", settings.prefix, "--commit-interval-ms", "100"]
        self.policy = ["--policy-url", f"http://127.0.0.1:{port}"]
        self.run_env = {"PATH": f"{HARNESS_BIN}:{os.environ['PATH']}"}
        server = self.procs.start("policy", "serve-scripted", "--script", str(scripts),
                                  "--port", str(port))
        self.procs.start("init", "stage", "init", *self.common)
        self.start_run("run")
        self.procs.start("eval", "stage", "eval", *self.common)
        wait_http(f"http://127.0.0.1:{port}/health", proc=server, timeout=120)
        publish(settings, tasks)

    def start_run(self, name: str) -> None:
        # A few harnesses at a time: each mini-swe-agent start costs seconds of CPU.
        self.procs.start(name, "stage", "run", *self.common, *self.policy, "--max-in-flight", "4",
                         env=self.run_env)

    def wait_scored(self) -> list[dict]:
        deadline = time.monotonic() + 300 + 60 * self.episodes
        events = scored(self.settings)
        while len(events) < self.episodes:
            assert time.monotonic() < deadline, f"{len(events)}/{self.episodes} scored in time"
            self.procs.check_alive()
            time.sleep(1.0)
            events = scored(self.settings)
        time.sleep(2.0)  # nothing more may come: a duplicate would show now
        return scored(self.settings)


def checkpoints(settings: Settings) -> list[dict]:
    tps = [TopicPartition(settings.topics.episode_state, p, 0)
           for p in range(settings.partitions)]
    return [codec().decode_as("TurnCheckpoint", m.value())
            for m in kafka.read_partitions(settings, tps) if m.value() is not None]


def assert_resolved_through_the_harness(events: list[dict], tasks: list[dict]) -> None:
    assert sorted(e["trajectory"]["episode_id"] for e in events) == sorted(
        f"{t['task_id']}#{i}" for t in tasks for i in range(t["group_size"]))  # each once
    for event in events:
        trajectory = event["trajectory"]
        assert (event["reward"], event["failure_class"]) == (1.0, "ok"), event["verifier"]
        state = json.loads(trajectory["env_state"])
        assert state["harness"]["returncode"] == 0, state["harness"]["output_tail"]
        # Every call mini-swe-agent made is a turn: look, apply the patch, submit.
        turns = trajectory["turns"]
        assert [json.loads(t["tool_call"])[0]["name"] for t in turns] == ["bash"] * 3
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in turns[-1]["tool_call"]
        assert not any(t["new_sample"] for t in turns)  # one token-exact sample
        assert all(t["policy_version"] == 0 for t in turns)
        assert "<returncode>0</returncode>" in turns[1]["observation"]  # the patch applied


def test_mini_swe_agent_resolves_tasks_survives_a_killed_run_and_trains(
        settings: Settings, tmp_path: Path, sandbox_root: Path) -> None:
    tasks = harness_tasks(COUNT)
    pipeline = Pipeline(settings, tmp_path, tasks)
    try:
        deadline = time.monotonic() + 240
        while not (seen := checkpoints(settings)):  # a call recorded, the episode unfinished
            assert time.monotonic() < deadline, "no checkpoint in time"
            pipeline.procs.check_alive()
            time.sleep(0.2)
        pipeline.procs.kill("run")
        pipeline.start_run("run2")
        events = pipeline.wait_scored()
    finally:
        pipeline.procs.stop_all()
    assert_resolved_through_the_harness(events, tasks)  # none lost, none twice
    restarts = {e["trajectory"]["episode_id"]: json.loads(e["trajectory"]["env_state"])[
        "restarts"] for e in events}
    killed = {c["episode_id"] for c in seen}
    for episode_id, count in restarts.items():
        # Calls recorded before the kill are dropped and the episode played again, once (one
        # checkpointed just after the look is restarted too).
        assert count in ((1,) if episode_id in killed else (0, 1)), (episode_id, count)
    # The reference trainer takes them like any scored trajectories: one step, one version.
    steps = train(settings, tmp_path / "ckpt", groups_per_batch=1,  # the 2-episode group
                  group_policy=GroupPolicy(drop_zero_variance=False), max_steps=1,
                  idle_timeout_s=60)
    assert steps == 1
    versions = [codec().decode_as("PolicyVersion", m.value()) for m in kafka.read_partitions(
        settings, [TopicPartition(settings.topics.policy, 0, 0)])]  # one partition: in order
    assert [v["version"] for v in versions] == [1]
    assert versions[0]["metrics"]["mean_reward"] == 1.0
