"""Kafka client set-up shared by every stage: one place for the librdkafka settings we rely on."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from rollstream.cluster.kafka_errors import ErrorWatch
from rollstream.config import Settings
from rollstream.contracts.codec import headers_for
from rollstream.contracts.graph import COMPRESSION

log = logging.getLogger("rollstream.cluster.kafka")
T = TypeVar("T")


def process_id(settings: Settings, role: str) -> str:
    """A stable id when configured (static membership, fast fencing on restart), else unique.
    `role` starts with the topic prefix (`settings.topics.group(...)`): a principal's ACLs
    cover the groups and transactional ids under its prefix only."""
    if settings.service.instance_id:
        return f"{role}.{settings.service.instance_id}"
    return f"{role}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def _watch(settings: Settings) -> ErrorWatch:
    """The default error_cb: an unreachable broker is logged every few seconds, a refused
    login stops the process (AccessDenied)."""
    return ErrorWatch(settings.bootstrap_servers, stop_on_denied=True)


def consumer(settings: Settings, group: str, **extra: Any) -> Consumer:
    conf: dict[str, Any] = {
        **settings.kafka(),
        "error_cb": _watch(settings),
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        # Bound the prefetch so a slow stage does not buffer the topic in memory, but fetch
        # big enough batches that trajectories (tens to hundreds of KiB each) stream quickly.
        "queued.max.messages.kbytes": 16384,
        "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "max.poll.interval.ms": 300000,
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 1000,
    }
    if settings.service.instance_id:
        conf["group.instance.id"] = f"{group}.{settings.service.instance_id}"
    conf.update(extra)
    return Consumer(conf)


def producer(settings: Settings, transactional_id: str | None = None, **extra: Any) -> Producer:
    conf: dict[str, Any] = {
        **settings.kafka(),
        "error_cb": _watch(settings),
        "linger.ms": 5,
        # Room for bursts (a stage emits between commits); memory is still capped by
        # queue.buffering.max.kbytes.
        "queue.buffering.max.messages": 1_000_000,
        "compression.type": COMPRESSION,  # the topics' own: brokers store batches as written
        "message.max.bytes": 16 * 1024 * 1024,
        "enable.idempotence": True,
        # Java's partitioner: a key lands on the same partition as from a Java or Streams client.
        "partitioner": "murmur2_random",
    }
    if transactional_id:
        conf["transactional.id"] = transactional_id
        # A crashed process's open transaction blocks read_committed readers until it times
        # out (or a restart with the same id fences it): keep that window short.
        conf["transaction.timeout.ms"] = 15000
    conf.update(extra)
    return Producer(conf)


def produce(p: Producer, topic: str, value: bytes | None, key: str | bytes | None = None,
            partition: int | None = None,
            on_delivery: Callable[[KafkaError | None, Message], None] | None = None) -> None:
    """Produce, waiting for room when the local queue is full (backpressure, not an error)."""
    part = -1 if partition is None else partition  # -1: let the partitioner choose
    extra = {} if on_delivery is None else {"on_delivery": on_delivery}
    while True:
        try:
            p.produce(topic, value, key, part, headers=headers_for(value), **extra)
            return
        except BufferError:
            p.poll(0.05)


@contextmanager
def transaction(p: Producer, commit_timeout_s: float = 60) -> Iterator[Producer]:
    """One producer-only transaction (publish, replay, redrive): committed when the block ends,
    aborted if it raises, so no open transaction holds back read_committed readers."""
    p.begin_transaction()
    try:
        yield p
        p.commit_transaction(commit_timeout_s)
    except BaseException:
        p.abort_transaction(30)
        raise


def start_at_committed(c: Consumer, committed: list[TopicPartition]) -> None:
    """In an on_assign callback: fetch the assigned partitions from the committed offsets the
    caller has already read (the earliest where none is), instead of letting the client ask for
    them once more. When that second ask meets a coordinator that has just moved (a request-level
    NOT_COORDINATOR), the client never starts fetching the partition (librdkafka issue 5586):
    a chaos run's RUN sat idle on four partitions after a broker was killed."""
    c.incremental_assign([TopicPartition(tp.topic, tp.partition,
                                         tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                          for tp in committed])


def reader(settings: Settings, partitions: list[TopicPartition], **extra: Any) -> Consumer:
    """A consumer that reads the given partitions (from their offsets), committed data only,
    outside any consumer group: for following or inspecting a topic, never for sharing work.

    It rides out broker restarts and leader moves by itself (the client reconnects and resumes
    at its position); errors it reports meanwhile are not fatal, and readers skip them."""
    c = Consumer({
        **settings.kafka(),
        # Required though never joined; under the prefix, where its principal may use groups.
        "group.id": f"{settings.prefix}.reader-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        **extra,
    })
    c.assign(partitions)
    return c


def whole_topic(settings: Settings, topic: str) -> list[TopicPartition] | None:
    """Every partition of `topic` from its beginning; None if the topic does not exist."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient(settings.kafka()).list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    return [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]


# How long a read waits, once it has what is readable, for records below the end it set out to
# reach: a commit returns before its markers are on every partition (milliseconds), and a live
# writer's open transaction commits within its commit interval. A killed writer's transaction is
# not waited for (it is aborted after transaction.timeout.ms).
SETTLE_S = 2.0


def read_partitions(settings: Settings, partitions: list[TopicPartition],
                    timeout_s: float = 60.0, settle_s: float = SETTLE_S) -> Iterator[Message]:
    """Read the given partitions from their offsets to their end, committed data only.

    The end is each partition's high watermark when the call starts. A read_committed reader
    stops earlier, at the last stable offset, while a transaction there is unresolved: the read
    goes on for up to `settle_s` for it to resolve, then ends where it is."""
    if not partitions:
        return
    ends = _high_watermarks(settings, partitions)
    c = reader(settings, partitions, **{"enable.partition.eof": True})
    try:
        remaining = {(tp.topic, tp.partition) for tp in partitions}
        stopped: dict[tuple[str, int], float] = {}  # when each partition had nothing more to read
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {sorted(remaining)} did not reach the end")
            for msg in c.consume(500, timeout=0.05):
                err = msg.error()
                if err is None:
                    yield msg
                elif err.code() == KafkaError._PARTITION_EOF:
                    stopped.setdefault((msg.topic(), msg.partition()), time.monotonic())
                elif err.fatal() or err.code() in (KafkaError._UNKNOWN_TOPIC,
                                                   KafkaError._UNKNOWN_PARTITION):
                    raise KafkaException(err)
                else:  # a broker restarting or a leader moving: the client retries
                    log.info("reading %s: %s", msg.topic(), err)
            for key in [k for k in remaining if k in stopped]:
                end = ends[key]
                if (end is None or c.position([TopicPartition(*key)])[0].offset >= end
                        or time.monotonic() - stopped[key] > settle_s):
                    remaining.discard(key)
    finally:
        c.close()


def _high_watermarks(settings: Settings,
                     partitions: list[TopicPartition]) -> dict[tuple[str, int], int | None]:
    """Each partition's end counting unresolved transactions; None when the read starts at or
    past it (nothing to wait for)."""
    probe = Consumer({**settings.kafka(), "isolation.level": "read_uncommitted",
                      "group.id": f"{settings.prefix}.probe-{uuid.uuid4().hex[:8]}"})
    try:
        ends = {}
        for tp in partitions:
            low, high = watermarks(probe, TopicPartition(tp.topic, tp.partition))
            ends[(tp.topic, tp.partition)] = high if high > max(low, tp.offset) else None
        return ends
    finally:
        probe.close()


# What a lookup answers while a leader or coordinator moves, or a broker still loads. The client
# raises these with the `retriable` flag unset, so the codes are listed.
TRANSIENT = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
})


def retrying(call: Callable[[], T], timeout_s: float = 30.0) -> T:
    """`call()`, made again while it raises a transient KafkaException, until `timeout_s` has
    passed; then its last error is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if not (err.retriable() or err.code() in TRANSIENT) or time.monotonic() > deadline:
                raise
            log.info("retrying after %s", err)
        time.sleep(0.5)


def transactional_producer(settings: Settings, transactional_id: str, timeout_s: float = 30.0,
                           **extra: Any) -> Producer:
    """A producer with its transactions initialized, made anew while the transaction
    coordinator moves or loads: a broker just started answered NOT_COORDINATOR, and a producer
    whose initialization had failed so kept failing (for 30 s in a CI run)."""
    def initialized() -> Producer:
        made = producer(settings, transactional_id, **extra)
        made.init_transactions(timeout_s)
        return made

    return retrying(initialized, timeout_s * 2)


def watermarks(c: Consumer, tp: TopicPartition, timeout_s: float = 10.0) -> tuple[int, int]:
    """A partition's (low, high) offsets as its leader has them now, asked again while the leader
    moves."""
    return retrying(lambda: c.get_watermark_offsets(tp, timeout=timeout_s, cached=False))
