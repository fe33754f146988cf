"""Trainer bridge on the real broker: complete groups only, offsets committed after the ack."""

from __future__ import annotations

import logging
import re

from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from tests.helpers.bridge_helpers import publish_groups, scored
from trainer_bridge import bridge as bridge_module
from trainer_bridge.bridge import TrainerBridge


def task_ids(batches) -> list[str]:
    return sorted(g.task_id for b in batches for g in b.groups)


def test_batches_hold_complete_groups_and_unacked_batches_come_back(settings: Settings) -> None:
    publish_groups(settings, tasks=6, group_size=3)
    with TrainerBridge(settings, groups_per_batch=2) as bridge:
        first = list(bridge.batches(max_batches=3, idle_timeout_s=10))
        assert task_ids(first) == [f"task{t}" for t in range(6)]
        for batch in first:
            assert all(len(g.samples) == 3 for g in batch.groups)
            assert all(sorted(g.rewards) == [0.0, 1.0, 2.0] for g in batch.groups)
        first[0].ack()  # the trainer took only the first batch
        acked = task_ids(first[:1])

    # A new bridge process in the same group: the acked batch is not handed out again,
    # the two unacknowledged ones are.
    with TrainerBridge(settings, groups_per_batch=2) as bridge:
        again = list(bridge.batches(max_batches=2, idle_timeout_s=10))
        assert task_ids(again) == sorted(set(task_ids(first)) - set(acked))
        for batch in again:
            batch.ack()
    with TrainerBridge(settings, groups_per_batch=2) as bridge:
        assert list(bridge.batches(idle_timeout_s=3)) == []


def test_bridge_dead_letters_undecodable_events(settings: Settings) -> None:
    publish_groups(settings, tasks=2, group_size=2)
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.scored, b"junk", key="x")
    producer.flush()
    with TrainerBridge(settings, groups_per_batch=2) as bridge:
        [batch] = list(bridge.batches(max_batches=1, idle_timeout_s=10))
        batch.ack()
        # The junk is on a partition of its own: the batch may be complete before it is read.
        assert list(bridge.batches(idle_timeout_s=3)) == []
        assert bridge.dead_lettered == 1
    letters = list(kafka.read_partitions(
        settings, [TopicPartition(settings.topics.dlq, p, 0) for p in range(4)]))
    [letter] = [codec().decode_as("DeadLetter", m.value()) for m in letters]
    assert letter["stage"] == "bridge" and letter["value"] == b"junk"
    assert letter["reason"].startswith("undecodable:")


def test_dropped_groups_are_committed_and_not_seen_again(settings: Settings) -> None:
    producer = kafka.producer(settings)
    for i in range(2):  # task "flat": every sample scores 1.0, no signal: dropped
        kafka.produce(producer, settings.topics.scored, scored("flat", i, 2, 1.0),
                      key=f"flat#{i}")
    for i in range(2):
        kafka.produce(producer, settings.topics.scored, scored("mixed", i, 2, float(i)),
                      key=f"mixed#{i}")
    producer.flush()
    with TrainerBridge(settings, groups_per_batch=1) as bridge:
        seen = []
        for batch in bridge.batches(idle_timeout_s=3):
            seen += [g.task_id for g in batch.groups]
            batch.ack()
        assert seen == ["mixed"]
        assert bridge.stats["groups_dropped_zero_variance"] == 1
    with TrainerBridge(settings, groups_per_batch=1) as bridge:
        assert list(bridge.batches(idle_timeout_s=3)) == []
        assert bridge.stats.get("groups_dropped_zero_variance", 0) == 0  # not redelivered


def test_an_idle_bridge_names_the_groups_it_waits_on(
        settings: Settings, monkeypatch, caplog) -> None:
    """A group missing a sample holds its batch until the group's timeout: the bridge says which
    group waits, for how many samples, and where those that came are."""
    monkeypatch.setattr(bridge_module, "WAITING_REPORT_S", 0.5)
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.scored, scored("short", 0, 3, 1.0), key="short#0")
    for i in range(2):
        kafka.produce(producer, settings.topics.scored, scored("whole", i, 2, float(i)),
                      key=f"whole#{i}")
    producer.flush()
    with caplog.at_level(logging.INFO, "rollstream.bridge"), \
            TrainerBridge(settings, groups_per_batch=2) as bridge:
        assert list(bridge.batches(idle_timeout_s=5)) == []
    reports = [r.getMessage() for r in caplog.records if r.name == "rollstream.bridge"]
    assert reports, "an idle bridge with an incomplete group said nothing"
    assert re.search(r"1 complete groups wait for a batch of 2; 1 groups wait for samples "
                     r"\(short 1/3 at \[\(\d, 0\)\]\)", reports[-1]), reports[-1]
    assert reports[-1].endswith("partitions paused: none"), reports[-1]
