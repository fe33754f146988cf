"""The trainer bridge: scored trajectories in, batches of complete, scored groups out.

Offsets are committed only when the trainer acknowledges a batch. Samples of one group arrive
on different partitions and out of order, so each partition's commit is its lowest unacknowledged
offset, and acknowledged offsets above it travel in the commit metadata (rollstream/offsets.py).
With `transactional=True`, `Batch.ack(outputs)` commits the offsets and the trainer's outputs
(its PolicyVersion event) in one Kafka transaction, through the same exactly-once checkpoint as
the stage runtime (rollstream/transaction.py: retriable errors retried, bounded; abortable ones
aborted; a fenced or failed producer dropped and rebuilt). A trainer restarted from the last
committed PolicyVersion sees exactly the batches that version was not trained on, so none is
lost and none is trained twice.

When an ack could not commit (aborted, fenced, the group's partitions lost) or the consumer
failed for good, the bridge raises `rollstream.transaction.Rewind`: the trainer's state now
includes batches that are not committed, so the trainer must go back to the last committed
PolicyVersion and open a new bridge (trainer_bridge/train_loop.py does this).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from rollstream import kafka
from rollstream.codec import DecodeError, codec
from rollstream.config import Settings
from rollstream.events import SCORED_TRAJECTORY
from rollstream.graph import BRIDGE
from rollstream.offsets import PartitionProgress, decode_done
from rollstream.runtime import Output, dead_letter
from rollstream.transaction import (
    RETRY_S,
    Checkpoint,
    Rewind,
    classify,
    close_bounded,
    fatal,
)
from rollstream.transaction import committed as read_committed
from trainer_bridge.groups import Group, GroupAssembler, GroupPolicy, Sample

log = logging.getLogger("trainer_bridge.bridge")


@dataclass
class Batch:
    groups: list[Group]
    _bridge: TrainerBridge = field(repr=False)
    acked: bool = False

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]

    @property
    def trainable(self) -> list[Sample]:
        return [s for g in self.groups for s in g.trainable]

    @property
    def step_id(self) -> str:
        """Names the batch by its episodes, so a step can be recognized if it comes back."""
        ids = "\n".join(sorted(s.episode_id for s in self.samples))
        return hashlib.sha1(ids.encode()).hexdigest()[:16]

    def ack(self, outputs: list[Output] | None = None) -> None:
        """The trainer has taken this batch: commit its offsets (and outputs, atomically)."""
        if not self.acked:
            self._bridge._ack(self, outputs or [])
            self.acked = True


class TrainerBridge:
    """Iterator API: `for batch in bridge.batches(): trainer.step(batch); batch.ack()`."""

    def __init__(self, settings: Settings, groups_per_batch: int = 4,
                 policy: GroupPolicy | None = None, group: str | None = None,
                 transactional: bool = False) -> None:
        self.settings = settings
        self.topic = settings.topics.scored
        self.groups_per_batch = groups_per_batch
        self.current_version = 0  # the trainer's policy version, for the staleness bound
        group_id = group or settings.topics.group(BRIDGE)
        self.consumer = kafka.consumer(settings, group_id)
        self.checkpoint = Checkpoint(settings, kafka.process_id(settings, group_id)) \
            if transactional else None
        if self.checkpoint is not None:
            self.checkpoint.open()
        # Without transactions: plain produce, then the offset commit.
        self.producer = None if self.checkpoint else kafka.producer(settings)
        self.transactional = transactional
        self.assembler = GroupAssembler(policy)
        self.progress: dict[int, PartitionProgress] = {}
        self.dead_lettered = 0
        self._dead_letters: list[Output] = []
        self._ready: list[Group] = []
        self.consumer.subscribe([self.topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke)

    @property
    def stats(self) -> dict[str, int]:
        return {**self.assembler.stats, "dead_lettered": self.dead_lettered}

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        committed = (self.checkpoint.committed(consumer, partitions) if self.checkpoint
                     else read_committed(consumer, partitions))
        for tp in committed:
            skip = decode_done(tp.offset, tp.metadata) if tp.offset >= 0 else set()
            self.progress[tp.partition] = PartitionProgress(tp.offset, skip)
        kafka.start_at_committed(consumer, committed)

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
            # Wait for one event, then take what is already fetched: consume(n, timeout)
            # would wait out the timeout whenever fewer than n are there.
            first = self.consumer.poll(0.2)
            msgs = [first, *self.consumer.consume(499, timeout=0)] if first is not None else []
            if msgs:
                last_event = time.monotonic()
            else:
                # Nothing new: commit what was dropped or dead-lettered since the last ack, so
                # a restart does not see it again when no batch follows.
                if self._dead_letters or any(p.dirty for p in self.progress.values()):
                    self._commit([])
                if idle_timeout_s is not None and time.monotonic() - last_event > idle_timeout_s:
                    return
            for msg in msgs:
                self._accept(msg)
            self._ready.extend(self.assembler.expire(self.current_version))
            for group in self.assembler.take_dropped():
                self._finished(group.samples)  # nothing to train on: acknowledged as handled

    def _accept(self, msg: Any) -> None:
        if msg.error() is not None:
            if fatal(msg.error()):  # e.g. a static member fenced: this bridge cannot go on
                raise Rewind(f"consumer failed: {msg.error()}")
            return
        progress = self.progress.get(msg.partition())
        if progress is None:
            return
        progress.started(msg.offset())
        if progress.should_skip(msg.offset()):
            progress.finished(msg.offset())  # in a batch a previous bridge already handed out
            return
        try:
            scored = codec().decode_as(SCORED_TRAJECTORY, msg.value())
        except DecodeError as exc:
            # Sent with the next ack, before or with the offset commit that passes it.
            self._dead_letters.append(
                dead_letter(self.settings.topics, "bridge", msg, f"undecodable: {exc}"))
            self.dead_lettered += 1
            progress.finished(msg.offset())
            return
        sample = Sample(scored, msg.partition(), msg.offset())
        group = self.assembler.add(sample, self.current_version)
        if group is not None:
            self._ready.append(group)

    def _produce(self, out: Output) -> None:
        value = None if out.value is None else codec().encode(out.record, out.value)
        if self.checkpoint is not None:
            self.checkpoint.produce(out.topic, value, out.key, out.partition)
        else:
            kafka.produce(self.producer, out.topic, value, key=out.key, partition=out.partition)

    def _finished(self, samples: list[Sample]) -> None:
        for s in samples:
            progress = self.progress.get(s.partition)
            if progress is not None:
                progress.finished(s.offset)

    def _ack(self, batch: Batch, outputs: list[Output]) -> None:
        self._finished(batch.samples)
        self._commit(outputs)

    def _commit(self, outputs: list[Output]) -> None:
        """Commit finished offsets with the outputs (and pending dead letters), atomically when
        transactional."""
        outputs = [*self._dead_letters, *outputs]
        self._dead_letters.clear()
        offsets = [TopicPartition(self.topic, p, prog.watermark, metadata=prog.metadata())
                   for p, prog in self.progress.items() if prog.dirty]
        if self.checkpoint is not None:
            self.checkpoint.begin()
            for out in outputs:
                self._produce(out)
            self.checkpoint.commit(offsets, self.consumer.consumer_group_metadata)
        else:
            for out in outputs:
                self._produce(out)
            if outputs:
                self.producer.flush(30)  # outputs before the offsets that pass them
            if offsets:
                self._commit_offsets(offsets)
        for prog in self.progress.values():
            prog.dirty = False

    def _commit_offsets(self, offsets: list[TopicPartition]) -> None:
        """A plain offset commit, tried again while the cluster moves its coordinator or a
        broker restarts (a raised error used to end the process); one the group refuses
        (a rebalance took the partitions, the session was lost) raises Rewind: the next owner
        gets these events again (at least once, as without transactions)."""
        started = time.monotonic()
        while True:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=False)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if classify(err) != "retry" or time.monotonic() - started > RETRY_S:
                    raise Rewind(f"offset commit: {err}") from exc
                log.info("offset commit: %s; trying again", err)
                time.sleep(0.5)

    def close(self) -> None:
        """Leave the group and let the producer go (bounded: a cluster that does not answer
        cannot keep the trainer from stopping)."""
        close_bounded(self.consumer, 10)
        if self.checkpoint is not None:
            self.checkpoint.close()
        else:
            close_bounded(self.producer, 30)

    def __enter__(self) -> TrainerBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
