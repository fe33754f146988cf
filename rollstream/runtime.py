"""The stage runtime every stage runs on: consume → handle → produce, exactly once.

A stage only says what it does with one event (`Stage.handle`); this module does the Kafka
work around it:
- a consumer group with cooperative-sticky assignment (optional static membership);
- bounded in-flight work: at `max_in_flight` events the partitions are paused (still polling,
  so the group keeps us), resumed when work finishes; no unbounded in-process queue;
- one Kafka transaction per commit interval holding the outputs and the input offsets
  (KIP-447), read by read_committed consumers downstream, so a crash neither loses nor
  duplicates an output; events finished out of order are recorded in the offset metadata
  (see offsets.py);
- events that cannot be decoded or are invalid go to the dead-letter topic with their reason
  and source coordinates, in the same transaction; the stage keeps going;
- poison outputs cannot stop a partition: each output is encoded and its size checked against
  its topic's max.message.bytes before anything is produced, and an output the client refuses
  dead-letters its input (reason kept) instead of failing the transaction; a record the broker
  alone refuses (a topic configured smaller than declared) fails its transaction once, and
  when the rewound input comes again it is dead-lettered; a dead letter too large for its
  topic keeps its coordinates and reason, its original bytes cut and marked so;
- the transaction is `rollstream.transaction.Checkpoint`, which classifies every Kafka error:
  retriable ones are retried (bounded), abortable ones abort, fenced or fatal ones rebuild the
  producer; either way the runtime rewinds to the committed offsets and redoes what was not
  committed. A consumer that hits a fatal error (e.g. a static member fenced after a broker
  restart) is rebuilt and rejoins; an id that another live process keeps fencing stops the
  process with a message saying so (`IdInUse`);
- SIGTERM/SIGINT: stop taking events, let in-flight ones finish within the drain timeout,
  commit (one bounded call more), leave the group (bounded): every blocking Kafka call is
  bounded or abandoned (see transaction.py), so a cluster that does not answer cannot keep the
  process alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import signal
import time
import traceback
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from rollstream import kafka, metrics
from rollstream.codec import DecodeError, codec
from rollstream.config import Settings, Topics
from rollstream.events import DEAD_LETTER
from rollstream.offsets import PartitionProgress, decode_done
from rollstream.topics import record_limits
from rollstream.transaction import (
    CALL_TIMEOUT_S,
    Checkpoint,
    FenceCounter,
    IdInUse,
    Interrupt,
    RecordRefused,
    Rewind,
    Stopped,
    close_bounded,
    fatal,
)

log = logging.getLogger("rollstream.runtime")

MAX_BATCH = 500  # events taken from the consumer per loop iteration
IDLE_COMMIT_MS = 20  # earliest commit after the last one when no more input is waiting


class InvalidEvent(ValueError):
    """A decodable event this stage cannot accept; it goes to the dead-letter topic."""


class OutputTooLarge(InvalidEvent):
    """An output over its topic's size limit: its input goes to the dead-letter topic."""


@dataclass(slots=True)
class Output:
    """One record to produce: a dict encoded as `record`, bytes sent as they are (a stage that
    forwards events unchanged), or None, a tombstone (compacted topics)."""

    topic: str
    key: str | bytes
    record: str | None
    value: dict | bytes | None
    partition: int | None = None


@dataclass(slots=True)
class EventContext:
    """Where the event came from, and a way to produce before the event is finished."""

    partition: int
    offset: int
    emit: Callable[[Output], None]


DEAD_LETTER_ROOM = 64 * 1024  # bytes kept free in a dead letter for everything but key and value


def dead_letter(topics: Topics, stage: str, msg: Message, reason: str,
                limit: int | None = None) -> Output:
    """The dead-letter record for an input event: reason, coordinates and the original bytes.

    With `limit` (the dead-letter topic's record limit), key and value are cut so the record
    fits, and `truncated_from` says how many bytes they had: never dropped for its size."""
    key, value = msg.key() or b"", msg.value()
    if isinstance(key, str):
        key = key.encode()
    size = len(key) + len(value or b"")
    truncated_from = None
    # The key travels twice: as the record's key and in its field.
    if limit is not None and size + len(key) > limit - DEAD_LETTER_ROOM:
        truncated_from = size
        room = max(limit - DEAD_LETTER_ROOM, 0)
        key = key[: min(len(key), room // 4)]
        value = None if value is None else value[: room - 2 * len(key)]
        reason = f"{reason} [key and value truncated from {size} bytes]"
    return Output(topics.dlq, key, DEAD_LETTER, {
        "stage": stage,
        "reason": reason,
        "source_topic": msg.topic(),
        "source_partition": msg.partition(),
        "source_offset": msg.offset(),
        "key": key,
        "value": value,
        "failed_at_ms": int(time.time() * 1000),
        "truncated_from": truncated_from,
    })


class Stage(ABC):
    """What a stage does with one event. Subclasses say nothing about Kafka."""

    name: ClassVar[str]
    # The schema input events must have; None hands `handle` the raw bytes (a forwarding stage
    # that needs no decode; the Avro header is still checked).
    input_record: ClassVar[str | None]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics: Topics = settings.topics

    @abstractmethod
    def input_topic(self) -> str: ...

    @abstractmethod
    def handle(self, event: dict, ctx: EventContext) -> list[Output] | Awaitable[list[Output]]:
        """Turn one input event into its outputs (sync, or async for I/O-bound stages)."""

    def on_assign(self, partitions: list[int]) -> None:
        """Partitions of the input topic this process now owns (restore state here)."""

    def on_revoke(self, partitions: list[int]) -> None:
        """Partitions this process no longer owns."""

    def capacity(self) -> int | None:
        """How many more events this stage can start now, beyond those in flight (e.g. RUN:
        room left on its inference servers); None: no limit of its own. At 0 the runtime
        pauses the partitions, as at max_in_flight."""
        return None

    async def start(self) -> None:
        """Open resources (HTTP sessions, sandboxes) inside the event loop."""

    async def close(self) -> None:
        """Release what start() opened."""


class StageRuntime:
    def __init__(self, stage: Stage, settings: Settings, drain_timeout_s: float = 30.0) -> None:
        self.stage = stage
        self.settings = settings
        self.topic = stage.input_topic()
        self.group = settings.topics.group(stage.name)
        self.drain_timeout_s = drain_timeout_s
        self.checkpoint = Checkpoint(settings, kafka.process_id(settings, self.group),
                                     deadline=self._deadline, serve=self._serve_group)
        self.consumer = self._new_consumer()
        self.codec = codec()
        self.stats: Counter[str] = Counter()
        self.metrics = metrics.for_stage(stage.name)
        self._limits = record_limits(settings.topics)
        self._dlq_limit = self._limits.get(settings.topics.dlq)
        self._async = inspect.iscoroutinefunction(stage.handle)
        record = stage.input_record
        self._decode: Callable[[bytes | None], Any] = (
            self.codec.check_header if record is None
            else functools.partial(self.codec.decode_as, record))
        self._progress: dict[int, PartitionProgress] = {}
        self._tasks: dict[asyncio.Task, tuple[int, Message]] = {}
        self._paused: set[int] = set()
        # Which input each output of the open transaction came from, and inputs whose output the
        # broker refused: redone, they are dead-lettered instead of failing the transaction again.
        self._sources: dict[tuple[str, str | bytes], tuple[int, int]] = {}
        self._poison: dict[tuple[int, int], str] = {}
        self._consumer_fences = FenceCounter(f"consumer of group {self.group}")
        self._consumer_failed: KafkaError | None = None
        self._needs_rewind = False
        self._committing = False  # the main loop's commit is out (see _serve_group)
        self._stopping = False
        self._stop_at: float | None = None
        self._idle = True
        self._last_commit = time.monotonic()
        self._last_report = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> None:
        asyncio.run(self.serve())

    def stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._stop_at = time.monotonic()

    def _deadline(self) -> float | None:
        """When blocking Kafka work gives up: the drain timeout after a stop request, plus one
        bounded call for the last commit."""
        if self._stop_at is None:
            return None
        return self._stop_at + self.drain_timeout_s + CALL_TIMEOUT_S

    def _install_signal_handlers(self) -> None:
        # A plain handler, not loop.add_signal_handler: it runs between two bounded Kafka calls
        # even while the loop is blocked in a commit that retries, so the deadline starts then.
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread (tests use threads)
                signal.signal(sig, lambda *_: self.stop())

    async def serve(self) -> None:
        self._install_signal_handlers()
        await self.stage.start()
        try:
            self.checkpoint.open()
            self._subscribe()
            log.info("stage %s: consuming %s as group %s", self.stage.name, self.topic, self.group)
            while not self._stopping:
                try:
                    await self._step()
                except Rewind:
                    self._rewind()
            await self._drain()
        except IdInUse as exc:
            raise SystemExit(f"stage {self.stage.name}: {exc}") from exc
        except Stopped as exc:
            log.warning("stage %s: stopped while the cluster did not answer (%s); what was not "
                        "committed is redone by the next owner", self.stage.name, exc)
        finally:
            close_bounded(self.consumer, CALL_TIMEOUT_S)  # leaving: a revoke commits first
            self.checkpoint.close()
            await self.stage.close()
        log.info("stage %s stopped: %s", self.stage.name, dict(self.stats))

    async def _step(self) -> None:
        self._poll()
        if self._consumer_failed is not None:
            self._rebuild_consumer(self._consumer_failed)
            return
        if self._needs_rewind:
            raise Rewind("partitions lost or a commit failed in a rebalance")
        await self._wait()
        self._reap()
        self._maybe_commit()

    # -- the loop ----------------------------------------------------------------------------

    def _poll(self) -> None:
        # Async work is bounded by max_in_flight; a sync handler finishes each event at once,
        # so its batch is only bounded by what one loop iteration should take.
        free = (self.settings.max_in_flight - len(self._tasks)) if self._async else MAX_BATCH
        room = self.stage.capacity()
        if room is not None:
            free = min(free, room)
        self._apply_backpressure(free)
        self.metrics.in_flight(len(self._tasks))
        if free <= 0:
            self.consumer.poll(0)  # keep the group session alive while paused
            return
        # Block only when nothing is in flight (in-flight work needs the loop), and only for the
        # first event: consume(n, timeout) would wait out the timeout whenever fewer than n wait.
        first = self.consumer.poll(0.05 if not self._tasks else 0)
        if first is None:
            self._idle = True
            return
        limit = min(free, MAX_BATCH)
        msgs = [first, *self.consumer.consume(limit - 1, timeout=0)] if limit > 1 else [first]
        self._idle = len(msgs) < limit
        if self._needs_rewind or self._consumer_failed is not None:
            # A callback in this poll threw away the state these events need. A fatal error
            # among them is still seen: a static member fenced while its session was lost
            # reports it right after the loss, and only once; dropped, the consumer is dead and
            # the process waits forever on it.
            failed = next((m.error() for m in msgs if m.error() is not None
                           and fatal(m.error())), None)
            self._consumer_failed = self._consumer_failed or failed
            return
        if not self._async:
            self._run_sync(msgs)
            return
        for msg in msgs:
            self._dispatch(msg)

    def _run_sync(self, msgs: list[Message]) -> None:
        """Sync stages: each event is handled and its outputs produced at once (the hot path)."""
        decode, handle, encode = self._decode, self.stage.handle, self._encode
        handled = 0
        for msg in msgs:
            progress = self._accept(msg)
            if progress is None:
                continue
            offset = msg.offset()
            try:
                outputs = handle(decode(msg.value()),
                                 EventContext(msg.partition(), offset, self._emit))
                # Encoded (and size-checked) before any is produced: an output that cannot be
                # produced dead-letters its input instead of poisoning the transaction.
                records = [(out, encode(out)) for out in outputs]
            except Interrupt:
                raise
            except Exception as exc:
                records = []
                self._send_dead_letter(msg, self._reason(exc))
            self._produce_all(msg, records)
            progress.passed(offset)
            handled += 1
        self.stats["processed"] += handled
        self.metrics.consumed(handled)
        self.metrics.finished_batch(msgs)

    async def _wait(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=0.01, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(0)

    def _apply_backpressure(self, free: int) -> None:
        want = set(self._progress) if free <= 0 else {
            p for p, prog in self._progress.items() if prog.over_budget()
        }
        pause, resume = want - self._paused, self._paused - want
        if pause:
            self.consumer.pause([TopicPartition(self.topic, p) for p in pause])
        resume &= set(self._progress)
        if resume:
            self.consumer.resume([TopicPartition(self.topic, p) for p in resume])
        self._paused = want
        self.metrics.paused(len(want))

    def _accept(self, msg: Message) -> PartitionProgress | None:
        """The progress of the event's partition, or None when there is nothing to handle: a
        consumer error, a partition revoked meanwhile, or an event already done (skipped)."""
        err = msg.error()
        if err is not None:
            if fatal(err):
                self._consumer_failed = err
            else:
                log.info("stage %s: consumer: %s", self.stage.name, err)
            return None
        progress = self._progress.get(msg.partition())
        if progress is not None and progress.should_skip(msg.offset()):
            self.stats["skipped"] += 1
            progress.passed(msg.offset())
            return None
        if self._poison and progress is not None:
            reason = self._poison.pop((msg.partition(), msg.offset()), None)
            if reason is not None:
                self._send_dead_letter(msg, reason)
                progress.passed(msg.offset())
                self.stats["processed"] += 1
                return None
        return progress

    def _dispatch(self, msg: Message) -> None:
        """Async stages: start the event's handler as a task; _reap collects its outputs."""
        progress = self._accept(msg)
        if progress is None:
            return
        try:
            event = self._decode(msg.value())
        except DecodeError as exc:
            self._finish(msg, [], dead_letter=self._reason(exc))
            progress.passed(msg.offset())
            return
        progress.started(msg.offset())
        task = asyncio.ensure_future(self._call(event, EventContext(msg.partition(),
                                                                     msg.offset(), self._emit)))
        self._tasks[task] = (msg.partition(), msg)

    def _reason(self, exc: Exception) -> str:
        """The dead-letter reason for an event whose handling raised `exc`."""
        if isinstance(exc, DecodeError):
            return f"undecodable: {exc}"
        if isinstance(exc, OutputTooLarge | RecordRefused):
            return f"output cannot be produced: {exc}"
        if isinstance(exc, InvalidEvent):
            return f"invalid: {exc}"
        log.error("stage %s failed on an event:\n%s", self.stage.name,
                  "".join(traceback.format_exception(exc)))
        return f"stage error: {type(exc).__name__}: {exc}"

    async def _call(self, event: dict, ctx: EventContext) -> tuple[list[Output], str | None]:
        try:
            return await self.stage.handle(event, ctx), None  # type: ignore[misc]
        except (asyncio.CancelledError, Interrupt):
            raise
        except Exception as exc:
            return [], self._reason(exc)

    def _reap(self) -> None:
        for task in [t for t in self._tasks if t.done()]:
            part, msg = self._tasks.pop(task)
            if task.cancelled() or part not in self._progress:
                continue
            outputs, reason = task.result()  # raises Rewind when the handler's emit hit one
            self._finish(msg, outputs, dead_letter=reason)
            self._progress[part].finished(msg.offset())

    def _finish(self, msg: Message, outputs: list[Output], dead_letter: str | None) -> None:
        """Produce an event's outputs (the caller then marks its offset finished)."""
        if dead_letter is not None:
            self._send_dead_letter(msg, dead_letter)
        try:
            records = [(out, self._encode(out)) for out in outputs]
        except Exception as exc:  # too large, or the codec rejected a record
            records = []
            self._send_dead_letter(msg, self._reason(exc))
        self._produce_all(msg, records)
        self.stats["processed"] += 1
        self.metrics.consumed()
        self.metrics.finished(msg.timestamp()[1])

    def _encode(self, out: Output) -> bytes | None:
        """The output's bytes, checked against its topic's record limit."""
        value = out.value
        if isinstance(value, dict):
            value = self.codec.encode(out.record, value)
        limit = self._limits.get(out.topic)
        if limit is not None and value is not None and len(value) > limit // 4:  # cheap first
            key = out.key.encode() if isinstance(out.key, str) else out.key
            if len(value) + len(key) > limit:
                raise OutputTooLarge(
                    f"{out.record or 'a record'} for {out.topic} would be "
                    f"{len(value) + len(key)} bytes, over that topic's limit of {limit}")
        return value

    def _produce_all(self, msg: Message, records: list[tuple[Output, bytes | None]]) -> None:
        produce = self.checkpoint.produce
        if self.checkpoint.tracking:  # redoing a transaction that a refused record failed
            source = (msg.partition(), msg.offset())
            self._sources.update(((out.topic, out.key), source) for out, _ in records)
        for out, value in records:
            try:
                produce(out.topic, value, out.key, out.partition)
            except RecordRefused as exc:
                self._send_dead_letter(msg, self._reason(exc))
                return
            self.metrics.produced(out.topic)

    def _emit(self, out: Output) -> None:
        value = self._encode(out)
        self.checkpoint.produce(out.topic, value, out.key, out.partition)
        self.metrics.produced(out.topic)

    def _send_dead_letter(self, msg: Message, reason: str) -> None:
        log.warning("stage %s: dead-letter %s[%d]@%d: %s", self.stage.name, msg.topic(),
                    msg.partition(), msg.offset(), reason[:1000])
        self.stats["dead_lettered"] += 1
        self.metrics.dead_lettered()
        self._emit(dead_letter(self.settings.topics, self.stage.name, msg, reason,
                               self._dlq_limit))

    # -- transactions ------------------------------------------------------------------------

    def _maybe_commit(self) -> None:
        now = time.monotonic()
        elapsed_ms = (now - self._last_commit) * 1000
        # Under load, one transaction per interval; when the input runs dry, commit soon so
        # downstream sees results without waiting out the interval.
        if elapsed_ms >= self.settings.commit_interval_ms or (
                self._idle and elapsed_ms >= IDLE_COMMIT_MS):
            self._last_commit = now
            self._committing = True
            try:
                self._commit()
            finally:
                self._committing = False
        if now - self._last_report >= 10:
            self._last_report = now
            log.info("stage %s: %s, %d in flight", self.stage.name, dict(self.stats),
                     len(self._tasks))

    def _commit(self) -> None:
        """Commit outputs and input offsets atomically; raises Rewind when that failed."""
        dirty = {p: prog for p, prog in self._progress.items() if prog.dirty}
        if not dirty and not self.checkpoint.in_txn:
            return
        offsets = [TopicPartition(self.topic, p, prog.watermark, metadata=prog.metadata())
                   for p, prog in dirty.items()]
        started = time.monotonic()
        self.checkpoint.commit(offsets, self.consumer.consumer_group_metadata)
        self._sources.clear()
        self.stats["commits"] += 1
        self.metrics.committed(time.monotonic() - started)
        for prog in dirty.values():
            prog.dirty = False

    def _serve_group(self) -> bool:
        """While the main loop's commit waits on the cluster (a coordinator moving): serve the
        consumer, so a rebalance meanwhile is answered and partitions lost are handed back and
        rejoined at once, taking no events (every partition paused). True when the transaction
        is no longer wanted: its partitions were lost, or the consumer failed; the commit is
        then abandoned at once."""
        if not self._committing:  # a commit from a rebalance callback, or the last one
            return False
        self._apply_backpressure(0)
        msg = self.consumer.poll(0)
        if msg is not None:
            err = msg.error()
            if err is None:
                # Paused partitions hand out nothing; should one have, it was not handled.
                self._needs_rewind = True
            elif fatal(err):
                self._consumer_failed = err
        return self._needs_rewind or self._consumer_failed is not None

    def _forget_work(self) -> list[int]:
        """Drop in-flight work and progress (nothing of it is committed); the partitions held."""
        self.checkpoint.abort()
        self.metrics.aborted()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self._sources.clear()
        parts = list(self._progress)
        self.stage.on_revoke(parts)
        self._progress.clear()
        return parts

    def _rewind(self) -> None:
        """Redo everything since the last commit: back to the committed offsets."""
        self._needs_rewind = False
        self.stats["rewinds"] += 1
        self._note_refused()
        parts = [TopicPartition(self.topic, p) for p in self._forget_work()]
        try:
            for tp in self._restore(self.consumer, parts):
                self.consumer.seek(TopicPartition(self.topic, tp.partition, max(tp.offset, 0)))
        except KafkaException as exc:
            # A partition the consumer is not fetching yet cannot be sought: a fresh consumer
            # starts every partition at its committed offset.
            self._rebuild_consumer(exc.args[0], fenced=False)

    def _note_refused(self) -> None:
        """Inputs whose output the broker refused in the failed transaction: poison."""
        for topic, key, err in self.checkpoint.refused:
            source = self._sources.get((topic, key)) if key is not None else None
            if source is None and key is not None:
                source = self._sources.get((topic, key.decode(errors="replace")))
            if source is not None:
                self._poison[source] = f"output cannot be produced: {topic}: {err.str()}"
        self.checkpoint.refused.clear()
        self._sources.clear()

    def _rebuild_consumer(self, err: KafkaError, fenced: bool = True) -> None:
        """A consumer that failed for good (e.g. a static member fenced after a broker restart):
        close it and join the group again with a new one."""
        log.warning("stage %s: consumer failed (%s); rejoining with a new one",
                    self.stage.name, err)
        if fenced:
            self._consumer_fences.fenced(err)
        self.stats["consumer_rebuilds"] += 1
        self._forget_work()
        self._paused.clear()
        self._needs_rewind = False
        self._consumer_failed = None
        old, self.consumer = self.consumer, self._new_consumer()
        close_bounded(old, CALL_TIMEOUT_S)  # its callbacks see a stale consumer and do nothing
        self._subscribe()

    # -- rebalancing -------------------------------------------------------------------------

    def _new_consumer(self) -> Consumer:
        return kafka.consumer(self.settings, self.group, error_cb=self._on_error)

    def _subscribe(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_lost)

    def _on_error(self, err: KafkaError) -> None:
        if fatal(err):
            self._consumer_failed = err
        else:  # the client reconnects by itself (a broker restarting, a leader moving)
            log.info("stage %s: %s", self.stage.name, err)

    def _restore(self, consumer: Consumer, partitions: list[TopicPartition]
                 ) -> list[TopicPartition]:
        committed = self.checkpoint.committed(consumer, partitions) if partitions else []
        for tp in committed:
            self._progress[tp.partition] = PartitionProgress(
                tp.offset, decode_done(tp.offset, tp.metadata) if tp.offset >= 0 else set())
        self.stage.on_assign([tp.partition for tp in committed])
        return committed

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return
        log.info("stage %s: assigned %s", self.stage.name, [tp.partition for tp in partitions])
        self.metrics.rebalanced("assigned")
        kafka.start_at_committed(consumer, self._restore(consumer, partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = {tp.partition for tp in partitions}
        if not parts or consumer is not self.consumer:
            return
        log.info("stage %s: revoked %s", self.stage.name, sorted(parts))
        self.metrics.rebalanced("revoked")
        # Their in-flight events go to the next owner; what finished is committed first.
        for task, (part, _) in list(self._tasks.items()):
            if part in parts:
                task.cancel()
                del self._tasks[task]
        try:
            if not self._committing:  # else the commit under way commits them, or rewinds
                self._commit()
        except Rewind:
            self._needs_rewind = True  # the partitions we keep are redone from their commits
        except Stopped:
            pass  # stopping anyway: the next owner redoes what was not committed
        self._forget_partitions(parts)
        self.stage.on_revoke(sorted(parts))

    def _forget_partitions(self, parts: set[int]) -> None:
        """Partitions leaving this process: their progress goes, and the ones paused are
        resumed first: librdkafka keeps a partition's pause through its revocation, so one
        assigned back later would stay paused while `_paused` no longer names it (an INIT
        paused by admission stopped for good after a broker restart that way)."""
        paused = parts & self._paused
        if paused:
            with contextlib.suppress(KafkaException):
                self.consumer.resume([TopicPartition(self.topic, p) for p in paused])
        for p in parts:
            self._progress.pop(p, None)
            self._paused.discard(p)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return
        log.warning("stage %s: lost %s", self.stage.name, [tp.partition for tp in partitions])
        self.metrics.rebalanced("lost")
        self._forget_partitions({tp.partition for tp in partitions})
        # What the open transaction holds may be for the lost partitions: it must not commit
        # (a commit under way is abandoned: see _serve_group).
        if not self._committing:
            self.checkpoint.abort()
        self._needs_rewind = True

    async def _drain(self) -> None:
        """Graceful stop: finish in-flight work within the drain timeout, commit, leave."""
        try:
            if self._tasks:
                log.info("stage %s: draining %d in-flight events", self.stage.name,
                         len(self._tasks))
                left = self.drain_timeout_s if self._stop_at is None else max(
                    0.0, self._stop_at + self.drain_timeout_s - time.monotonic())
                await asyncio.wait(self._tasks, timeout=left)
                self._reap()
                for task in self._tasks:
                    task.cancel()  # unfinished: the next owner resumes them
                self._tasks.clear()
            if not self._needs_rewind:
                self._commit()
        except Rewind as exc:
            log.warning("stage %s: last commit failed (%s); the next owner redoes it",
                        self.stage.name, exc)
