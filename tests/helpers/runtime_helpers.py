"""Shared by the stage runtime's tests: a stage that echoes policy versions (one hangs), running
a runtime until a condition holds, and reading a topic back from the broker."""

from __future__ import annotations

import asyncio
import threading
import time

from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.runtime import EventContext, InvalidEvent, Output, Stage, StageRuntime


def policy_event(version: int) -> bytes:
    return codec().encode("PolicyVersion", {"version": version, "uri": f"v{version}",
                                            "created_at_ms": 0})


class SlowEcho(Stage):
    """Copies PolicyVersion events from <p>.policy to <p>.scored-like output; version 0 hangs."""

    name = "echo"
    input_record = "PolicyVersion"

    def input_topic(self) -> str:
        return self.topics.policy

    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        if event["version"] < 0:
            raise InvalidEvent("negative version")
        await asyncio.sleep(60 if event["version"] == 0 else 0.001 * (event["version"] % 7))
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


def send_versions(settings: Settings, versions: range) -> None:
    """Policy-version events `versions` on <p>.policy, each keyed by its version."""
    producer = kafka.producer(settings)
    for v in versions:
        kafka.produce(producer, settings.topics.policy, policy_event(v), key=str(v))
    producer.flush()


def run_until(runtime: StageRuntime, done, timeout: float = 30.0) -> None:
    thread = threading.Thread(target=lambda: asyncio.run(runtime.serve()))
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not done() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        runtime.stop()
        thread.join(60)
    assert done(), f"condition not reached: {runtime.stats}"


def read_all(settings: Settings, topic: str, partitions: int = 1) -> list:
    return list(kafka.read_partitions(
        settings, [TopicPartition(topic, p, 0) for p in range(partitions)]))


def publish_version(settings: Settings, version: int, consumed: int) -> None:
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.policy, codec().encode("PolicyVersion", {
        "version": version, "uri": "x", "metrics": {"groups_consumed": float(consumed)},
        "created_at_ms": 0}), key="policy")
    producer.flush()
