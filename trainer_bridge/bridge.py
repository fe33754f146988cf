"""The trainer bridge: scored trajectories in, batches of complete groups out.

Offsets are committed only when the trainer acknowledges a batch. Samples of one group arrive
on different partitions and out of order, so each partition's commit is its lowest
unacknowledged offset, and acknowledged offsets above it travel in the commit metadata (see
rollstream/offsets.py): a restarted bridge neither loses a batch nor hands one out twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from rollstream import kafka
from rollstream.codec import DecodeError, codec
from rollstream.config import Settings
from rollstream.offsets import PartitionProgress, decode_done
from rollstream.runtime import dead_letter
from trainer_bridge.groups import Group, GroupAssembler, Sample


@dataclass
class Batch:
    groups: list[Group]
    _bridge: TrainerBridge = field(repr=False)
    acked: bool = False

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]

    def ack(self) -> None:
        """The trainer has taken this batch: commit its offsets."""
        if not self.acked:
            self._bridge._ack(self)
            self.acked = True


class TrainerBridge:
    """Iterator API: `for batch in bridge.batches(): trainer.step(batch); batch.ack()`."""

    def __init__(self, settings: Settings, groups_per_batch: int = 4,
                 group: str | None = None) -> None:
        self.settings = settings
        self.topic = settings.topics.scored
        self.groups_per_batch = groups_per_batch
        self.consumer = kafka.consumer(settings, group or f"{settings.prefix}.bridge")
        self.assembler = GroupAssembler()
        self.progress: dict[int, PartitionProgress] = {}
        self.dlq_producer = kafka.producer(settings)
        self.dead_lettered = 0
        self._ready: list[Group] = []
        self.consumer.subscribe([self.topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in consumer.committed(partitions, timeout=30):
            skip = decode_done(tp.offset, tp.metadata) if tp.offset >= 0 else set()
            self.progress[tp.partition] = PartitionProgress(tp.offset, skip)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # Unacknowledged samples of revoked partitions will be redelivered to their next owner.
        revoked = {tp.partition for tp in partitions}
        for p in revoked:
            self.progress.pop(p, None)
        for group in [*self.assembler.pending.values(), *self._ready]:
            group.samples = [s for s in group.samples if s.partition not in revoked]

    def batches(self, max_batches: int | None = None,
                idle_timeout_s: float | None = None) -> Iterator[Batch]:
        """Yield batches of complete groups; stop after max_batches or idle_timeout_s idle."""
        produced = 0
        last_event = time.monotonic()
        while max_batches is None or produced < max_batches:
            while len(self._ready) >= self.groups_per_batch:
                groups = self._ready[: self.groups_per_batch]
                del self._ready[: self.groups_per_batch]
                yield Batch(groups, self)
                produced += 1
                if max_batches is not None and produced >= max_batches:
                    return
            msgs = self.consumer.consume(500, timeout=0.2)
            if msgs:
                last_event = time.monotonic()
            elif idle_timeout_s is not None and time.monotonic() - last_event > idle_timeout_s:
                return
            for msg in msgs:
                self._accept(msg)

    def _accept(self, msg: Any) -> None:
        if msg.error() is not None:
            if msg.error().fatal():
                raise KafkaException(msg.error())
            return
        progress = self.progress.get(msg.partition())
        if progress is None:
            return
        progress.started(msg.offset())
        if progress.should_skip(msg.offset()):
            progress.finished(msg.offset())  # in a batch a previous bridge already handed out
            return
        try:
            scored = codec().decode_as("ScoredTrajectory", msg.value())
        except DecodeError as exc:
            # Flushed before the offset commit that passes it: at least once in the DLQ.
            out = dead_letter(self.settings.topics, "bridge", msg, f"undecodable: {exc}")
            kafka.produce(self.dlq_producer, out.topic, codec().encode("DeadLetter", out.value),
                          key=out.key)
            self.dead_lettered += 1
            progress.finished(msg.offset())
            return
        group = self.assembler.add(Sample(scored, msg.partition(), msg.offset()))
        if group is not None:
            self._ready.append(group)

    def _ack(self, batch: Batch) -> None:
        for s in batch.samples:
            progress = self.progress.get(s.partition)
            if progress is not None:
                progress.finished(s.offset)
        offsets = [TopicPartition(self.topic, p, prog.watermark, metadata=prog.metadata())
                   for p, prog in self.progress.items() if prog.dirty]
        if offsets:
            self.dlq_producer.flush(30)
            self.consumer.commit(offsets=offsets, asynchronous=False)
            for prog in self.progress.values():
                prog.dirty = False

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> TrainerBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
