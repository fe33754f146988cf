"""Two jobs' runtimes on one event loop (as in a fleet) on the real broker: while one job's
checkpoint waits on the cluster (its commit, or its new producer after a failed transaction),
the other job's events go on and commit; the waiting job's events produce nothing into the
transaction being committed (what they emit meanwhile goes into the next one), and both jobs'
outputs are exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.cluster.transaction import HUNG_S, Steps, Transaction
from rollstream.config import Settings, Topics, load
from rollstream.runtime import EventContext, Output, StageRuntime
from tests.helpers.runtime_helpers import SlowEcho, policy_event, read_all

EVENTS = 150
HOLD_S = 3.0  # how long job A's call is held: under HUNG_S, so it is waited on, not abandoned


class Checkpointing(SlowEcho):
    """Like RUN's episodes: emits a record midway (its checkpoint), then its output."""

    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        pace = 0.1 + 0.05 * (event["version"] % 7)  # events in flight at every commit
        await asyncio.sleep(pace)
        ctx.emit(Output(self.topics.scored, str(event["version"]), "PolicyVersion", event))
        await asyncio.sleep(pace)
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


class Hold:
    """Holds the first call `what` of a transaction's real producer once `when()` holds: a
    coordinator that does not answer until `release` (HUNG_S at most)."""

    def __init__(self, transaction: Transaction, what: str, when: Callable[[], bool]) -> None:
        self.held, self.release, self.returned = (threading.Event(), threading.Event(),
                                                  threading.Event())
        call = transaction._call

        def holding(name: str, fn: Callable[..., Any], *args: Any) -> Steps[Any]:
            if name != what or self.held.is_set() or not when():
                return call(name, fn, *args)

            def held_then(*call_args: Any) -> Any:
                self.release.wait(HUNG_S)
                try:
                    return fn(*call_args)
                finally:
                    self.returned.set()

            self.held.set()
            return call(name, held_then, *args)

        transaction._call = holding  # type: ignore[method-assign]

    def out(self) -> bool:
        return self.held.is_set() and not self.returned.is_set()


def publish(job: Settings, versions: range) -> None:
    producer = kafka.producer(job)
    for v in versions:
        kafka.produce(producer, job.topics.policy, policy_event(v), key=str(v))
    producer.flush()


@pytest.fixture
def jobs(settings: Settings, bootstrap: str) -> Iterator[dict[str, Settings]]:
    """Two jobs' settings, each under a prefix of its own: job A's input published, and the
    first half of job B's (b_during publishes the rest)."""
    other = Topics(f"t{uuid.uuid4().hex[:8]}")
    create_topics(bootstrap, other.prefix, partitions=4)
    found = {"a": settings.override(max_in_flight=8),
             "b": load(bootstrap_servers=bootstrap, prefix=other.prefix, partitions=4,
                       max_in_flight=8)}
    publish(found["a"], range(1, EVENTS + 1))
    publish(found["b"], range(1, EVENTS // 2 + 1))
    yield found
    delete_topics(bootstrap, other.prefix)


def runtimes(jobs: dict[str, Settings]) -> tuple[StageRuntime, StageRuntime]:
    a, b = (StageRuntime(Checkpointing(s), s, drain_timeout_s=5, shared=True, label=f"job {n}")
            for n, s in jobs.items())
    return a, b


@contextmanager
def on_one_loop(*served: StageRuntime) -> Iterator[None]:
    async def serve() -> None:
        await asyncio.gather(*(r.serve() for r in served))

    thread = threading.Thread(target=lambda: asyncio.run(serve()))
    thread.start()
    try:
        yield
    finally:
        for runtime in served:
            runtime.stop()
        thread.join(60)
    assert not thread.is_alive()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def b_during(b: StageRuntime, hold: Hold) -> Counter[str]:
    """What job B did while job A's call was held for HOLD_S, given the second half of its
    input then: B has work during the hold however long A took to reach it (on a busy machine
    B had finished all its events before A's new producer was held)."""
    assert hold.held.wait(60), "job A's call was never made"
    publish(b.settings, range(EVENTS // 2 + 1, EVENTS + 1))
    before = Counter(b.stats)
    time.sleep(HOLD_S)
    return Counter(b.stats) - before


def outputs(settings: Settings, topic: str) -> Counter[int]:
    return Counter(int(m.key()) for m in read_all(settings, topic, 4))


def assert_exactly_once(job: Settings, topic: str) -> None:
    assert outputs(job, topic) == Counter(range(1, EVENTS + 1)), topic


def test_a_commit_waiting_on_the_cluster_holds_up_only_its_own_job(
        jobs: dict[str, Settings]) -> None:
    a, b = runtimes(jobs)
    # Job A's commit_transaction is held once A is under way, with events in flight.
    hold = Hold(a.transaction, "commit_transaction",
                lambda: a.stats["processed"] >= 10 and a.in_flight >= 4)
    # Any record job A's events produce while its commit is out would land in the committed
    # (or a closed) transaction.
    into_commit: list[str] = []
    produce = a.transaction.produce

    def watched(topic: str, *args: Any, **kwargs: Any) -> None:
        if hold.out():
            into_commit.append(topic)
        produce(topic, *args, **kwargs)

    a.transaction.produce = watched  # type: ignore[method-assign]

    with on_one_loop(a, b):
        try:
            during = b_during(b, hold)
            kept = len(a._emitted or [])
        finally:
            hold.release.set()
        wait_until(lambda: all(r.stats["processed"] >= EVENTS for r in (a, b)),
                   "both jobs' events")

    # B went on while A's commit was out: its events finished and were committed.
    assert during["processed"] >= 10 and during["commits"] >= 3, during
    # A's events went on too, and what they emitted meanwhile was kept, not produced.
    assert kept > 0
    assert into_commit == []
    assert a.stats["rewinds"] == b.stats["rewinds"] == 0
    for job in jobs.values():
        assert_exactly_once(job, job.topics.scored)
        assert_exactly_once(job, job.topics.trajectories)


def test_a_new_producer_waiting_on_the_cluster_holds_up_only_its_own_job(
        jobs: dict[str, Settings]) -> None:
    a, b = runtimes(jobs)
    # Another producer takes job A's transactional id once A is under way: A's transaction
    # fails, and the initialization of its new producer is held.
    fenced = threading.Event()
    hold = Hold(a.transaction, "init_transactions", fenced.is_set)

    with on_one_loop(a, b):
        wait_until(lambda: a.stats["processed"] >= 10, "job A under way")
        fenced.set()  # first: A may fail and start its new producer before this returns
        kafka.producer(jobs["a"], a.transaction.transactional_id).init_transactions(10)
        try:
            during = b_during(b, hold)
        finally:
            hold.release.set()
        wait_until(lambda: all(outputs(jobs[n], jobs[n].topics.trajectories)
                               == Counter(range(1, EVENTS + 1)) for n in jobs),
                   "both jobs' outputs")

    assert during["processed"] >= 10 and during["commits"] >= 3, during
    assert a.stats["rewinds"] >= 1 and b.stats["rewinds"] == 0
    for job in jobs.values():
        assert_exactly_once(job, job.topics.trajectories)
    assert_exactly_once(jobs["b"], jobs["b"].topics.scored)
    # A's events in flight at the fence are redone from their start, so their midway record
    # (a checkpoint: state, not an output) may be there twice; none is missing.
    assert set(outputs(jobs["a"], jobs["a"].topics.scored)) == set(range(1, EVENTS + 1))
