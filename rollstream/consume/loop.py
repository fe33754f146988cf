"""The consume loop: one consumer in its group, the partitions it holds, and their commit.

What it does for whoever runs on it (the stage runtime, the trainer bridge):
- a consumer group with cooperative-sticky assignment (optional static membership); assigned
  partitions start fetching at the committed offsets already read (`kafka.start_at_committed`),
  and, when the owner restores state for them, stay paused until `restored` says it is back;
- revoked partitions: their in-flight work goes to the next owner, what finished is committed
  first; lost partitions (the session expired): dropped, nothing of them committed, and the
  rest redone from the last commit (a rewind);
- one Kafka transaction (rollstream/cluster/transaction.py) holding the outputs and the input
  offsets; while it waits on the cluster the loop serves the group (see `CommitInFlight`): the
  transaction hands back the calls it waits on and never calls back into the loop; an owner on
  an event loop commits with `commit_async`, which waits without holding the event loop up
  (the other runtimes of a fleet go on meanwhile);
- a consumer that failed for good (e.g. a static member fenced after a broker restart) is
  rebuilt and rejoins; an id that another live process keeps fencing stops the process with a
  message saying so (`IdInUse`).

The owner keeps its in-flight work; the loop tells it, through `Work`, when work must go. Each
turn of an owner's loop is the consume loop's: `take` (backpressure, poll, recover), the owner's
handling of what came, then `commit` or `commit_async` when the owner says it is time.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Collection
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from rollstream.cluster import kafka
from rollstream.cluster.kafka_errors import raise_if_denied
from rollstream.cluster.transaction import (
    CALL_TIMEOUT_S,
    Deadline,
    FenceCounter,
    Rewind,
    Steps,
    Stopped,
    Transaction,
    close_bounded,
    fatal,
    finish,
    finish_async,
)
from rollstream.config import Settings
from rollstream.consume.commit import CommitInFlight
from rollstream.consume.deadletters import Poison
from rollstream.consume.held import Held
from rollstream.telemetry import health, metrics

log = logging.getLogger("rollstream.consume")
# How often a loop holding no partition looks whether its input topic exists at all.
MISSING_TOPIC_EVERY_S = 30.0

MAX_BATCH = 500  # events taken from the consumer per turn


class Work(Protocol):
    """The owner's in-flight work, as the loop sees it."""

    def release(self, partitions: set[int]) -> None:
        """These partitions are no longer held: drop their work (the next owner redoes it)."""

    def forget(self) -> None:
        """Nothing since the last commit is committed: drop all in-flight work and state."""


class ConsumeLoop:
    def __init__(self, settings: Settings, topic: str, group: str, name: str, work: Work, *,
                 restores: bool = False, health_name: str = "",
                 deadline: Deadline | None = None) -> None:
        self.settings = settings
        self.topic = topic
        self.group = group
        self.name = name
        self.work = work
        self.restores = restores
        self.transaction = Transaction(settings, kafka.process_id(settings, group),
                                     deadline=deadline)
        self.held = Held(topic)
        self.poison = Poison(self.transaction)
        self.stats: Counter[str] = Counter()
        self.metrics = metrics.for_stage(name)
        # /ready: ready once the group gave this process its share of partitions.
        self.health = health.component(health_name or name, "joining group " + group)
        self.idle = True  # the last poll found no more input waiting
        # Since when polls have found nothing at all (monotonic; None: the last one found input).
        self.empty_since: float | None = 0.0
        self._fences = FenceCounter(f"consumer of group {group}")
        self._failed: KafkaError | None = None  # the consumer cannot go on: rebuild it
        self._rewind: str | None = None  # why what is not committed must be redone
        self._rewound_at = 0  # the transaction's lost ones when the owner last rewound
        self._inflight: CommitInFlight | None = None
        self._assigned: list[int] = []  # held, their state still to be restored
        self._partition_count = 0  # the input topic's, read after each assignment; 0: unknown
        self._recount = False  # an assignment came: read the count after the poll
        self._topic_checked = float("-inf")  # when the input topic's existence was last read
        self.consumer = self._new_consumer()

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        self.transaction.open()
        self._subscribe()

    def close(self) -> None:
        """Leave the group (a revoke commits first) and let the producer go, all bounded."""
        self.health.not_ready("closed")
        close_bounded(self.consumer, CALL_TIMEOUT_S)
        self.transaction.close()

    def _new_consumer(self) -> Consumer:
        return kafka.consumer(self.settings, self.group, error_cb=self._on_error)

    def _subscribe(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_lost)

    # -- polling -----------------------------------------------------------------------------

    def take(self, free: int | None, timeout_s: float) -> list[Message] | None:
        """A turn's intake, the same for every owner: pause what must not hand out events now
        (`free`: how many more the owner takes; None: no bound of its own), poll up to that
        many (MAX_BATCH at most; at 0 only the group is served, waiting `timeout_s` at most for
        the first), then recover what a callback or an error left to redo. None: the consumer
        was rebuilt or rewound, the owner's work since the last commit dropped (Work.forget);
        the owner's turn ends there."""
        self.metrics.paused(self.backpressure(free))
        if free is not None and free <= 0:
            self.keep_alive()
            msgs = []
        else:
            msgs = self.poll(MAX_BATCH if free is None else min(free, MAX_BATCH), timeout_s)
        return None if self.recover() else msgs

    def poll(self, limit: int, timeout_s: float) -> list[Message]:
        """Up to `limit` events of held partitions: waits up to `timeout_s` for the first, then
        takes what is already fetched (consume(n, timeout) would wait out the timeout whenever
        fewer than n wait). Consumer errors are handled here, never returned."""
        first = self.consumer.poll(timeout_s)
        if self._recount:
            self._recount = False
            self._count_partitions()
        if first is None:
            self.idle = True
            if self.empty_since is None:
                self.empty_since = time.monotonic()
            if not self.held.progress:
                self._check_input_topic()
            return []
        self.empty_since = None
        msgs = [first, *self.consumer.consume(limit - 1, timeout=0)] if limit > 1 else [first]
        self.idle = len(msgs) < limit
        events = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                raise_if_denied(err, self.settings.bootstrap_servers, f"topic {msg.topic()}")
                if fatal(err):
                    # Seen also after a loss: a static member fenced while its session was
                    # lost reports it right after, and only once; dropped, the consumer is
                    # dead and the process waits forever on it.
                    self._fail(err)
                else:
                    log.info("%s: consumer: %s", self.name, err)
            elif msg.partition() in self.held.restoring:
                self._interrupt("an event from a partition still being restored")
            else:
                events.append(msg)
        # A callback in this poll threw away the state these events need.
        return [] if self.interrupted else [m for m in events if m.partition() in self.held]

    def keep_alive(self) -> None:
        """Poll without taking events (every partition is paused): the group keeps us."""
        msg = self.consumer.poll(0)
        if msg is not None:
            err = msg.error()
            if err is None:  # paused partitions hand out nothing; should one have, redo it
                self._interrupt("an event from a paused partition")
            elif fatal(err):
                self._fail(err)

    @property
    def interrupted(self) -> bool:
        return self._failed is not None or self._rewind is not None

    def recover(self) -> bool:
        """Rebuild a failed consumer or rewind, if a callback or an error said so."""
        if self._failed is not None:
            self.rebuild(self._failed)
            return True
        if self._rewind is not None:
            self.rewind()
            return True
        return False

    def _fail(self, err: KafkaError) -> None:
        self._failed = self._failed or err
        if self._inflight is not None:
            self._inflight.abandon(f"consumer failed: {err}")

    def backpressure(self, free: int | None) -> int:
        """Pause what must not hand out events now (see Held.pause); returns how many are."""
        return self.held.pause(self.consumer, free)

    def interrupt(self, reason: str) -> None:
        """What is not committed must be redone: the next `recover` rewinds."""
        self._interrupt(reason)

    def _interrupt(self, reason: str) -> None:
        self._rewind = self._rewind or reason
        if self._inflight is not None:
            self._inflight.abandon(reason)

    def holding(self) -> tuple[Collection[int], int]:
        """The input topic's partitions this process holds (a live view, not a copy: read at
        every turn and every look), and how many the topic has (0 while not known): what its
        part of a job's fleet-wide quotas is made from."""
        return self.held.progress.keys(), self._partition_count

    # -- restores ----------------------------------------------------------------------------

    def take_assigned(self) -> list[int]:
        """Partitions whose state the owner is to restore now (they stay paused until then)."""
        parts, self._assigned = self._assigned, []
        return parts

    def restored(self, partitions: list[int]) -> None:
        """Their state is back: the partitions may hand out events (at the next pause)."""
        self.held.restoring.difference_update(partitions)

    def restore_again(self, partitions: list[int]) -> None:
        """A restore given up (another of its partitions was revoked): these still need it."""
        held = [p for p in partitions if p in self.held]
        self.held.restoring.update(held)
        self._assigned.extend(held)

    # -- committing --------------------------------------------------------------------------

    def commit(self, serve: bool = True) -> None:
        """Commit outputs and input offsets atomically, serving the group while the commit is
        out (not the last one: the process is leaving); raises Rewind when that failed."""
        finish(self._main_commit(serve))

    async def commit_async(self, serve: bool = True) -> None:
        """`commit` on an event loop, which runs its other tasks while the commit is out."""
        await finish_async(self._main_commit(serve))

    def _main_commit(self, serve: bool) -> Steps[None]:
        self._inflight = CommitInFlight() if serve else None
        try:
            yield from self._commit_steps(self._inflight)
        finally:
            self._inflight = None

    def _commit(self) -> None:
        """Commit from a rebalance callback (inside a poll: nothing to serve meanwhile)."""
        finish(self._commit_steps(None))

    def _commit_steps(self, state: CommitInFlight | None) -> Steps[None]:
        offsets = self.held.offsets()
        if not offsets and not self.transaction.in_txn:
            return
        started = time.monotonic()
        yield from self._served(self.transaction.commit(list(offsets.values()),
                                                       self.consumer.consumer_group_metadata),
                                state)
        self.poison.clear_sources()
        self.stats["commits"] += 1
        self.metrics.committed(time.monotonic() - started)
        self.held.committed(list(offsets))

    def _served(self, steps: Steps[None], state: CommitInFlight | None) -> Steps[None]:
        """The transaction's steps, handed on to the driver, which waits on each call out (a
        while: WAIT_S). While the main loop's commit (`state`; None: one from a rebalance
        callback, or the last one) waits on the cluster (a coordinator moving): serve the
        consumer between two waits, so a rebalance meanwhile is answered and partitions lost
        are handed back and rejoined at once, taking no events (every partition paused). A
        commit no longer wanted gives up its call at once."""
        with contextlib.closing(steps):
            for call in steps:
                yield call
                if call.returned or state is None:
                    continue
                self.held.pause(self.consumer, 0)
                self.keep_alive()
                if state.abandoned is not None:
                    call.abandon(state.abandoned)

    # -- rewinds and rebuilds ----------------------------------------------------------------

    def _forget(self) -> None:
        """Drop what is not committed: the open transaction and the owner's work."""
        self.transaction.abort()
        self.metrics.aborted()
        self.poison.clear_sources()  # nothing left of the transaction its sources were for
        self.work.forget()
        self._assigned.clear()
        self._rewound_at = self.transaction.rewinds

    def rewind(self) -> None:
        """Redo everything since the last commit: back to the committed offsets."""
        self._rewind = None
        self.stats["rewinds"] += 1
        self.poison.note_refused()
        self._forget()
        parts = [TopicPartition(self.topic, p) for p in self.held.progress]
        try:
            for tp in self._take(self.consumer, parts):
                self.consumer.seek(TopicPartition(self.topic, tp.partition, max(tp.offset, 0)))
        except KafkaException as exc:
            # A partition the consumer is not fetching yet cannot be sought: a fresh consumer
            # starts every partition at its committed offset.
            self.rebuild(exc.args[0], fenced=False)

    def rebuild(self, err: KafkaError, fenced: bool = True) -> None:
        """A consumer that failed for good (e.g. a static member fenced after a broker restart):
        close it and join the group again with a new one."""
        log.warning("%s: consumer failed (%s); rejoining with a new one", self.name, err)
        if fenced:
            self.health.fenced(f"consumer of group {self.group}: {err}")
            self._fences.fenced(err)
        self.stats["consumer_rebuilds"] += 1
        self._forget()
        self.held.clear()
        self._rewind = None
        self._failed = None
        old, self.consumer = self.consumer, self._new_consumer()
        close_bounded(old, CALL_TIMEOUT_S)  # its callbacks see a stale consumer and do nothing
        self._subscribe()

    # -- rebalancing -------------------------------------------------------------------------

    def _take(self, consumer: Consumer, partitions: list[TopicPartition]
              ) -> list[TopicPartition]:
        """Hold these partitions from their committed offsets; queue their restore."""
        committed = self.transaction.committed(consumer, partitions) if partitions else []
        self.held.take(committed)
        if self.restores:
            parts = [tp.partition for tp in committed]
            self.held.restoring.update(parts)
            self._assigned.extend(parts)
        return committed

    def _on_error(self, err: KafkaError) -> None:
        raise_if_denied(err, self.settings.bootstrap_servers)
        if fatal(err):
            self._fail(err)
        else:  # the client reconnects by itself (a broker restarting, a leader moving)
            log.info("%s: %s", self.name, err)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return
        log.info("%s: assigned %s", self.name, [tp.partition for tp in partitions])
        self.metrics.rebalanced("assigned")
        committed = self._take(consumer, partitions)
        # Not here: a metadata call inside the callback's poll aborted the process (the
        # client's call state assertion) on an empty assignment.
        self._recount = True
        self.health.ready()
        kafka.start_at_committed(consumer, committed)
        if self.restores and committed:
            # Paused before the first fetch: nothing is handed out before the state is back.
            self.held.pause(consumer, None)

    def _check_input_topic(self) -> None:
        """Holding no partition, every MISSING_TOPIC_EVERY_S: an input topic that does not
        exist is said, and keeps the loop not ready (the client names it once, then waits in
        silence)."""
        now = time.monotonic()
        if now - self._topic_checked < MISSING_TOPIC_EVERY_S:
            return
        self._topic_checked = now
        try:
            meta = self.consumer.list_topics(self.topic, timeout=CALL_TIMEOUT_S).topics.get(
                self.topic)
        except KafkaException:
            return  # the broker unreachable: the client's error callback says so
        if meta is None or meta.error is not None:
            why = f"input topic {self.topic} does not exist"
            log.warning("%s: %s (`rollstream topics create` makes it); waiting for it",
                        self.name, why)
            self.health.not_ready(why)

    def _count_partitions(self) -> None:
        """The input topic's partition count, read again after an assignment (partitions may
        be added to a topic while it is consumed)."""
        try:
            meta = self.consumer.list_topics(self.topic, timeout=CALL_TIMEOUT_S).topics.get(
                self.topic)
        except KafkaException as exc:  # the last count stands
            log.info("%s: reading %s's partition count: %s", self.name, self.topic, exc)
            return
        if meta is not None and meta.error is None and meta.partitions:
            self._partition_count = len(meta.partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = {tp.partition for tp in partitions}
        if not parts or consumer is not self.consumer:
            return
        log.info("%s: revoked %s", self.name, sorted(parts))
        self.metrics.rebalanced("revoked")
        # Their in-flight events go to the next owner; what finished is committed first.
        self.work.release(parts)
        # A commit under way commits them, or rewinds; and what is to be redone (a commit that
        # failed, a consumer fenced) is never committed: a new producer would fence our
        # successor's. Nor is what finished since a transaction was lost and not yet redone
        # (say, while draining): the lost transaction took its outputs.
        lost = self.transaction.rewinds != self._rewound_at
        if self._inflight is None and not self.interrupted and not lost:
            try:
                self._commit()
            except Rewind as exc:
                self._rewind = str(exc)  # the partitions we keep are redone from their commits
            except Stopped:
                pass  # stopping anyway: the next owner redoes what was not committed
        self.held.drop(consumer, parts)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return
        parts = {tp.partition for tp in partitions}
        log.warning("%s: lost %s", self.name, sorted(parts))
        self.metrics.rebalanced("lost")
        self.health.not_ready("partitions lost; rejoining")
        self.work.release(parts)
        self.held.drop(consumer, parts)
        # What the open transaction holds may be for the lost partitions: it must not commit
        # (a commit under way is abandoned: see _served).
        if self._inflight is None:
            self.transaction.abort()
        self._interrupt("partitions lost")
