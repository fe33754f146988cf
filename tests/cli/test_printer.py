"""The JSON printer (`rollstream bridge`) reads in its own consumer group: it never takes
scored events away from the trainer's group."""

from __future__ import annotations

import json
import subprocess
import sys

from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from tests.helpers.scored_factory import scored


def test_printer_commits_in_its_own_group_not_the_trainers(settings: Settings) -> None:
    producer = kafka.producer(settings)
    for i in range(4):
        event = scored("t0", i, float(i % 2))
        producer.produce(settings.topics.scored, codec().encode("ScoredTrajectory", event),
                         event["trajectory"]["episode_id"])
    producer.flush(10)
    out = subprocess.run(
        [sys.executable, "-m", "rollstream.cli", "bridge", "--groups-per-batch", "1",
         "--max-batches", "1", "--bootstrap-servers", settings.bootstrap_servers,
         "--prefix", settings.prefix], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout)["tasks"] == ["t0"]

    parts = [TopicPartition(settings.topics.scored, p) for p in range(4)]

    def committed(group: str) -> int:
        consumer = kafka.consumer(settings, group)
        try:
            return sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=10))
        finally:
            consumer.close()

    assert committed(f"{settings.prefix}.batch-printer") == 4
    assert committed(f"{settings.prefix}.bridge") == 0  # the trainer's group: untouched


def test_printer_hands_out_equal_reward_groups_when_asked(settings: Settings) -> None:
    """A group whose rewards are all equal carries no signal for a trainer and is dropped; the
    printer hands it out with --keep-zero-variance (a gold-patch policy's groups all score 1)."""
    producer = kafka.producer(settings)
    for task, reward in (("same", 1.0), ("mixed", None)):
        for i in range(4):
            event = scored(task, i, reward if reward is not None else float(i % 2))
            producer.produce(settings.topics.scored, codec().encode("ScoredTrajectory", event),
                             event["trajectory"]["episode_id"])
    producer.flush(10)
    base = [sys.executable, "-m", "rollstream.cli", "bridge", "--groups-per-batch", "2",
            "--max-batches", "1", "--idle-timeout", "10", "--bootstrap-servers",
            settings.bootstrap_servers, "--prefix", settings.prefix]
    dropped = subprocess.run([*base, "--group", f"{settings.prefix}.p1"], capture_output=True,
                             text=True, timeout=180, check=True)
    assert dropped.stdout == ""  # one group with signal only: no batch of two
    kept = subprocess.run([*base, "--group", f"{settings.prefix}.p2", "--keep-zero-variance"],
                          capture_output=True, text=True, timeout=180, check=True)
    assert sorted(json.loads(kept.stdout)["tasks"]) == ["mixed", "same"]
