"""One exactly-once transaction: outputs and input offsets committed in one Kafka transaction.

The consume loop (rollstream/consume/loop.py), which the stage runtime and the trainer bridge
both run on, commits through `Transaction`. What it guarantees, and what each kind of Kafka
error does:

- Records produced through `produce` and the input offsets given to `commit` become visible to
  read_committed readers together or not at all (KIP-98 transactions; with the consumer's group
  metadata, KIP-447, a process that lost its partitions cannot commit for them).
- Retriable errors (a timeout, a coordinator that moved or is loading, a broker that is down):
  the same call is tried again, each try bounded by `call_timeout_s`, until `retry_s` has
  passed or the caller's deadline (a draining process) has come; then the transaction is
  aborted and `Rewind` raised.
- Abortable errors (`txn_requires_abort`): the transaction is aborted and `Rewind` raised.
- Fenced or fatal errors, and any error Kafka does not call retriable or abortable (the
  coordinator bumped the producer epoch after a broker restart or a transaction timeout;
  another process initialized the same transactional id; INVALID_TXN_STATE): the producer is
  dropped and `Rewind` raised; the next transaction begins on a new producer with the same
  transactional id, whose initialization aborts whatever the old one left open.
  Fenced `FENCE_LIMIT` times within `FENCE_WINDOW_S` means another live process keeps taking
  the id back: `IdInUse` is raised, saying so, and the process exits instead of fighting it.
- `Rewind` tells the caller that nothing since its last successful commit is committed: it
  drops that work and reads again from the committed offsets (`committed` reads them, bounded
  and retried), so nothing is lost and nothing is produced twice.
- Every blocking call is bounded: each transactional call runs in a thread of its own and is
  abandoned (with its producer) when it has not returned after HUNG_S or by the `Deadline`
  (a draining process), so a stop request is honoured by its deadline even when the client
  does not return.
- Control flows one way, from the owner into the transaction: the transaction never calls back.
  `commit` hands back its steps, and each step the `Call` that is out; the owner drives them,
  waiting on each call a quarter second at a time. The consume loop serves its consumer in
  between, so a rebalance meanwhile is answered (the whole group waits on a member that does
  not) and partitions lost to the session timeout (a group coordinator unreachable longer than
  that) are handed back and rejoined at once, not after the call; when the transaction is no
  longer wanted (the partitions were lost) it abandons the call (`Call.abandon`), and the
  transaction gives it up at once instead of after HUNG_S. The `Deadline` is the one thing the
  transaction reads of its owner: a value the owner sets when a stop is asked.
- An owner on an event loop shared with others (several jobs' runtimes in one fleet process)
  drives the steps with `finish_async`: each wait yields to the loop, so one job's commit
  waiting on the cluster does not hold up the other jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from rollstream.cluster import kafka
from rollstream.cluster.kafka_errors import AccessDenied, denied, problem, raise_if_denied
from rollstream.config import Settings
from rollstream.contracts.codec import headers_for

log = logging.getLogger("rollstream.cluster.transaction")

CALL_TIMEOUT_S = 5.0  # the timeout given to each blocking Kafka call
# A transaction spans one commit interval (well under a second), so only a stuck
# one reaches this; until then a crashed process's open transaction holds back read_committed
# readers downstream, so shorter than the 15 s of other producers (rollstream.cluster.kafka).
TRANSACTION_TIMEOUT_MS = 10_000
# A call not back after this long is abandoned: each is given CALL_TIMEOUT_S, so one still out
# well past it waits on a coordinator that is gone (after an active-controller kill
# send_offsets_to_transaction kept waiting on the dead group coordinator until it restarted,
# though another node had taken the group over). A new producer looks the coordinators up
# afresh, and each second more of waiting is a second the whole stage stands still.
HUNG_S = CALL_TIMEOUT_S + 3.0
# How long a driver waits on a call out before it looks again (and serves its consumer).
WAIT_S = 0.25
RETRY_S = 30.0  # how long retriable commit errors are retried before the transaction is aborted
# Two live processes with one id fence each other at every commit, so they reach the limit in
# seconds; a broker fault fences a process at most once (its transaction timed out while the
# coordinator moved), and faults can come a few within the window.
FENCE_LIMIT = 5
FENCE_WINDOW_S = 120.0

# Errors after which this producer cannot go on: build a new one with the same transactional id.
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
           KafkaError.INVALID_TXN_STATE, KafkaError._STATE, KafkaError._FATAL}

# Errors about one record, not the producer: that record is refused, the transaction goes on.
_REFUSED = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
            KafkaError.POLICY_VIOLATION,
            KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION, KafkaError._INVALID_ARG,
            KafkaError.INVALID_RECORD}


class Interrupt(Exception):  # noqa: N818
    """Not about the event being handled: the transaction cannot go on as it was."""


class Rewind(Interrupt):
    """Nothing since the last successful commit is committed: read again from the committed
    offsets."""


class IdInUse(Interrupt):
    """Another live process keeps fencing this transactional id (or group instance id)."""


class RecordRefused(ValueError):
    """One record the client will not produce (too large, no such topic or partition)."""


class Stopped(Interrupt):
    """The caller's deadline came while waiting for the cluster."""


def fatal(err: KafkaError) -> bool:
    """A client that cannot go on. A consumer reports its fatal error (a static member fenced)
    as an event whose error carries the _FATAL code but not always the fatal flag."""
    return bool(err.fatal()) or err.code() == KafkaError._FATAL


def classify(err: KafkaError, bootstrap: str = "the cluster") -> str:
    """'retry', 'abort' or 'rebuild': what a transactional producer does after `err`; a
    refused login or authorization stops the process (no retry mends it)."""
    raise_if_denied(err, bootstrap)
    if fatal(err) or err.code() in _FENCED:
        return "rebuild"
    if err.txn_requires_abort():
        return "abort"
    if err.retriable() or err.code() in kafka.TRANSIENT:
        return "retry"
    return "rebuild"  # unknown: a clean producer is the one safe way on


class FenceCounter:
    """Fences seen recently; too many means another live process holds our id."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._times: deque[float] = deque(maxlen=FENCE_LIMIT)

    def fenced(self, err: object) -> None:
        now = time.monotonic()
        self._times.append(now)
        if len(self._times) == FENCE_LIMIT and now - self._times[0] < FENCE_WINDOW_S:
            raise IdInUse(
                f"{self.what} was fenced {FENCE_LIMIT} times in {FENCE_WINDOW_S:.0f} s "
                f"(last: {err}): another live process uses the same id (--instance-id); "
                "stopping instead of fighting it")


class Deadline:
    """When blocking Kafka work gives up: not before its owner sets `at` (a monotonic time: a
    stop was asked). The owner sets it; a transaction only reads it, so a stop asked while a
    call is out (its signal handler runs between two waits) cuts that call and its retries
    short."""

    def __init__(self) -> None:
        self.at: float | None = None

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def timeout(self, call_timeout_s: float) -> float:
        """One call's timeout: `call_timeout_s`, less when the deadline is nearer."""
        if self.at is None:
            return call_timeout_s
        return max(0.1, min(call_timeout_s, self.at - time.monotonic()))


class Call:
    """One blocking transactional call, out in a thread of its own: after broker restarts a
    call was seen not to return for minutes whatever its timeout. Whoever drives the
    transaction's steps waits on it (see the module doc) and may `abandon` it."""

    def __init__(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.what = what
        self.unwanted: str | None = None  # why the driver gave up on it
        self.returned = False  # whether it had returned when the driver last waited on it
        self.started = time.monotonic()
        self._result: list[tuple[bool, Any]] = []
        # Event loops waiting on it (`wait_async`), woken when it returns.
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

        def run() -> None:
            try:
                self._result.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self._result.append((False, exc))
            with self._lock:
                waiters, self._waiters = self._waiters, []
            for loop, future in waiters:
                with contextlib.suppress(RuntimeError):  # that loop has closed
                    loop.call_soon_threadsafe(_wake, future)

        self._thread = threading.Thread(target=run, name=f"kafka-{what}", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for it to return; True once it has."""
        self._thread.join(timeout_s)
        self.returned = bool(self._result)
        return self.returned

    async def wait_async(self, timeout_s: float) -> bool:
        """`wait`, yielding to the event loop meanwhile (woken as soon as the call returns)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:  # the call's thread takes the waiters under it once it has a result
            out = not self._result
            if out:
                self._waiters.append((loop, future))
        if out:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, timeout_s)
        self.returned = bool(self._result)
        return self.returned

    def abandon(self, reason: str) -> None:
        """The transaction is no longer wanted: give up on the call at once, not after HUNG_S."""
        self.unwanted = self.unwanted or reason

    def result(self) -> Any:
        ok, value = self._result[0]
        if ok:
            return value
        raise value


T = TypeVar("T")
# A transaction's blocking work, one step per wait: each step hands the driver the call that is
# out; the driver waits on it a while (see `Call.wait`) before taking the next step, and
# closes the steps if it stops early (so the transaction's clean-up runs then, not whenever the
# steps are collected).
Steps = Generator[Call, None, T]


def finish(steps: Steps[T]) -> T:
    """Drive a transaction's steps in this thread, waiting on each call (what is to be served
    between two waits, the steps do themselves: see ConsumeLoop)."""
    with contextlib.closing(steps):
        try:
            while True:
                next(steps).wait(WAIT_S)
        except StopIteration as done:
            return done.value


async def finish_async(steps: Steps[T]) -> T:
    """`finish` on an event loop: the loop's other tasks run while a call is out."""
    with contextlib.closing(steps):
        try:
            while True:
                await next(steps).wait_async(WAIT_S)
        except StopIteration as done:
            return done.value


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # not given up on (its wait timed out)
        future.set_result(None)


def pause(seconds: float) -> Steps[None]:
    """Wait `seconds` (between two tries) as a step, so a driver on an event loop does not
    hold the loop up; not abandoned, it is short."""
    call = Call("pause", time.sleep, (seconds,))
    while not call.returned:
        yield call


class Transaction:
    """A transactional producer that commits outputs with input offsets (see module doc).

    `deadline`: when blocking work gives up (a draining process), read, never written."""

    def __init__(self, settings: Settings, transactional_id: str,
                 deadline: Deadline | None = None,
                 call_timeout_s: float = CALL_TIMEOUT_S, retry_s: float = RETRY_S) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.deadline = deadline or Deadline()
        self.call_timeout_s = call_timeout_s
        self.retry_s = retry_s
        self.fences = FenceCounter(f"transactional id {transactional_id}")
        self.in_txn = False
        self.rewinds = 0  # transactions lost (each one raised Rewind)
        self.producer: Producer | None = None
        self._abandoned: list[Producer] = []  # kept alive while their stuck calls run
        # (topic, key, error) of records the broker refused since the caller last looked,
        # reported while `tracking` (after a transaction failed on a refused record).
        self.refused: list[tuple[str, bytes | None, KafkaError]] = []
        self.tracking = False
        # (topic, error) of a record the broker refused for want of rights: the transaction it
        # failed stops the process (AccessDenied), naming the topic, instead of rewinding to
        # produce it again forever.
        self.denied: tuple[str, KafkaError] | None = None

    def open(self) -> None:
        """Initialize the transactional producer: waits (bounded by the deadline) for the
        cluster, and fences any older holder of the transactional id."""
        finish(self.opening())

    def opening(self) -> Steps[None]:
        """`open`'s steps, for a driver of its own (see the module doc)."""
        if self.producer is None:
            self.producer = yield from self._new_producer()

    # -- producing ---------------------------------------------------------------------------

    def begin(self) -> None:
        finish(self._begin())

    def _begin(self) -> Steps[None]:
        if self.in_txn:
            return
        yield from self.opening()
        try:
            self.producer.begin_transaction()
        except KafkaException as exc:
            # Nothing is open, so nothing is lost: start over on a fresh producer.
            log.warning("begin_transaction: %s; rebuilding the producer", exc.args[0])
            self._drop(exc.args[0])
            yield from self.opening()
            self.producer.begin_transaction()
        self.in_txn = True

    def produce(self, topic: str, value: bytes | None, key: str | bytes | None,
                partition: int | None = None) -> None:
        """Produce inside the open transaction (begun if needed). Raises RecordRefused for a
        record the client refuses (the transaction stays good), Rewind when the producer failed."""
        if not self.in_txn:
            self.begin()
        part = -1 if partition is None else partition
        try:
            try:
                self.producer.produce(topic, value, key, part, headers=headers_for(value))
            except BufferError:  # local queue full: wait for room (backpressure)
                kafka.produce(self.producer, topic, value, key, partition)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() in _REFUSED:
                raise RecordRefused(f"{topic}: {err.str()}") from exc
            # Refused at once when the client's metadata already says so: name the topic, as
            # a refusal its delivery report brings does.
            raise_if_denied(err, self.settings.bootstrap_servers, f"topic {topic}")
            finish(self._failed(err, "produce"))

    # -- committing --------------------------------------------------------------------------

    def commit(self, offsets: list[TopicPartition], group_metadata: Callable[[], Any]
               ) -> Steps[None]:
        """The steps that commit what was produced with `offsets`, to be driven by the caller
        (`finish` when it has nothing to serve meanwhile); they raise Rewind when it could not."""
        if not offsets and not self.in_txn:
            return
        yield from self._begin()
        started = time.monotonic()
        sent = not offsets
        while True:
            try:
                if not sent:
                    yield from self._call("send_offsets_to_transaction",
                                          self.producer.send_offsets_to_transaction,
                                          offsets, group_metadata(), self._timeout())
                    sent = True
                yield from self._call("commit_transaction", self.producer.commit_transaction,
                                      self._timeout())
                break
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if self._classify(err) == "retry" and not self._expired(started, self.retry_s):
                    log.info("commit: %s; trying again", err)
                    yield from pause(0.2)
                    continue
                yield from self._failed(err, "commit")
        self.in_txn = False
        self.tracking = False  # the refused record's input is handled

    def abort(self) -> None:
        """Abort the open transaction (bounded); a producer that cannot is dropped."""
        finish(self._abort())

    def _abort(self) -> Steps[None]:
        if not self.in_txn or self.producer is None:
            self.in_txn = False
            return
        started = time.monotonic()
        while True:
            try:
                yield from self._call("abort_transaction", self.producer.abort_transaction,
                                      self._timeout())
                break
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if self._classify(err) == "retry" and not self._expired(started, self.retry_s):
                    yield from pause(0.2)
                    continue
                log.warning("abort: %s; dropping the producer", err)
                self._drop(err)
                break
        self.in_txn = False

    def _failed(self, err: KafkaError, call: str) -> Steps[None]:
        """Leave the failed transaction behind (abort, or rebuild) and tell the caller."""
        self.rewinds += 1
        if self._classify(err) == "rebuild":
            log.warning("%s: %s; dropping the producer and rewinding", call, err)
            self._drop(err)
        else:
            log.warning("%s: %s; aborting and rewinding", call, err)
            yield from self._abort()
        if self.denied is not None:
            topic, refusal = self.denied
            raise AccessDenied(str(problem(refusal, self.settings.bootstrap_servers,
                                           f"topic {topic}")))
        if err.code() in _REFUSED:
            # The broker refused a record; which one only delivery reports tell, and which
            # input it came from only the redo records (consume.deadletters.Poison).
            self.tracking = True
        raise Rewind(str(err))

    def _drop(self, err: KafkaError) -> None:
        """Let a failed producer go; `open` builds the next one."""
        old, self.producer = self.producer, None
        self.in_txn = False
        if old is not None:
            with _suppress_kafka():
                old.purge()
            close_bounded(old, self.call_timeout_s)
        if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                          KafkaError.INVALID_PRODUCER_EPOCH):
            self.fences.fenced(err)

    def _producer(self) -> Producer:
        # Reports of failed records only: no Python call per record delivered.
        return kafka.producer(self.settings, self.transactional_id,
                              **{"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                                 "delivery.report.only.error": True},
                              on_delivery=self._delivered)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        """Delivery report of a failed record: one refused for want of rights is kept in
        `denied`; while `tracking`, one the broker refused (e.g. over a topic's actual limit)
        is remembered, so the caller can tell which input's output failed its transaction."""
        if err is None:
            return
        if denied(err):
            self.denied = (msg.topic(), err)
        elif err.code() in _REFUSED and self.tracking:
            self.refused.append((msg.topic(), msg.key(), err))

    def _classify(self, err: KafkaError) -> str:
        return classify(err, self.settings.bootstrap_servers)

    def _new_producer(self) -> Steps[Producer]:
        """A producer with our transactional id, initialized (which fences older holders)."""
        producer = self._producer()
        started = time.monotonic()
        while True:
            try:
                self.producer = producer  # what a call that does not return abandons
                yield from self._call("init_transactions", producer.init_transactions,
                                      self._timeout())
                return producer
            except KafkaException as exc:
                err = exc.args[0]
                raise_if_denied(err, self.settings.bootstrap_servers,
                                f"transactional id {self.transactional_id}")
                if err.code() == KafkaError._FATAL and self.producer is None:
                    producer = self._producer()
                elif self._classify(err) != "retry":
                    raise
                if self._expired(started, None):
                    raise Stopped(f"init_transactions: {err}") from exc
                log.info("init_transactions: %s; trying again", err)
                yield from pause(0.5)
            finally:
                self.producer = None

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Steps[Any]:
        """One blocking transactional call (a `Call`), handed to the driver until it returns.
        Past HUNG_S, the deadline, or when the driver abandoned it, the producer is abandoned
        (never destroyed while the call runs; the next producer's initialization fences it)
        and a fatal error raised, so the caller rewinds on a new producer."""
        call = Call(what, fn, args)
        while True:
            yield call
            if call.returned:
                return call.result()
            elapsed = time.monotonic() - call.started
            if call.unwanted or elapsed > HUNG_S or self.deadline.passed():
                log.warning("%s did not return in %.0f s%s; abandoning the producer", what,
                            elapsed, " and is no longer wanted" if call.unwanted else "")
                self._abandoned.append(self.producer)
                self.producer = None
                self.in_txn = False
                raise KafkaException(KafkaError(KafkaError._FATAL, f"{what} did not return"))

    # -- bounds ------------------------------------------------------------------------------

    def _timeout(self) -> float:
        return self.deadline.timeout(self.call_timeout_s)

    def _expired(self, started: float, budget_s: float | None) -> bool:
        """The deadline has come, or `budget_s` has passed since `started`."""
        if self.deadline.passed():
            return True
        return budget_s is not None and time.monotonic() - started >= budget_s

    def committed(self, consumer: Consumer, partitions: list[TopicPartition]
                  ) -> list[TopicPartition]:
        """The group's committed offsets, retried while the cluster is unreachable (each try
        bounded by the call timeout); raises Stopped when the deadline comes first."""
        while True:
            try:
                return consumer.committed(partitions, timeout=self._timeout())
            except KafkaException as exc:
                if self.deadline.passed():
                    raise Stopped(str(exc)) from exc
                log.info("committed offsets: %s; trying again", exc.args[0])
                time.sleep(0.5)

    def close(self) -> None:
        """Abort what is open and let the producer go, all bounded."""
        if self.producer is None:
            return
        with _suppress_kafka():
            self.abort()
        if self.producer is not None:
            close_bounded(self.producer, self.call_timeout_s)


class _suppress_kafka:  # noqa: N801
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, KafkaException | Interrupt):
            log.info("ignored while closing: %s", exc)
            return True
        return False


def close_bounded(client: Producer | Consumer, timeout_s: float) -> bool:
    """Flush a producer or close a consumer, giving up after timeout_s (a cluster that does not
    answer must not keep a stopping process alive). True when it finished in time."""
    def close() -> None:
        try:
            if isinstance(client, Consumer):
                client.close()
            else:
                client.flush(timeout_s)
        except Exception as exc:  # noqa: BLE001 - a client that failed has nothing left to lose
            log.info("closing a Kafka client: %s", exc)

    thread = threading.Thread(target=close, name="kafka-close", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("closing a Kafka client took over %.0f s; leaving it", timeout_s)
        return False
    return True
