"""Infra retries on the real broker: RUN and EVAL as stage runtimes, two stand-in inference
servers (one killed mid-run), an environment whose real bubblewrap sandboxes die, and trainer
bridges with either group policy reading what EVAL scored."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest
from confluent_kafka import TopicPartition

from producers.publish import validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.contracts.events import FailureClass
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.envs import registry
from rollstream.envs.base import Environment, Score, StepResult
from rollstream.runtime import StageRuntime
from rollstream.sandbox import Limits, Sandbox, SandboxSpec
from rollstream.sandbox.bwrap import BwrapBackend, BwrapSandbox, delete_tree
from rollstream.telemetry import metrics
from stages.eval import EvalStage
from stages.run import RunStage
from tests.helpers.pipeline_helpers import wait
from tests.helpers.sandbox_helpers import needs_bwrap, sandbox_root
from trainer_bridge.bridge import TrainerBridge
from trainer_bridge.groups import GroupPolicy

__all__ = ["sandbox_root"]  # the fixture, imported for pytest

pytestmark = needs_bwrap

GROUP = 3
TURNS = 3


class FlakySandboxes(Environment):
    """Each episode opens a real bubblewrap sandbox at reset, numbered per task in order, and
    runs a command in it at every turn. The task's `dies` says which fail: "first", the task's
    sandbox 0 at its first use (its directory deleted under it, as a disk clean-up would: the
    backend's own SandboxError); "dead", also every sandbox opened after the group's first
    three (the retries of sandbox 0's episode), recorded in the state as SWE records it; "env",
    sandbox 1 finds its task broken (an environment error, recorded). The rest play TURNS
    turns."""

    name = "flaky_sandboxes"
    description = "sandboxes that die (tests)"
    opened: ClassVar[Counter[str]] = Counter()
    live: ClassVar[dict[str, Sandbox]] = {}
    root: ClassVar[Path]

    async def reset(self, task: dict) -> dict:
        number = self.opened[task["task_id"]]
        self.opened[task["task_id"]] += 1
        self.live[f"{task['task_id']}/{number}"] = await BwrapBackend(self.root).create(
            SandboxSpec(limits=Limits(memory_mb=256, max_processes=16, timeout_s=10)))
        return {"sandbox": number, "turns": 0, "failure": None}

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        dies, number = json.loads(task["data"])["dies"], state["sandbox"]
        sandbox = self.live[f"{task['task_id']}/{number}"]
        if dies in ("first", "dead") and number == 0:
            assert isinstance(sandbox, BwrapSandbox)
            delete_tree(sandbox.directory)
        await sandbox.exec("true")  # the dead one raises here
        failure = None
        if dies == "dead" and number >= GROUP:
            failure = {"class": "infra", "detail": f"sandbox {number} died"}
        elif dies == "env" and number == 1:
            failure = {"class": "env", "detail": "the task's repository does not build"}
        state = {**state, "turns": state["turns"] + 1, "failure": failure}
        done = failure is not None or state["turns"] == TURNS
        return StepResult(None if done else "again", done, None, state)

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        state = json.loads(trajectory["env_state"])
        if state["failure"] is not None:
            return Score(None, state["failure"]["class"], state["failure"])
        return Score(float(state["sandbox"] % 2), "ok", {})

    def failure(self, state: dict) -> tuple[FailureClass, str] | None:
        found = state.get("failure")
        return None if found is None else (found["class"], found["detail"])

    def validate_task(self, task: dict) -> None:
        pass


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch, sandbox_root: Path) -> Iterator[None]:
    # As an entry-point plug-in would be found, without installing a distribution.
    monkeypatch.setattr(registry, "_environments",
                        lambda: {**registry.BUILTINS, FlakySandboxes.name: FlakySandboxes})
    FlakySandboxes.opened.clear()
    FlakySandboxes.root = sandbox_root
    yield
    # Episodes leave their sandboxes to the environment; sandbox_root checks none is left.
    async def destroy() -> None:
        for sandbox in FlakySandboxes.live.values():
            await sandbox.destroy()
    asyncio.run(destroy())
    FlakySandboxes.live.clear()


TASKS = {"first-a": "first", "first-b": "first", "dead": "dead", "env": "env"}


def publish(settings: Settings) -> None:
    producer = kafka.producer(settings)
    for task_id, dies in TASKS.items():
        task = validate_task({
            "task_id": task_id, "env": FlakySandboxes.name, "prompt": "Guess 0-9.",
            "data": {"dies": dies}, "max_turns": TURNS + 1, "group_size": GROUP,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4,
                         "seed": 1}})
        for i in range(GROUP):
            episode_id = f"{task_id}#{i}"
            kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", {
                "episode_id": episode_id, "task": task, "sample_index": i, "created_at_ms": 1,
            }), key=episode_id)
    producer.flush(30)


def read(settings: Settings, topic: str, record: str) -> list[dict]:
    parts = [TopicPartition(topic, p, 0) for p in range(settings.partitions)]
    return [codec().decode(m.value())[1] for m in kafka.read_partitions(settings, parts)]


def serve(runtimes: list[StageRuntime]) -> list[threading.Thread]:
    threads = [threading.Thread(target=lambda r=r: asyncio.run(r.serve())) for r in runtimes]
    for thread in threads:
        thread.start()
    return threads


def train(settings: Settings, policy: str) -> tuple[dict[str, list], Counter[str]]:
    """Every group a bridge with this group policy hands out (its samples' failure classes)
    and its counts."""
    groups: dict[str, list] = {}
    with TrainerBridge(settings, groups_per_batch=1, group=f"{settings.prefix}.train-{policy}",
                       policy=GroupPolicy(drop_zero_variance=False, incomplete=policy)) as bridge:
        for batch in bridge.batches(idle_timeout_s=3):
            [group] = batch.groups
            groups[group.task_id] = sorted(
                (s.scored["failure_class"], s.attempt, s.advantage is not None)
                for s in group.samples)
            batch.ack()
        return groups, Counter(bridge.stats)


def later_turn(server: SimulatedServer) -> bool:
    lengths = [len(body["prompt"]) for body in server.received]
    return bool(lengths) and max(lengths) > min(lengths)


def test_infra_failures_are_retried_numbered_bounded_and_groups_never_shrink_silently(
        settings: Settings, flaky: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.1, 0.2, 0.4))
    before = replace(metrics._jobs[""])
    publish(settings)
    # Turns take a while (0.2 s), so episodes are mid-way on both servers when one is killed.
    with Fleet([SimulatedServer(step_s=lambda running: 0.1) for _ in range(2)]) as fleet:
        run_settings = settings.override(policy_url=",".join(fleet.urls), health_interval_s=0.2,
                                         request_timeout_s=2.0)
        runtimes = [StageRuntime(RunStage(run_settings), run_settings),
                    StageRuntime(EvalStage(settings), settings)]
        threads = serve(runtimes)
        try:
            # Server 0 dies once it has answered an episode's second turn (a longer prompt
            # than the first's): that episode passed its first step, so its third turn goes on
            # on the other server.
            deadline = time.monotonic() + 30
            while not later_turn(fleet.servers[0]):
                assert time.monotonic() < deadline, "server 0 answered no second turn"
                time.sleep(0.01)
            fleet.kill(0)
            wait(lambda: len(read(settings, settings.topics.scored, "ScoredTrajectory"))
                 >= len(TASKS) * GROUP, 60, "every episode scored")
        finally:
            for runtime in runtimes:
                runtime.stop()
            for thread in threads:
                thread.join(60)

    # Attempts are numbered from 0 on, each written once, none past the limit (2).
    attempts: defaultdict[str, list[int]] = defaultdict(list)
    for episode in read(settings, settings.topics.episodes, "Episode"):
        attempts[episode["episode_id"]].append(episode["attempt"])
    assert all(sorted(a) == list(range(len(a))) for a in attempts.values()), attempts
    # One retry for each "first" group's sandbox 0, two (the limit) for the dead group's.
    assert Counter(len(a) for a in attempts.values()) == Counter({1: 9, 2: 2, 3: 1})

    # Each episode scored once, as its newest attempt; only the dead group's retries ran out.
    scored = read(settings, settings.topics.scored, "ScoredTrajectory")
    assert len(scored) == len({s["trajectory"]["episode_id"] for s in scored}) == 12
    for s in scored:
        episode_id, attempt = s["trajectory"]["episode_id"], s["trajectory"]["attempt"]
        assert attempt == max(attempts[episode_id]), episode_id
    by_task: defaultdict[str, list] = defaultdict(list)
    for s in scored:
        by_task[s["trajectory"]["task"]["task_id"]].append(
            (s["failure_class"], s["trajectory"]["attempt"]))
    assert sorted(by_task["first-a"]) == sorted(by_task["first-b"]) == [
        ("ok", 0), ("ok", 0), ("ok", 1)]
    assert sorted(by_task["dead"]) == [("infra", 2), ("ok", 0), ("ok", 0)]
    assert sorted(by_task["env"]) == [("env", 0), ("ok", 0), ("ok", 0)]  # never retried
    # The killed server's episodes went on on the other one: none of them failed for it.
    assert any(len({t["server"] for t in s["trajectory"]["turns"]}) == 2 for s in scored)

    after = metrics._jobs[""]
    assert (after.retries - before.retries, after.retries_spent - before.retries_spent) == (4, 1)

    # drop (the default): the group whose retries ran out is dropped whole; the others train
    # complete (the env failure counted and left out of the statistics).
    groups, stats = train(settings, "drop")
    assert sorted(groups) == ["env", "first-a", "first-b"]
    assert all(len(samples) == GROUP for samples in groups.values())
    assert groups["env"] == [("env", 0, False), ("ok", 0, True), ("ok", 0, True)]
    assert (stats["groups_dropped_infra"], stats["env_excluded"]) == (1, 1)
    # partial: the dead group trains on the rest, its infra sample counted and left out.
    groups, stats = train(settings, "partial")
    assert sorted(groups) == ["dead", "env", "first-a", "first-b"]
    assert groups["dead"] == [("infra", 2, False), ("ok", 0, True), ("ok", 0, True)]
    assert (stats["groups_dropped_infra"], stats["infra_excluded"]) == (0, 1)
