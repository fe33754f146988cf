"""`<p>.policy` read one way (rollstream.policy_versions): the newest version wins whatever the
order of records, a record that does not decode is skipped, and a follower sees each newer
version once."""

from __future__ import annotations

import time

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.policy_versions import PolicyReader, latest, partitions
from tests.helpers.runtime_helpers import publish_version


def test_the_newest_version_wins_and_a_bad_record_is_skipped(settings: Settings) -> None:
    assert latest(settings) is None
    publish_version(settings, 1, consumed=4)
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.policy, b"not avro", key="policy")
    producer.flush(30)
    publish_version(settings, 3, consumed=12)
    publish_version(settings, 2, consumed=8)  # late and older: changes nothing
    newest = latest(settings)
    assert newest is not None
    assert (newest["version"], newest["metrics"]["groups_consumed"]) == (3, 12)
    assert [tp.partition for tp in partitions(settings)] == [0]


def test_a_reader_returns_each_newer_version_once(settings: Settings) -> None:
    reader = PolicyReader(settings)
    try:
        publish_version(settings, 1, consumed=4)
        publish_version(settings, 0, consumed=0)
        publish_version(settings, 2, consumed=8)
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            seen += [v["version"] for v in reader.poll(0.2)]
        assert seen == [1, 2]
        assert reader.latest is not None and reader.latest["version"] == 2
        publish_version(settings, 1, consumed=4)
        assert reader.poll(1.0) == []
    finally:
        reader.close()
