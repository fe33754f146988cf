"""Follow a few partitions as they grow, outside any consumer group: the machinery under every
reader of a small control topic (`<p>.policy`: rollstream.policy_versions; `<cluster>.jobs`:
rollstream.service.jobs).

Committed records only (`kafka.reader` reads committed), from the given offsets. `poll` hands
out the records that arrived; `at_end` says when every partition has been read to its end once,
so a reader knows when what it holds is at least what the topic held when it started.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message, TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings


class Follower:
    def __init__(self, settings: Settings, start: list[TopicPartition]) -> None:
        self._not_at_end = {(tp.topic, tp.partition) for tp in start}
        self._consumer = kafka.reader(settings, start, **{"enable.partition.eof": True})

    @property
    def at_end(self) -> bool:
        return not self._not_at_end

    def poll(self, timeout_s: float = 0.0, limit: int = 100) -> list[Message]:
        """The records that arrived (up to `limit`), waiting up to `timeout_s` for the first;
        errors are not returned (the client rides out broker restarts by itself)."""
        records = []
        for msg in self._consumer.consume(limit, timeout=timeout_s):
            error = msg.error()
            if error is None:
                records.append(msg)
            elif error.code() == KafkaError._PARTITION_EOF:
                self._not_at_end.discard((msg.topic(), msg.partition()))
        return records

    def close(self) -> None:
        self._consumer.close()
