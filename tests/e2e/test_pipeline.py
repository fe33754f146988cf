"""The whole pipeline as separate processes on the real broker: INIT → RUN ×2 → EVAL → bridge.

The chaos case: one of two RUN processes is killed with SIGKILL mid-run and started again; every
episode must still be scored exactly once (read_committed), and the replayed log must match.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish
from producers.replay import replay
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup
from rollstream.envs.registry import get_env
from tests.helpers.pipeline_helpers import GROUP, make_tasks
from trainer_bridge.bridge import TrainerBridge
from trainer_bridge.groups import GroupPolicy

TASKS = 200


def read_topic(settings: Settings, topic: str) -> list:
    return list(kafka.read_partitions(
        settings, [TopicPartition(topic, p, 0) for p in range(settings.partitions)]))


def scored_ids(settings: Settings) -> list[str]:
    return [m.key().decode() for m in read_topic(settings, settings.topics.scored)]


@pytest.fixture
def pipeline(settings: Settings, tmp_path: Path):
    procs = ProcessGroup(tmp_path / "logs")
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix,
              "--commit-interval-ms", "100"]
    policy = procs.start_policy()
    run = [*common, "--policy-url", policy.url]
    procs.start("init", "stage", "init", *common)
    procs.start("eval", "stage", "eval", *common)
    procs.start("run-a", "stage", "run", *run)
    procs.start("run-b", "stage", "run", *run)
    policy.ready()
    yield procs, run
    procs.stop_all()


def wait_for(predicate, timeout: float, procs: ProcessGroup, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive()
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_sigkill_of_a_run_process_neither_loses_nor_duplicates(settings: Settings,
                                                                 pipeline) -> None:
    procs, common = pipeline
    tasks = make_tasks(TASKS)
    producer = kafka.producer(settings)
    # A malformed event in each stage's input topic, ahead of the real work.
    for topic in (settings.topics.tasks, settings.topics.episodes, settings.topics.trajectories):
        kafka.produce(producer, topic, b"\x00garbage", key="bad")
    producer.flush()
    assert publish(settings, tasks) == TASKS

    wait_for(lambda: len(scored_ids(settings)) >= TASKS * GROUP // 4, 300, procs,
             "a quarter of the episodes")
    procs.kill("run-a")  # mid-run: its open transaction and in-flight episodes are cut off
    procs.start("run-a2", "stage", "run", *common)

    expected = {f"{t['task_id']}#{i}" for t in tasks for i in range(GROUP)}
    wait_for(lambda: len(scored_ids(settings)) >= len(expected), 400, procs, "every episode")
    time.sleep(2)  # anything extra (a duplicate) would be committed by now
    ids = scored_ids(settings)
    assert len(ids) == len(expected) == TASKS * GROUP
    assert set(ids) == expected

    events = [codec().decode_as("ScoredTrajectory", m.value())
              for m in read_topic(settings, settings.topics.scored)]
    for event in events:
        turns = event["trajectory"]["turns"]
        assert event["failure_class"] in ("ok", "agent", "truncated")
        assert [t["index"] for t in turns] == list(range(len(turns)))

    letters = [codec().decode_as("DeadLetter", m.value())
               for m in read_topic(settings, settings.topics.dlq)]
    assert sorted(dl["stage"] for dl in letters) == ["eval", "init", "run"]
    assert all(dl["reason"].startswith("undecodable:") for dl in letters)

    # Replay: the scored log re-published elsewhere holds the same episodes.
    target = f"{settings.prefix}.scored-replay"
    assert replay(settings, settings.topics.scored, to_topic=target) == len(expected)
    replayed = {m.key().decode() for m in read_topic(settings, target)}
    assert replayed == expected

    # The bridge hands out every group once, complete.
    # Every group, whatever its rewards (the untrained model often scores a whole group 0).
    with TrainerBridge(settings, groups_per_batch=25,
                       policy=GroupPolicy(drop_zero_variance=False)) as bridge:
        groups = [g for batch in bridge.batches(max_batches=TASKS // 25, idle_timeout_s=30)
                  for g in (batch.ack() or batch.groups)]
    assert len(groups) == TASKS
    assert all(len({s.episode_id for s in g.samples}) == GROUP for g in groups)
    # EVAL's verdicts are the environments' own: re-scoring the trajectories gives the same.
    for event in events[::50]:
        trajectory = event["trajectory"]
        score = asyncio.run(get_env(trajectory["task"]["env"]).evaluate(trajectory["task"],
                                                                         trajectory))
        assert (score.reward, score.failure_class) == (event["reward"], event["failure_class"])
        assert json.loads(event["verifier"]) == score.verifier
