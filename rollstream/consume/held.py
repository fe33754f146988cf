"""The input partitions a process holds: each one's progress, and which are paused.

A partition is paused while its work is over budget (its out-of-order window is full), while
nothing more may start (in flight at the bound, or the stage has no capacity), and while its
state is being restored: the consumer keeps polling (so the group keeps the process) and
paused partitions hand out nothing.
"""

from __future__ import annotations

import contextlib

from confluent_kafka import Consumer, KafkaException, TopicPartition

from rollstream.cluster.offsets import PartitionProgress, decode_done


class Held:
    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.progress: dict[int, PartitionProgress] = {}
        self.restoring: set[int] = set()  # assigned, their state not yet read back
        self.paused: set[int] = set()

    def __contains__(self, partition: int) -> bool:
        return partition in self.progress

    def take(self, committed: list[TopicPartition]) -> None:
        """Partitions now held, from their committed offsets (and what was done above them)."""
        for tp in committed:
            self.progress[tp.partition] = PartitionProgress(
                tp.offset, decode_done(tp.offset, tp.metadata) if tp.offset >= 0 else set())

    def offsets(self) -> dict[int, TopicPartition]:
        """What to commit: each partition that moved on since its last commit."""
        return {p: TopicPartition(self.topic, p, prog.watermark, metadata=prog.metadata())
                for p, prog in self.progress.items() if prog.dirty}

    def committed(self, partitions: list[int]) -> None:
        for p in partitions:
            if p in self.progress:
                self.progress[p].dirty = False

    def pause(self, consumer: Consumer, free: int | None) -> int:
        """Pause what must not hand out events now (`free`: how many more may start; None: no
        bound, and no partition's out-of-order window either), resume the rest. Returns how
        many are paused."""
        if free is None:
            want = set(self.restoring)
        elif free <= 0:
            want = set(self.progress)
        else:
            want = self.restoring | {p for p, prog in self.progress.items() if prog.over_budget()}
        pause, resume = want - self.paused, (self.paused - want) & set(self.progress)
        if pause:
            consumer.pause([TopicPartition(self.topic, p) for p in pause])
        if resume:
            consumer.resume([TopicPartition(self.topic, p) for p in resume])
        self.paused = want
        return len(want)

    def drop(self, consumer: Consumer, partitions: set[int]) -> None:
        """Partitions leaving this process: their progress goes, and the ones paused are
        resumed first: librdkafka keeps a partition's pause through its revocation, so one
        assigned back later would stay paused while `paused` no longer names it (an INIT
        paused by admission stopped for good after a broker restart that way)."""
        paused = partitions & self.paused
        if paused:
            with contextlib.suppress(KafkaException):
                consumer.resume([TopicPartition(self.topic, p) for p in paused])
        for p in partitions:
            self.progress.pop(p, None)
            self.paused.discard(p)
            self.restoring.discard(p)

    def clear(self) -> None:
        """A new consumer: it holds nothing yet, and nothing of it is paused."""
        self.progress.clear()
        self.paused.clear()
        self.restoring.clear()
