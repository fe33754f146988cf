"""`kafka.read_partitions`: a topic read to its end, committed data only, on the real broker."""

from __future__ import annotations

import threading
import time

from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings


def _open_transaction(settings: Settings, keys: list[str]):
    p = kafka.producer(settings, f"{settings.prefix}-writer")
    p.init_transactions(30)
    p.begin_transaction()
    for key in keys:
        kafka.produce(p, settings.topics.scored, b"v", key, 0)
    p.flush(30)
    return p


def _keys(settings: Settings, **kwargs: float) -> list[str]:
    tp = TopicPartition(settings.topics.scored, 0, 0)
    return [m.key().decode() for m in kafka.read_partitions(settings, [tp], **kwargs)]


def test_a_read_waits_for_a_transaction_open_when_it_started(settings: Settings) -> None:
    # The reader reaches what is readable while the transaction is open; its records were below
    # the end when the read started, so it goes on until they are committed.
    writer = _open_transaction(settings, ["a", "b"])
    committer = threading.Timer(1.0, lambda: writer.commit_transaction(30))
    committer.start()
    try:
        assert _keys(settings, settle_s=60) == ["a", "b"]
    finally:
        committer.join()


def test_a_transaction_that_stays_open_holds_a_read_up_for_the_settle_time_only(
        settings: Settings) -> None:
    writer = _open_transaction(settings, ["never"])
    try:
        start = time.monotonic()
        assert _keys(settings, settle_s=1.0) == []
        assert time.monotonic() - start >= 1.0
    finally:
        writer.abort_transaction(30)
    assert _keys(settings) == []  # aborted: never read
