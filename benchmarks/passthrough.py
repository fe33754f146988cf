"""What the stage runtime costs on a real broker: a pass-through Stage on `StageRuntime`
(transactions, read_committed, exactly-once offsets) against the plain consume -> produce loop
anyone would write with confluent-kafka (auto commit, bytes forwarded).

Two pairs, each measured in the same run:
- stage_raw vs plain: a forwarding Stage (`input_record = None`: the Avro header is checked, the
  bytes are forwarded) against the loop forwarding bytes. This is the runtime's own cost.
- stage vs plain_avro: a Stage that decodes and re-encodes each event (what a real stage does)
  against the plain loop doing the same fastavro decode + encode.

Each design gets its own topics (a unique prefix, `create_topics`, 4 partitions) and group, and runs
in a thread of this process, one design at a time:
1. throughput, in rounds: the input topic is pre-filled with N small codec-encoded Task events, the
   design is started and a read_committed consumer counts its output until all N are there, then
   the design is stopped (the next round's instance resumes from the committed offsets).
   events/s = N / (time of the Nth committed output - time the design handled its first event),
   so group join and `init_transactions` are left out (reported separately as start-up).
2. latency: with the last instance still running and caught up, a producer sends Task events at a
   fixed low rate, each stamped with its send time (monotonic ns, in the event's metadata map,
   which every design carries through); the read_committed consumer computes send ->
   committed-output latency for each: one hop, including the producer, the broker twice and the
   commit interval.
Topics and groups are deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from benchmarks import percentiles_ms, print_table, write_result
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec
from rollstream.contracts.events import TASK
from rollstream.contracts.graph import COMPRESSION
from rollstream.runtime import EventContext, Output, Stage, StageRuntime

NAME = "passthrough"
PARTITIONS = 4
TARGET_RATIO = 0.5
# plain_avro is informational: the plain loop plus the Avro decode + encode a Stage always does,
# so stage / plain_avro isolates what the runtime itself (transactions, bookkeeping) costs.
DESIGNS = ("plain", "stage_raw", "plain_avro", "stage")


# -- the designs -----------------------------------------------------------------------------


class PassThrough(Stage):
    """Re-emits every Task event unchanged to the episodes topic (the minimum a stage does)."""

    name = "bench-passthrough"
    input_record = TASK

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.first_ns: int | None = None

    def input_topic(self) -> str:
        return self.topics.tasks

    def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        if self.first_ns is None:
            self.first_ns = time.monotonic_ns()
        return [Output(self.topics.episodes, event["task_id"], TASK, event)]


class Forward(PassThrough):
    """The same, forwarding the event's bytes (header checked, body not decoded)."""

    input_record = None

    def handle(self, event: bytes, ctx: EventContext) -> list[Output]:  # type: ignore[override]
        if self.first_ns is None:
            self.first_ns = time.monotonic_ns()
        return [Output(self.topics.episodes, b"", None, event)]


class StageDesign:
    def __init__(self, settings: Settings, raw: bool = False) -> None:
        self.stage = (Forward if raw else PassThrough)(settings)
        self.runtime = StageRuntime(self.stage, settings)

    @property
    def first_ns(self) -> int | None:
        return self.stage.first_ns

    def run(self) -> None:
        asyncio.run(self.runtime.serve())

    def stop(self) -> None:
        self.runtime.stop()


class PlainDesign:
    """consume -> produce with no transactions: auto-committed offsets, bytes forwarded as-is
    (or, with transcode, decoded and re-encoded with the codec like a Stage's events)."""

    def __init__(self, settings: Settings, transcode: bool = False) -> None:
        self.topics = settings.topics
        self.transcode = transcode
        self.consumer = Consumer({
            **settings.kafka(),
            "group.id": f"{settings.prefix}.bench-plain",
            "enable.auto.commit": True,
            "auto.offset.reset": "earliest",
        })
        # The same producer tuning the runtime uses (linger, compression, idempotence), minus the
        # transactional id, so the comparison isolates the runtime rather than client settings.
        self.producer = kafka.producer(settings)
        self.first_ns: int | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe([self.topics.tasks])
        out = self.topics.episodes
        c = codec()
        try:
            while not self._stop.is_set():
                msgs = fetch_batch(self.consumer, 500, 0.05)
                if msgs and self.first_ns is None:
                    self.first_ns = time.monotonic_ns()
                for m in msgs:
                    if m.error() is not None:
                        continue
                    value = m.value()
                    if self.transcode:
                        value = c.encode(TASK, c.decode_as(TASK, value))
                    kafka.produce(self.producer, out, value, key=m.key())
                self.producer.poll(0)
            self.producer.flush(30)
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self._stop.set()


Design = StageDesign | PlainDesign


# -- events ----------------------------------------------------------------------------------


def task_event(i: int, sent_ns: int | None = None) -> tuple[str, bytes]:
    """A small Task event (~130 bytes encoded), keyed by its task id."""
    task_id = f"bench-{i:08d}"
    meta = {"source": "benchmark"}
    if sent_ns is not None:
        meta["sent_ns"] = str(sent_ns)
    value = codec().encode(TASK, {
        "task_id": task_id,
        "env": "math",
        "prompt": f"What is {i} + {i % 97}? Answer with a number.",
        "data": f'{{"answer": {i + i % 97}}}',
        "group_size": 8,
        "max_turns": 1,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 64,
                     "seed": None},
        "metadata": meta,
        "created_at_ms": 1_760_000_000_000 + i,
    })
    return task_id, value


def prefill(conf: dict[str, Any], topic: str, n: int, first_id: int = 0) -> int:
    """Produce n events; returns the encoded size of one."""
    p = Producer({**conf, "linger.ms": 20, "compression.type": COMPRESSION})
    size = 0
    for i in range(first_id, first_id + n):
        key, value = task_event(i)
        size = len(value)
        kafka.produce(p, topic, value, key=key)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError(f"pre-filling {topic} did not finish")
    return size


def fetch_batch(consumer: Consumer, max_messages: int, timeout_s: float) -> list[Message]:
    """Wait up to timeout_s for one message, then take whatever else is already fetched.

    `consume(n, timeout)` waits until n messages *or* the timeout, so at low rates every message
    would wait for the timeout; this returns as soon as anything arrived.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, timeout=0)]


# -- measuring -------------------------------------------------------------------------------


def output_reader(conf: dict[str, Any], topic: str) -> Consumer:
    """read_committed, from the beginning: sees exactly what a downstream stage would."""
    c = Consumer({
        **conf,
        "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        # Answer fetches quickly so the reader adds little to the measured latency.
        "fetch.wait.max.ms": 10,
    })
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    # A new assignment takes ~0.3 s before its first fetch returns data; polling the (still
    # empty) topic first keeps that start-up out of the measured processing time.
    for _ in range(10):
        c.poll(0.1)
    return c


def count_until(reader: Consumer, n: int, timeout_s: float,
                alive: Callable[[], bool]) -> tuple[int, int]:
    """Consume until n messages were seen; returns (count, monotonic ns when the nth arrived)."""
    seen = 0
    deadline = time.monotonic() + timeout_s
    while seen < n and time.monotonic() < deadline and alive():
        for m in fetch_batch(reader, 1000, 0.1):
            if m.error() is None:
                seen += 1
    return seen, time.monotonic_ns()


def paced_producer(conf: dict[str, Any], topic: str, rate: float, count: int, first_id: int
                   ) -> None:
    """Send `count` events at a fixed rate, each stamped with its send time."""
    # linger.ms=0: the source sends at once, so the stamp is close to when the event leaves.
    p = Producer({**conf, "linger.ms": 0})
    # Connect and learn the topic's leaders first, or the first events wait for that.
    p.list_topics(topic, timeout=10)
    start = time.monotonic()
    for i in range(count):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        key, value = task_event(first_id + i, sent_ns=time.monotonic_ns())
        kafka.produce(p, topic, value, key=key)
        p.poll(0)
    p.flush(30)


def measure_latency(reader: Consumer, conf: dict[str, Any], topic: str, rate: float, count: int,
                    first_id: int, alive: Callable[[], bool]) -> list[int]:
    sender = threading.Thread(target=paced_producer, name="bench-paced-producer",
                              args=(conf, topic, rate, count, first_id), daemon=True)
    sender.start()
    c = codec()
    latencies: list[int] = []
    deadline = time.monotonic() + count / rate + 20
    while len(latencies) < count and time.monotonic() < deadline and alive():
        for m in fetch_batch(reader, 100, 0.05):
            now = time.monotonic_ns()
            if m.error() is not None:
                continue
            sent = c.decode_as(TASK, m.value())["metadata"].get("sent_ns")
            if sent is not None:
                latencies.append(now - int(sent))
    sender.join(5)
    return latencies


class Running:
    """A design serving in a thread; failures are kept to be raised in the main thread."""

    def __init__(self, name: str, settings: Settings) -> None:
        self.design: Design = (StageDesign(settings, raw=name == "stage_raw")
                               if name.startswith("stage")
                               else PlainDesign(settings, transcode=name == "plain_avro"))
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._target, name=f"bench-{name}", daemon=True)
        self.started_ns = time.monotonic_ns()
        self.thread.start()

    def _target(self) -> None:
        try:
            self.design.run()
        except BaseException as exc:  # reported in the result instead of a silent thread
            self.errors.append(exc)

    def stop(self) -> None:
        self.design.stop()
        self.thread.join(60)
        if self.errors:
            raise RuntimeError(f"design failed: {self.errors[0]!r}") from self.errors[0]


def run_design(name: str, conf: dict[str, Any], n: int, rounds: int, rate: float,
               latency_events: int, timeout_s: float) -> dict[str, Any]:
    """`rounds` throughput rounds (pre-fill n, start the design, count n outputs, stop it:
    the next instance resumes from the committed offsets), then the latency phase on the last."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}-{name}"
    settings = load(bootstrap_servers=conf["bootstrap.servers"], prefix=prefix,
                    partitions=PARTITIONS, kafka_properties=conf)
    create_topics(conf, prefix, PARTITIONS)
    reader: Consumer | None = None
    running: Running | None = None
    stats: Counter[str] = Counter()
    rates: list[float] = []
    startups: list[float] = []
    try:
        reader = output_reader(conf, settings.topics.episodes)
        lat: list[int] = []
        for r in range(rounds):
            event_bytes = prefill(conf, settings.topics.tasks, n, first_id=r * n)
            running = Running(name, settings)
            seen, last_ns = count_until(reader, n, timeout_s, running.thread.is_alive)
            if seen < n:
                running.stop()  # raises the design's own error if it has one
                raise RuntimeError(f"{name}: only {seen}/{n} events reached the output in "
                                   f"{timeout_s:.0f} s")
            first_ns = running.design.first_ns or last_ns
            rates.append(n / ((last_ns - first_ns) / 1e9))
            startups.append((first_ns - running.started_ns) / 1e9)
            if r == rounds - 1:
                lat = measure_latency(reader, conf, settings.topics.tasks, rate,
                                      latency_events, rounds * n, running.thread.is_alive)
            running.stop()
            if isinstance(running.design, StageDesign):
                stats.update(running.design.runtime.stats)
            running = None
        lat_stats = percentiles_ms(np.asarray(lat))
        return {
            "design": _describe(name, settings),
            "events_per_round": n,
            "rounds": rounds,
            "event_bytes": event_bytes,
            "events_per_s": round(float(np.median(rates)), 1),
            "events_per_s_rounds": [round(x, 1) for x in rates],
            "startup_s": round(float(np.median(startups)), 3),
            "latency": {
                "rate_per_s": rate,
                "sent": latency_events,
                "received": len(lat),
                "p50_ms": lat_stats.get("median_ms"),
                **lat_stats,
            },
            "runtime_stats": {k: v for k, v in stats.items() if not k.startswith("out:")}
                             if stats else None,
        }
    finally:
        if running is not None:
            with contextlib.suppress(Exception):
                running.stop()
        if reader is not None:
            reader.close()
        delete_topics(conf, prefix)
        _delete_groups(conf, [f"{prefix}.bench-plain", f"{prefix}.{PassThrough.name}"])


def _delete_groups(conf: dict[str, Any], groups: list[str]) -> None:
    """Leave no benchmark groups behind on a shared broker (the ones never used don't exist)."""
    admin = AdminClient(conf)
    for future in admin.delete_consumer_groups(groups, request_timeout=10).values():
        with contextlib.suppress(Exception):  # best effort: GROUP_ID_NOT_FOUND is expected
            future.result()


def _describe(name: str, settings: Settings) -> str:
    if name == "stage_raw":
        return (f"rollstream StageRuntime with a sync forwarding Stage (input_record=None: Avro "
                f"header checked, bytes forwarded); transactions, read_committed, "
                f"commit_interval_ms={settings.stage.commit_interval_ms}")
    if name == "stage":
        return (f"rollstream StageRuntime with a sync pass-through Stage (decode Task, emit it as "
                f"an Output, encode); transactions, read_committed, commit_interval_ms="
                f"{settings.stage.commit_interval_ms}, "
                f"max_in_flight={settings.stage.max_in_flight}")
    return ("confluent-kafka Consumer (enable.auto.commit; poll, then consume(499, 0) for what is "
            f"already fetched) -> Producer (linger.ms=5, {COMPRESSION}, idempotence, no "
            "transactions), "
            + ("value decoded and re-encoded with the codec" if name == "plain_avro"
               else "value bytes forwarded"))


def _broker_info(bootstrap: str) -> dict[str, Any]:
    bundled = local.is_running() and local.status().get("bootstrap") == bootstrap
    return {"bundled_local_broker": bundled,
            "kafka_version": local.kafka_version() if bundled else None}


def run(quick: bool = False) -> dict[str, Any]:
    bootstrap = local.resolve_bootstrap()
    # 200k events (~26 MB): more than a consumer prefetches while it joins its group, so the
    # rate is the steady state of fetching from the broker, not of a loop over prefetched
    # memory (with 50k events the plain loop measured ~500k/s that way, and ~165k/s here).
    n = 20_000 if quick else 200_000
    rate = 500.0
    latency_events = int(rate * (2 if quick else 5))
    rounds = 1 if quick else 3
    results = {d: run_design(d, {"bootstrap.servers": bootstrap}, n, rounds, rate,
                             latency_events, timeout_s=60) for d in DESIGNS}
    eps = {d: r["events_per_s"] for d, r in results.items()}
    ratio = round(eps["stage_raw"] / eps["plain"], 3)
    ratio_avro = round(eps["stage"] / eps["plain_avro"], 3)
    settings = load(bootstrap_servers=bootstrap)
    doc = {
        "quick": quick,
        "broker": _broker_info(bootstrap),
        "parameters": {
            "events_per_round": n,
            "rounds": rounds,
            "partitions": PARTITIONS,
            "event": f"codec-encoded Task, {results['stage']['event_bytes']} bytes",
            "stage_commit_interval_ms": settings.stage.commit_interval_ms,
            "stage_max_in_flight": settings.stage.max_in_flight,
            "latency_rate_per_s": rate,
            "latency_events": latency_events,
            "throughput": "per round: N / (Nth committed output seen by a read_committed "
                          "consumer - first event handled by the design), start-up reported "
                          "apart; events_per_s is the median over rounds",
            "latency": "paced producer (linger.ms=0) stamps monotonic send time into the event; "
                       "read_committed consumer (fetch.wait.max.ms=10) takes the difference "
                       "when the design's output arrives",
            "threads": "design in a thread of the benchmark process, reader in the main thread",
        },
        "results": results,
        "baseline": {"design": "plain", "events_per_s": eps["plain"],
                     "latency_p50_ms": results["plain"]["latency"]["p50_ms"],
                     "latency_p99_ms": results["plain"]["latency"].get("p99_ms")},
        "ratio": ratio,
        "ratio_meaning": "stage_raw events/s / plain events/s (1.0: the runtime costs nothing)",
        "ratio_stage_over_plain_avro": ratio_avro,
        "ratio_stage_over_plain": round(eps["stage"] / eps["plain"], 3),
        "ratio_plain_avro_over_plain": round(eps["plain_avro"] / eps["plain"], 3),
        "target": {"description": f"runtime pass-through >= {TARGET_RATIO} x the plain loop's "
                                  "events/s (stage_raw / plain; and stage / plain_avro when "
                                  "both decode)",
                   "ratio": ratio, "ratio_decoding": ratio_avro,
                   "met": ratio >= TARGET_RATIO and ratio_avro >= TARGET_RATIO},
    }
    path = write_result(NAME, doc)
    rows = [[d, r["events_per_s"], f"{r['events_per_s'] / eps['plain']:.2f}", r["startup_s"],
             r["latency"]["p50_ms"], r["latency"].get("p99_ms"), r["latency"]["received"]]
            for d, r in results.items()]
    print_table(f"passthrough: {rounds} x {n:,} events, {PARTITIONS} partitions; latency at "
                f"{rate:.0f}/s -> results/{path.name}",
                ["design", "events/s", "vs plain", "startup s", "lat p50 ms", "lat p99 ms",
                 "lat n"], rows)
    print(f"  target: stage_raw/plain {ratio:.3f}, stage/plain_avro {ratio_avro:.3f} >= "
          f"{TARGET_RATIO} -> {'MET' if doc['target']['met'] else 'NOT MET'}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
