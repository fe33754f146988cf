"""The stage runtime every stage runs on: consume → handle → produce, exactly once.

A stage only says what it does with one event (`Stage.handle`); the runtime hands it events
from the shared consume loop (rollstream/consume/) and produces its outputs there:
- a consumer group with cooperative-sticky assignment (optional static membership); the state
  of newly held partitions (`Stage.restore`) is read back in the main loop while they stay
  paused, the other partitions going on meanwhile (rollstream/consume/restores.py);
- bounded in-flight work: at most `max_in_flight` events in flight, and an async stage keeps
  up to `fetch_buffer` more fetched and waiting in process, ready to start the moment an event
  ends or capacity comes back (Stage.capacity, e.g. RUN's servers full or its fair share
  taken); with both full the partitions are paused (still polling, so the group keeps us) and
  resumed when work finishes; no unbounded in-process queue. The buffer is what keeps a slot
  from idling: the client drops a paused partition's fetched events and, resumed, fetches
  again only after a delay of up to its fetch wait (0.4-1 s measured). A pass of the loop
  costs what finished since the last, not what is in flight: each event's task reports its
  own end, and the loop waits for the first of those (RUN holds thousands of episodes);
- one Kafka transaction per commit interval holding the outputs and the input offsets
  (KIP-447), read by read_committed consumers downstream, so a crash neither loses nor
  duplicates an output; events finished out of order are recorded in the offset metadata
  (see offsets.py);
- events that cannot be decoded or are invalid go to the dead-letter topic with their reason
  and source coordinates, in the same transaction; the stage keeps going; poison outputs
  cannot stop a partition (rollstream/consume/deadletters.py);
- the transaction is `rollstream.cluster.transaction.Transaction`, which classifies every Kafka
  error: retriable ones are retried (bounded), abortable ones abort, fenced or fatal ones rebuild
  the producer; either way the runtime rewinds to the committed offsets and redoes what was not
  committed. A consumer that hits a fatal error is rebuilt and rejoins
  (rollstream/consume/loop.py);
- SIGTERM/SIGINT: a graceful stop, bounded (rollstream/consume/stopping.py);
- several runtimes may share one process and one event loop (`shared=True`: a fleet serving
  many jobs, rollstream/service/fleet.py): the owner of the loop then handles the signals, and an
  idle runtime waits by yielding to the loop instead of in a blocking poll;
- a commit, and the new producer after a failed transaction, wait on the cluster without
  holding the event loop up (ConsumeLoop.commit_async): the other runtimes on the loop, and
  this one's own async events, go on meanwhile. What this runtime's events emit then (RUN's
  checkpoints) cannot join the transaction being committed: it is kept, as encoded then, and
  produced once the commit is done, first in the next transaction (dropped with the events'
  partitions or when the commit failed: their events are redone).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
import traceback
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

from confluent_kafka import Message

from rollstream.cluster.offsets import PartitionProgress
from rollstream.cluster.transaction import (
    IdInUse,
    Interrupt,
    RecordRefused,
    Rewind,
    Stopped,
    finish_async,
)
from rollstream.config import Settings, Topics
from rollstream.consume.commit import CommitClock
from rollstream.consume.deadletters import Encoder, dead_letter
from rollstream.consume.loop import MAX_BATCH, ConsumeLoop
from rollstream.consume.records import InvalidEvent, Output, OutputTooLarge
from rollstream.consume.restores import Restores
from rollstream.consume.stopping import Stopping
from rollstream.contracts.codec import DecodeError, codec

# Stages import these from here.
__all__ = ["EventContext", "InvalidEvent", "Output", "OutputTooLarge", "Stage", "StageRuntime",
           "dead_letter"]

log = logging.getLogger("rollstream.runtime")

REPORT_S = 10.0  # how often the stage's counts are logged
IDLE_S = 0.05  # how long an idle runtime waits for input (blocking alone, yielding when shared)
DRAIN_COMMIT_S = 1.0  # how often a draining runtime commits what finished meanwhile


@dataclass(slots=True)
class EventContext:
    """Where the event came from, and a way to produce before the event is finished."""

    partition: int
    offset: int
    emit: Callable[[Output], None]


# The event a stage takes: the TypedDict of its input record (rollstream.contracts.events), or
# bytes for a stage that forwards events unchanged (input_record None).
E = TypeVar("E")


class Stage(ABC, Generic[E]):
    """What a stage does with one event, of type E. Subclasses say nothing about Kafka."""

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
    def handle(self, event: E, ctx: EventContext) -> list[Output] | Awaitable[list[Output]]:
        """Turn one input event into its outputs (sync, or async for I/O-bound stages)."""

    async def restore(self, partitions: list[int]) -> None:
        """Read back the state of partitions of the input topic this process now holds. It
        runs in the main loop while they stay paused and the other partitions go on, so a
        blocking read belongs in a thread (asyncio.to_thread); it is cancelled when one of
        them is revoked meanwhile, so write the state only after the last await."""

    def on_revoke(self, partitions: list[int]) -> None:
        """Partitions this process no longer owns."""

    def capacity(self) -> int | None:
        """How many more events this stage can start now, beyond those in flight (e.g. RUN:
        room left on its inference servers); None: no limit of its own. At 0 the runtime
        pauses the partitions, as at max_in_flight."""
        return None

    def stalled(self) -> bool:
        """True when no event in flight can progress now (e.g. RUN: no inference server is
        usable): a drain then hands them to the next owner at once instead of waiting out its
        timeout."""
        return False

    async def start(self) -> None:
        """Open resources (HTTP sessions, sandboxes) inside the event loop."""

    async def close(self) -> None:
        """Release what start() opened."""


class StageRuntime:
    """Runs a stage on the consume loop: dispatch (sync or async), restores, drain."""

    def __init__(self, stage: Stage[Any], settings: Settings, drain_timeout_s: float = 30.0, *,
                 shared: bool = False, label: str = "",
                 limit: Callable[[int], int | None] | None = None) -> None:
        """`shared`: one of several runtimes on one event loop (see the module's docstring);
        `label` names it in /ready beside the stage (e.g. the job it serves); `limit`: how
        many more events may start now, given those in flight (a job's quotas), beside the
        stage's own capacity; None from it: no limit."""
        self.stage = stage
        self.limit = limit
        self.settings = settings
        self.shared = shared
        self.topic = stage.input_topic()
        self.group = settings.topics.group(stage.name)
        self.stopping = Stopping(drain_timeout_s)
        self.loop = ConsumeLoop(settings, self.topic, self.group, stage.name, self,
                                restores=True,
                                health_name=" ".join(filter(None, ("stage", stage.name, label))),
                                deadline=self.stopping.deadline)
        self.transaction = self.loop.transaction
        self.stats = self.loop.stats
        self.metrics = self.loop.metrics
        self.codec = codec()
        self.encoder = Encoder(settings, self.codec)
        self.clock = CommitClock(settings.stage.commit_interval_ms)
        self.max_in_flight = settings.stage.max_in_flight
        self.fetch_buffer = settings.stage.fetch_buffer
        self.restores = Restores(stage.restore)
        self._async = inspect.iscoroutinefunction(stage.handle)
        record = stage.input_record
        self._decode: Callable[[bytes | None], Any] = (
            self.codec.check_header if record is None
            else functools.partial(self.codec.decode_as, record))
        self._tasks: dict[asyncio.Task, tuple[int, Message]] = {}
        # Tasks that finished since the last reap, as their done-callbacks report them: a pass of
        # the loop touches what finished, never every task in flight (thousands, for RUN).
        self._finished: deque[asyncio.Task] = deque()
        self._any_finished = asyncio.Event()
        # What events emitted while the transaction waited on the cluster, for the next
        # transaction (see the module's docstring); None while it does not.
        self._emitted: list[tuple[Message, Output, bytes | None]] | None = None
        # Async stages: events fetched that wait for the stage's capacity, oldest first.
        self._waiting: deque[Message] = deque()
        self.started = 0  # async events started so far (a fleet's fair share counts them)
        self._last_report = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> None:
        """Serve in a loop of its own, stopping on SIGTERM/SIGINT."""
        self.stopping.on_signals()
        asyncio.run(self.serve())

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def waiting(self) -> int:
        """Events fetched that wait for the stage's capacity (see the module's docstring)."""
        return len(self._waiting)

    def stop(self) -> None:
        self.loop.health.not_ready("stopping")
        self.stopping.ask()

    async def serve(self) -> None:
        self._any_finished = asyncio.Event()  # of this loop (a runtime may be served again)
        await self.stage.start()
        try:
            self.loop.open()
            log.info("stage %s: consuming %s as group %s", self.stage.name, self.topic, self.group)
            while not self.stopping.asked:
                try:
                    await self._step()
                except Rewind:
                    self.loop.rewind()
            await self._drain()
        except IdInUse as exc:
            self.loop.interrupt(str(exc))  # leaving commits nothing: the id is another's now
            self.loop.health.fenced(str(exc))
            raise SystemExit(f"stage {self.stage.name}: {exc}") from exc
        except Stopped as exc:
            log.warning("stage %s: stopped while the cluster did not answer (%s); what was not "
                        "committed is redone by the next owner", self.stage.name, exc)
        finally:
            self.restores.cancel()
            self.loop.close()
            await self.stage.close()
        log.info("stage %s stopped: %s", self.stage.name, dict(self.stats))

    async def _step(self) -> None:
        if self.transaction.producer is None:  # dropped with a failed transaction
            await self._out(finish_async(self.transaction.opening()))
        took = self._take()
        if took is None:  # the loop rewound or rebuilt its consumer: what was taken is gone
            return
        self.restores.start(self.loop.take_assigned())
        await self._wait(took)
        self.loop.restored(self.restores.done())
        self._reap()
        if self.clock.due(self.loop.idle):
            await self._commit()
        self._report()

    async def _commit(self, serve: bool = True) -> None:
        await self._out(self.loop.commit_async(serve))

    async def _out(self, work: Awaitable[None]) -> None:
        """Wait for the transaction's `work` on the cluster, the event loop going on meanwhile;
        then produce what events emitted in the while, into the next transaction."""
        self._emitted = []
        try:
            await work
        finally:
            emitted, self._emitted = self._emitted, None
        for msg, out, value in emitted:
            try:
                self._produce(out, value)
            except RecordRefused as exc:
                # As if its emit had raised: the event ends as a dead letter.
                self._drop_event(msg, exc)

    def _report(self) -> None:
        now = time.monotonic()
        if now - self._last_report >= REPORT_S:
            self._last_report = now
            log.info("stage %s: %s, %d in flight", self.stage.name, dict(self.stats),
                     len(self._tasks))

    # -- what the loop drops (Work) ----------------------------------------------------------

    def release(self, partitions: set[int]) -> None:
        """Partitions revoked or lost: their in-flight events go to the next owner."""
        for task, (part, _) in list(self._tasks.items()):
            if part in partitions:
                task.cancel()
                del self._tasks[task]
        self._waiting = deque(m for m in self._waiting if m.partition() not in partitions)
        if self._emitted:  # the next owner resumes their events from what was committed
            self._emitted = [e for e in self._emitted if e[0].partition() not in partitions]
        self.loop.restore_again(self.restores.release(partitions))
        self.stage.on_revoke(sorted(partitions))

    def forget(self) -> None:
        """Drop in-flight work and the stage's state (nothing of it is committed)."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self._waiting.clear()
        if self._emitted:
            self._emitted.clear()
        self.restores.cancel()
        self.stage.on_revoke(sorted(self.loop.held.progress))

    # -- dispatch ----------------------------------------------------------------------------

    def _take(self) -> bool | None:
        """Take what input there is room for; whether any came or started (None: the loop
        recovered instead, see ConsumeLoop.take)."""
        if self._async:
            return self._take_async()
        # A sync handler finishes each event at once, so its batch is only bounded by what one
        # loop turn should take (an int all the same: partitions past their out-of-order
        # window stay paused).
        room = self._room()
        msgs = self._fetch(MAX_BATCH if room is None else room)
        if msgs:
            self._run_sync(msgs)
        return None if msgs is None else bool(msgs)

    def _take_async(self) -> bool | None:
        """Fetch within max_in_flight and the fetch buffer, then start what the stage's capacity
        allows within max_in_flight, oldest first."""
        msgs = self._fetch(self.max_in_flight + self.fetch_buffer - len(self._tasks)
                           - len(self._waiting))
        if msgs is None:
            return None
        self._waiting.extend(msgs)
        room = self._room()
        free = self.max_in_flight - len(self._tasks)
        started = self._start_waiting(free if room is None else min(room, free))
        return bool(msgs) or started > 0

    def _room(self) -> int | None:
        """How many events may start now: the stage's capacity within the runtime's limit;
        None: no bound."""
        rooms = (self.stage.capacity(),
                 None if self.limit is None else self.limit(len(self._tasks)))
        return min((r for r in rooms if r is not None), default=None)

    def _fetch(self, free: int) -> list[Message] | None:
        """Up to `free` events; at 0 the partitions are paused and the group is only served;
        None when the loop recovered instead (ConsumeLoop.take)."""
        self.metrics.in_flight(len(self._tasks))
        # Block only when nothing is in flight or waiting (they need the loop), and never on a
        # shared loop (the other runtimes need it).
        block = IDLE_S if not self._tasks and not self._waiting and not self.shared else 0
        return self.loop.take(free, block)

    def _start_waiting(self, count: int) -> int:
        """Start up to `count` waiting events, oldest first; a partition whose out-of-order
        window is full keeps its events (in order: a later one never starts before them)."""
        progress = self.loop.held.progress
        kept: list[Message] = []
        started = 0
        while started < count and self._waiting:
            msg = self._waiting.popleft()
            part = progress.get(msg.partition())
            if part is None:
                continue
            if part.over_budget():
                kept.append(msg)
                continue
            self._dispatch(msg)
            started += 1
        self._waiting.extendleft(reversed(kept))
        return started

    def _run_sync(self, msgs: list[Message]) -> None:
        """Sync stages: each event is handled and its outputs produced at once (the hot path)."""
        decode, handle, encode = self._decode, self.stage.handle, self.encoder.encode
        handled = 0
        for msg in msgs:
            progress = self._accept(msg)
            if progress is None:
                continue
            offset = msg.offset()
            try:
                # A sync stage's handle returns its outputs (`_async` says which).
                outputs = cast(list[Output], handle(decode(msg.value()),
                                                    EventContext(msg.partition(), offset,
                                                                 self._emit)))
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

    async def _wait(self, took: bool) -> None:
        if self._tasks:
            if self._finished:
                # Some finished while a commit was out: reaped now, but the events this pass
                # started must first take their share of the capacity (RUN pins a server in
                # an event's first step), or the next pass's ask counts their room again.
                await asyncio.sleep(0)
            else:  # until one finishes, or 10 ms for the loop's other work
                self._any_finished.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.01):
                        await self._any_finished.wait()
        else:
            # On a shared loop an idle runtime waits here, where the others run meanwhile; so
            # does one whose events wait for capacity (its poll did not block).
            idle = not took and (self.shared or bool(self._waiting))
            await asyncio.sleep(IDLE_S if idle else 0)

    def _accept(self, msg: Message) -> PartitionProgress | None:
        """The progress of the event's partition, or None when there is nothing to handle: a
        partition revoked meanwhile, or an event already done (skipped) or poison."""
        progress = self.loop.held.progress.get(msg.partition())
        if progress is None:
            return None
        if progress.should_skip(msg.offset()):
            self.stats["skipped"] += 1
            progress.passed(msg.offset())
            return None
        reason = self.loop.poison.reason(msg)
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
        emit = functools.partial(self._emit_during, msg)
        task = asyncio.ensure_future(self._call(event, EventContext(msg.partition(),
                                                                     msg.offset(), emit)))
        self._tasks[task] = (msg.partition(), msg)
        task.add_done_callback(self._on_finished)
        self.started += 1

    def _on_finished(self, task: asyncio.Task) -> None:
        self._finished.append(task)
        self._any_finished.set()

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

    async def _call(self, event: Any, ctx: EventContext) -> tuple[list[Output], str | None]:
        try:
            return await cast(Awaitable[list[Output]], self.stage.handle(event, ctx)), None
        except (asyncio.CancelledError, Interrupt):
            raise
        except Exception as exc:
            return [], self._reason(exc)

    def _reap(self) -> None:
        progress = self.loop.held.progress
        while self._finished:  # one at a time: a Rewind leaves the rest for the next reap
            task = self._finished.popleft()
            held = self._tasks.pop(task, None)  # None: dropped meanwhile (revoked, forgotten)
            if held is None or task.cancelled() or held[0] not in progress:
                continue
            part, msg = held
            outputs, reason = task.result()  # raises Rewind when the handler's emit hit one
            self._finish(msg, outputs, dead_letter=reason)
            progress[part].finished(msg.offset())

    # -- producing ---------------------------------------------------------------------------

    def _finish(self, msg: Message, outputs: list[Output], dead_letter: str | None) -> None:
        """Produce an event's outputs (the caller then marks its offset finished)."""
        if dead_letter is not None:
            self._send_dead_letter(msg, dead_letter)
        try:
            records = [(out, self.encoder.encode(out)) for out in outputs]
        except Exception as exc:  # too large, or the codec rejected a record
            records = []
            self._send_dead_letter(msg, self._reason(exc))
        self._produce_all(msg, records)
        self.stats["processed"] += 1
        self.metrics.consumed()
        self.metrics.finished(msg.timestamp()[1])

    def _produce_all(self, msg: Message, records: list[tuple[Output, bytes | None]]) -> None:
        self.loop.poison.produced_for(msg, [out for out, _ in records])
        for out, value in records:
            try:
                self._produce(out, value)
            except RecordRefused as exc:
                self._send_dead_letter(msg, self._reason(exc))
                return

    def _produce(self, out: Output, value: bytes | None) -> None:
        """Into the open transaction; raises RecordRefused for a record the client refuses."""
        self.transaction.produce(out.topic, value, out.key, out.partition)
        self.metrics.produced(out.topic)

    def _emit(self, out: Output) -> None:
        self._produce(out, self.encoder.encode(out))

    def _emit_during(self, msg: Message, out: Output) -> None:
        """An async event's emit: kept for the next transaction while the transaction waits on
        the cluster (a commit out)."""
        if self._emitted is None:
            self._emit(out)
        else:  # encoded now: the stage may change the record afterwards
            self._emitted.append((msg, out, self.encoder.encode(out)))

    def _drop_event(self, msg: Message, exc: Exception) -> None:
        """An event in flight whose kept emit the client refused: it ends as a dead letter."""
        for task, (part, held) in list(self._tasks.items()):
            if held is msg:
                task.cancel()
                del self._tasks[task]
                self._finish(msg, [], dead_letter=self._reason(exc))
                self.loop.held.progress[part].finished(msg.offset())

    def _send_dead_letter(self, msg: Message, reason: str) -> None:
        log.warning("stage %s: dead-letter %s[%d]@%d: %s", self.stage.name, msg.topic(),
                    msg.partition(), msg.offset(), reason[:1000])
        self.stats["dead_lettered"] += 1
        self.metrics.dead_lettered()
        self._emit(dead_letter(self.settings.topics, self.stage.name, msg, reason,
                               self.encoder.dlq_limit))

    # -- stopping ----------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Graceful stop: finish in-flight work within the drain timeout or while it can
        progress (Stage.stalled), committing what finished at least every DRAIN_COMMIT_S (a
        drain longer than the transaction timeout would otherwise be fenced, losing all of
        it), then leave."""
        try:
            if self._tasks:
                log.info("stage %s: draining %d in-flight events", self.stage.name,
                         len(self._tasks))
            while self._tasks and (left := self.stopping.drain_left()) > 0:
                await asyncio.wait(self._tasks, timeout=min(left, DRAIN_COMMIT_S))
                self._reap()
                if self._tasks and not self.loop.interrupted:
                    await self._commit(serve=False)
                if self._tasks and self.stage.stalled():
                    log.info("stage %s: %d in-flight events cannot progress; the next owner "
                             "resumes them", self.stage.name, len(self._tasks))
                    break
            for task in self._tasks:
                task.cancel()  # unfinished: the next owner resumes them
            self._tasks.clear()
            if not self.loop.interrupted:
                await self._commit(serve=False)
        except Rewind as exc:
            # Nothing since the last commit is committed; leaving the group commits nothing
            # more either (the consume loop knows a transaction was lost).
            log.warning("stage %s: a commit while draining failed (%s); the next owner redoes "
                        "what it held", self.stage.name, exc)
