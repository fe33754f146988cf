"""`rollstream dlq`: dead letters listed, decoded, and redriven to their source exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from producers.publish import validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup
from rollstream.ops import dlq


def tasks_on(settings: Settings, partition: int) -> list[bytes]:
    part = [TopicPartition(settings.topics.tasks, partition, 0)]
    return [m.value() for m in kafka.read_partitions(settings, part)]


def test_redrive_sends_a_dead_letter_back_exactly_once(settings: Settings,
                                                        tmp_path: Path) -> None:
    bad = validate_task({"task_id": "needs-fix", "env": "arithmetic", "prompt": "1+1=",
                         "data": {"answer": "2"}})
    bad["group_size"] = 0  # INIT rejects it as invalid
    raw = codec().encode("Task", {**bad, "created_at_ms": 1})
    producer = kafka.producer(settings)
    producer.produce(settings.topics.tasks, raw, b"needs-fix", 2)
    producer.produce(settings.topics.tasks, b"garbage", b"junk", 1)
    producer.flush(10)

    procs = ProcessGroup(tmp_path)
    procs.start("init", "stage", "init", "--bootstrap-servers", settings.bootstrap_servers,
                "--prefix", settings.prefix)
    try:
        deadline = time.monotonic() + 60
        while len(letters := list(dlq.dead_letters(settings))) < 2:
            procs.check_alive()
            assert time.monotonic() < deadline, "INIT did not dead-letter both events"
            time.sleep(0.5)
    finally:
        procs.stop_all()

    try:
        rows = dlq.summary(letters, dlq.redriven(settings))
        assert {(r["stage"], r["reason"], r["count"]) for r in rows} == {
            ("init", "invalid", 1), ("init", "undecodable", 1)}
        [invalid] = dlq.select(letters, reason="group_size")
        shown = dlq.decoded(invalid)
        assert shown["record"] == "Task" and shown["value"]["task_id"] == "needs-fix"
        assert shown["source_partition"] == 2 and shown["key"] == "needs-fix"

        # Two redrives at once, then a third: the event goes back once.
        sent: list[int] = []

        def attempt() -> None:
            try:
                sent.append(len(dlq.redrive(settings, reason="group_size")))
            except Exception:  # fenced by the other one: it sent nothing
                sent.append(0)

        threads = [threading.Thread(target=attempt) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(sent) == [0, 1]
        assert dlq.redrive(settings, reason="group_size") == []
        assert tasks_on(settings, 2) == [raw, raw]  # the original and one redrive
        assert dlq.redriven(settings) == {invalid.coordinates}
        # The garbage one was not selected and is still waiting.
        [junk] = dlq.select(letters, reason="undecodable")
        assert junk.coordinates not in dlq.redriven(settings)
        assert tasks_on(settings, 1) == [b"garbage"]
    finally:
        admin = AdminClient(settings.kafka())
        for f in admin.delete_topics([dlq.ledger_topic(settings)]).values():
            f.result()
