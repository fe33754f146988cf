"""Two jobs' runtimes on one event loop (as in a fleet) on the real broker: while one job's
commit waits on the cluster, the other job's events go on and commit; the waiting job's events
produce nothing into the transaction being committed (what they emit meanwhile goes into the
next one), and both jobs' outputs are exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from rollstream import kafka
from rollstream.config import Settings, Topics, load
from rollstream.runtime import EventContext, Output, StageRuntime
from rollstream.topics import create_topics, delete_topics
from rollstream.transaction import HUNG_S, Steps
from tests.helpers.runtime_helpers import SlowEcho, policy_event, read_all

EVENTS = 150
HOLD_S = 3.0  # how long job A's commit is held: under HUNG_S, so it is waited on, not abandoned


class Checkpointing(SlowEcho):
    """Like RUN's episodes: emits a record midway (its checkpoint), then its output."""

    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        pace = 0.1 + 0.05 * (event["version"] % 7)  # events in flight at every commit
        await asyncio.sleep(pace)
        ctx.emit(Output(self.topics.scored, str(event["version"]), "PolicyVersion", event))
        await asyncio.sleep(pace)
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


@pytest.fixture
def other(bootstrap: str) -> Iterator[Settings]:
    """A second job's settings, under a prefix of its own."""
    topics = Topics(f"t{uuid.uuid4().hex[:8]}")
    create_topics(bootstrap, topics.prefix, partitions=4)
    yield load(bootstrap_servers=bootstrap, prefix=topics.prefix, partitions=4)
    delete_topics(bootstrap, topics.prefix)


def publish(settings: Settings) -> None:
    producer = kafka.producer(settings)
    for v in range(1, EVENTS + 1):
        kafka.produce(producer, settings.topics.policy, policy_event(v), key=str(v))
    producer.flush()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_commit_waiting_on_the_cluster_holds_up_only_its_own_job(
        settings: Settings, other: Settings) -> None:
    jobs = {"a": replace(settings, max_in_flight=8), "b": replace(other, max_in_flight=8)}
    for job in jobs.values():
        publish(job)
    a, b = (StageRuntime(Checkpointing(s), s, drain_timeout_s=5, shared=True, label=f"job {n}")
            for n, s in jobs.items())

    # Job A's commit_transaction, on its real producer, is held once A is under way, with
    # events in flight: a coordinator that does not answer for HOLD_S.
    held, release, returned = threading.Event(), threading.Event(), threading.Event()
    call = a.checkpoint._call

    def holding(what: str, fn: Callable[..., Any], *args: Any) -> Steps[Any]:
        if (what != "commit_transaction" or held.is_set() or a.stats["processed"] < 10
                or a.in_flight < 4):
            return call(what, fn, *args)

        def held_then(*call_args: Any) -> Any:
            release.wait(HUNG_S)
            try:
                return fn(*call_args)
            finally:
                returned.set()

        held.set()
        return call(what, held_then, *args)

    a.checkpoint._call = holding  # type: ignore[method-assign]

    # Any record job A's events produce while its commit is out would land in the committed
    # (or a closed) transaction.
    into_commit: list[str] = []
    produce = a.checkpoint.produce

    def watched(topic: str, *args: Any, **kwargs: Any) -> None:
        if held.is_set() and not returned.is_set():
            into_commit.append(topic)
        produce(topic, *args, **kwargs)

    a.checkpoint.produce = watched  # type: ignore[method-assign]

    async def serve() -> None:
        await asyncio.gather(a.serve(), b.serve())

    thread = threading.Thread(target=lambda: asyncio.run(serve()))
    thread.start()
    try:
        assert held.wait(60), f"job A never committed: {a.stats}"
        at_hold = Counter(b.stats)
        time.sleep(HOLD_S)
        during = Counter(b.stats) - at_hold
        kept = len(a._emitted or [])
        release.set()
        wait_until(lambda: all(r.stats["processed"] >= EVENTS for r in (a, b)),
                   "both jobs' events")
    finally:
        release.set()
        a.stop()
        b.stop()
        thread.join(60)
    assert not thread.is_alive()

    # B went on while A's commit was out: its events finished and were committed.
    assert during["processed"] >= 10 and during["commits"] >= 3, during
    # A's events went on too, and what they emitted meanwhile was kept, not produced.
    assert kept > 0
    assert into_commit == []
    for name, runtime in (("a", a), ("b", b)):
        assert runtime.stats["rewinds"] == 0, (name, runtime.stats)
        topics = jobs[name].topics
        for topic in (topics.scored, topics.trajectories):
            keys = Counter(int(m.key()) for m in read_all(jobs[name], topic, 4))
            assert keys == Counter(range(1, EVENTS + 1)), (name, topic)
