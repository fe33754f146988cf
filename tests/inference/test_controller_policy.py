"""A PolicyVersion published mid-run: the controller service loads it into every embedded
server, and every turn sampled after that carries the new version (none a version it was not
sampled with)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.controller.apply import Controller
from rollstream.dev.background import BackgroundServer
from rollstream.policy_server.model import build_model, save
from rollstream.runtime import StageRuntime
from stages.run import RunStage
from tests.helpers.pipeline_helpers import served_version, wait
from tests.helpers.run_helpers import guess_episodes


def publish_episodes(settings: Settings, episodes: list[dict]) -> None:
    producer = kafka.producer(settings)
    for episode in episodes:
        kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", episode),
                      key=episode["episode_id"])
    producer.flush()


def trajectories(settings: Settings) -> list[dict]:
    msgs = kafka.read_partitions(settings, [TopicPartition(settings.topics.trajectories, p, 0)
                                            for p in range(4)])
    return [codec().decode_as("Trajectory", m.value()) for m in msgs]


@pytest.mark.slow
def test_policy_published_mid_run_reaches_every_server_and_stamps_later_turns(
        settings: Settings, tmp_path: Path) -> None:
    checkpoint = tmp_path / "step-1.safetensors"
    save(build_model(seed=1), checkpoint, version=1)
    with BackgroundServer() as a, BackgroundServer() as b:
        settings = settings.override(policy_url=f"{a},{b}", health_interval_s=0.5)
        runtime = StageRuntime(RunStage(settings), settings)
        controller = Controller(settings)
        threads = [threading.Thread(target=lambda: asyncio.run(runtime.serve())),
                   threading.Thread(target=lambda: asyncio.run(controller.serve()))]
        for thread in threads:
            thread.start()
        try:
            episodes = guess_episodes(80, max_turns=3)
            for e in episodes:
                e["episode_id"] = e["episode_id"].replace("#", "-v#")
            publish_episodes(settings, episodes[:40])
            wait(lambda: len(trajectories(settings)) >= 10, 120, "the first trajectories")
            producer = kafka.producer(settings)
            kafka.produce(producer, settings.topics.policy, codec().encode("PolicyVersion", {
                "version": 1, "kind": "full", "uri": str(checkpoint), "step_id": "step-1",
                "metrics": {}, "created_at_ms": int(time.time() * 1000)}), key="policy",
                partition=0)
            producer.flush()
            wait(lambda: served_version(a) == served_version(b) == 1, 60, "the new version")
            applied_ms = int(time.time() * 1000)
            publish_episodes(settings, episodes[40:])
            wait(lambda: len(trajectories(settings)) >= 80, 180, "every trajectory")
        finally:
            runtime.stop()
            controller.stop()
            for thread in threads:
                thread.join(60)
    turns = [t for trajectory in trajectories(settings) for t in trajectory["turns"]]
    assert {t["policy_version"] for t in turns} == {0, 1}
    later = [t for t in turns if t["started_at_ms"] > applied_ms]
    assert later and all(t["policy_version"] == 1 for t in later)
    assert {t["server"] for t in later} == {a, b}
