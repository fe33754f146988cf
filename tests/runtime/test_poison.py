"""Poison events cannot stop a partition: an input whose output cannot be produced, or whose
dead letter would be too large, is dead-lettered (cut to fit, with its coordinates and reason)
and the good events behind it on the same partition are processed exactly once."""

from __future__ import annotations

import secrets
from collections import Counter

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from rollstream.cluster import kafka
from rollstream.cluster.topics import record_limits
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.contracts.graph import MIB
from rollstream.runtime import EventContext, Output, Stage, StageRuntime
from tests.helpers.runtime_helpers import policy_event, run_until


class Forward(Stage):
    """Reads <p>.trajectories (16 MiB records), writes <p>.episodes (4 MiB records)."""

    name = "forward"
    input_record = "PolicyVersion"

    def input_topic(self) -> str:
        return self.topics.trajectories

    def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        return [Output(self.topics.episodes, str(event["version"]), "PolicyVersion", event)]


class AsyncForward(Forward):
    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:  # type: ignore[override]
        return Forward.handle(self, event, ctx)


def big_event(version: int, size: int) -> bytes:
    return codec().encode("PolicyVersion", {"version": version, "uri": "u" * size,
                                            "created_at_ms": 0})


@pytest.mark.parametrize("stage", [Forward, AsyncForward])
def test_unproducible_outputs_and_oversized_dead_letters_do_not_stop_the_partition(
        settings: Settings, stage: type[Forward]) -> None:
    producer = kafka.producer(settings)
    topic = settings.topics.trajectories
    inputs = [
        (b"0", policy_event(0)),
        # Undecodable, with a 6 MiB key: its dead letter (key twice, then value) is ~21 MiB.
        (b"k" * (6 * MIB), b"\x00" * (9 * MIB)),
        (b"1", policy_event(1)),
        (b"2", big_event(2, 5 * MIB)),  # its output is over the episodes topic's 4 MiB
        (b"3", policy_event(3)),
    ]
    errors: list[str | None] = []
    for key, value in inputs:
        # One at a time: sent together on a busy machine, the first input was missing from the
        # log twice though its delivery was reported without error (and without an offset).
        kafka.produce(producer, topic, value, key, 0,
                      on_delivery=lambda err, _: errors.append(err and err.str()))
        assert producer.flush(60) == 0
    assert errors == [None] * len(inputs)
    # The offsets the dead letters are checked against, and no input lost on the way in: read
    # back, since a delivery report can lack its offset (a retry the broker had already written).
    written = kafka.read_partitions(settings, [TopicPartition(topic, 0, 0)])
    assert [(m.offset(), m.key()) for m in written] == [
        (offset, key) for offset, (key, _) in enumerate(inputs)]

    runtime = StageRuntime(stage(settings), settings)
    run_until(runtime, lambda: runtime.stats["processed"] >= len(inputs), timeout=60)

    out = kafka.read_partitions(settings, [TopicPartition(settings.topics.episodes, p, 0)
                                           for p in range(settings.partitions)])
    assert Counter(m.key() for m in out) == {b"0": 1, b"1": 1, b"3": 1}
    letter_msgs = kafka.read_partitions(settings, [TopicPartition(settings.topics.dlq, p, 0)
                                                   for p in range(settings.partitions)])
    letters = {dl["source_offset"]: dl for dl in
               (codec().decode_as("DeadLetter", m.value()) for m in letter_msgs)}
    assert sorted(letters) == [1, 3]

    undecodable = letters[1]
    assert undecodable["reason"].startswith("undecodable:")
    assert undecodable["truncated_from"] == 15 * MIB
    assert (undecodable["source_topic"], undecodable["source_partition"]) == (topic, 0)
    kept = len(undecodable["key"]) * 2 + len(undecodable["value"])
    assert 0 < kept <= record_limits(settings.topics)[settings.topics.dlq]
    assert undecodable["value"] == b"\x00" * len(undecodable["value"])  # the original's start

    too_big = letters[3]
    assert too_big["reason"].startswith("output cannot be produced:")
    assert settings.topics.episodes in too_big["reason"]
    assert too_big["truncated_from"] is None and too_big["value"] == inputs[3][1]
    assert runtime.stats["dead_lettered"] == 2


def test_an_output_the_broker_refuses_dead_letters_its_input_when_redone(
        settings: Settings) -> None:
    # The topic's actual limit is smaller than the declared one, so only the broker can tell:
    # the transaction fails, and the input whose output was refused is dead-lettered when redone.
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    resource = ConfigResource("topic", settings.topics.episodes, incremental_configs=[
        ConfigEntry("max.message.bytes", str(64 * 1024),
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    producer = kafka.producer(settings)
    # Random text: compression (the limit applies to compressed batches) leaves it over 64 KiB.
    noise = codec().encode("PolicyVersion", {"version": 1, "uri": secrets.token_hex(128 * 1024),
                                             "created_at_ms": 0})
    inputs = [(b"0", policy_event(0)), (b"1", noise), (b"2", policy_event(2))]
    for key, value in inputs:
        kafka.produce(producer, settings.topics.trajectories, value, key=key, partition=0)
    producer.flush(60)

    runtime = StageRuntime(Forward(settings), settings)
    run_until(runtime, lambda: runtime.stats["dead_lettered"] >= 1, timeout=90)

    out = kafka.read_partitions(settings, [TopicPartition(settings.topics.episodes, p, 0)
                                           for p in range(settings.partitions)])
    assert Counter(m.key() for m in out) == {b"0": 1, b"2": 1}
    letters = [codec().decode_as("DeadLetter", m.value()) for m in kafka.read_partitions(
        settings, [TopicPartition(settings.topics.dlq, p, 0) for p in range(settings.partitions)])]
    assert [(dl["source_offset"], dl["value"]) for dl in letters] == [(1, inputs[1][1])]
    assert letters[0]["reason"].startswith("output cannot be produced:")
    assert runtime.stats["rewinds"] >= 1
