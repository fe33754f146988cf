"""`<p>.policy` read one way. Every reader of policy versions goes through here: INIT's admission
gate, the trainer (where it resumes), the inference controller, `rollstream status` and the demo.

How the topic is read: without a consumer group, every partition the graph gives it (one: a
total order of versions), from the beginning, committed records only (`kafka.reader` reads
committed: a version whose transaction aborted is never seen). The newest version wins: a
reader keeps the highest `version`, not the last record, so a duplicate or a late older one
changes nothing. An undecodable record is skipped with a warning: the trainer is the topic's
only writer, and one bad record must not stop admission, training or serving.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from rollstream.cluster import kafka
from rollstream.cluster.follower import Follower
from rollstream.config import Settings
from rollstream.contracts.codec import DecodeError, codec
from rollstream.contracts.events import POLICY_VERSION, PolicyVersion
from rollstream.contracts.graph import BY_ATTR, partition_count

log = logging.getLogger(__name__)


def partitions(settings: Settings, offset: int = OFFSET_BEGINNING) -> list[TopicPartition]:
    """Every partition of <p>.policy, at `offset`."""
    count = partition_count(BY_ATTR["policy"], settings.partitions)
    return [TopicPartition(settings.topics.policy, p, offset) for p in range(count)]


def newer(messages: Iterable[Message], than: PolicyVersion | None = None) -> list[PolicyVersion]:
    """The versions among `messages` that each raise the newest one so far (from `than`), in
    order; the last is the newest. Errors and undecodable records are skipped."""
    found: list[PolicyVersion] = []
    newest = than
    for msg in messages:
        if msg.error() is not None:
            continue
        try:
            event = codec().decode_as(POLICY_VERSION, msg.value())
        except DecodeError as exc:
            log.warning("skipping an undecodable record on %s at %d: %s", msg.topic(),
                        msg.offset(), exc)
            continue
        if newest is None or event["version"] > newest["version"]:
            newest = event
            found.append(event)
    return found


def latest(settings: Settings, tail: list[TopicPartition] | None = None) -> PolicyVersion | None:
    """The newest committed version on <p>.policy, reading it to its end now (from `tail`'s
    offsets when given, else from the beginning)."""
    found = newer(kafka.read_partitions(settings, tail or partitions(settings)))
    return found[-1] if found else None


class PolicyReader:
    """Follows <p>.policy as it grows: `poll` takes what has arrived and keeps the newest;
    `at_end` says when every partition has been read to its end once (from then on `latest`
    is at least the newest version there was when the reader started)."""

    def __init__(self, settings: Settings) -> None:
        self.latest: PolicyVersion | None = None
        self._follower = Follower(settings, partitions(settings))

    @property
    def at_end(self) -> bool:
        return self._follower.at_end

    def poll(self, timeout_s: float = 0.0) -> list[PolicyVersion]:
        """The versions newer than any seen before, in order (empty when none arrived)."""
        found = newer(self._follower.poll(timeout_s), self.latest)
        if found:
            self.latest = found[-1]
        return found

    def close(self) -> None:
        self._follower.close()
