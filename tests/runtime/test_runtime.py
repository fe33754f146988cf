"""The stage runtime on the real broker: exactly-once with out-of-order work, DLQ, restarts."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.cluster.offsets import decode_done
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.runtime import EventContext, Output, StageRuntime
from tests.helpers.runtime_helpers import (
    SlowEcho,
    policy_event,
    read_all,
    run_until,
    send_versions,
)


def test_out_of_order_work_is_committed_exactly_once(settings: Settings) -> None:
    # One partition so the hanging event 0 holds the watermark while later events finish.
    send_versions(settings, range(40))

    first = StageRuntime(SlowEcho(settings), settings, drain_timeout_s=0.5)
    run_until(first, lambda: first.stats["processed"] >= 39)

    committed = kafka.consumer(settings, first.group).committed(
        [TopicPartition(settings.topics.policy, 0)], timeout=10)[0]
    assert committed.offset == 0  # event 0 never finished
    assert decode_done(0, committed.metadata) == set(range(1, 40))
    assert len(read_all(settings, settings.topics.trajectories, 4)) == 39

    second = StageRuntime(FastEcho(settings), settings)
    run_until(second, lambda: second.stats["processed"] + second.stats["skipped"] >= 40)
    assert second.stats["processed"] == 1 and second.stats["skipped"] == 39
    keys = sorted(int(m.key()) for m in read_all(settings, settings.topics.trajectories, 4))
    assert keys == list(range(40))  # each output exactly once


class FastEcho(SlowEcho):
    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


class GatedEcho(SlowEcho):
    """SlowEcho whose events past version 0 finish only once `gate` is set."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.gate = threading.Event()

    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        while event["version"] and not self.gate.is_set():
            await asyncio.sleep(0.01)
        return await super().handle(event, ctx)


def test_a_drain_whose_last_commit_is_fenced_commits_none_of_its_offsets(
        settings: Settings) -> None:
    """Events that finish while the stage drains, in a transaction that is then fenced (here a
    newer instance of the transactional id; a drain longer than the transaction timeout is
    fenced alike): leaving the group must not commit their offsets, whose outputs the fenced
    transaction took with it. The next owner redoes them, and every output exists once."""
    send_versions(settings, range(20))
    stage = GatedEcho(settings)
    first = StageRuntime(stage, settings, drain_timeout_s=3)
    drain = first._drain

    async def open_then_drain() -> None:
        # Events 1..19 finish in the drain (event 0 never does). Opened from the test's thread
        # at stop, they finished while the loop still served: a CI run's periodic commit met
        # the fence there and rewound, and the drain had nothing left to finish.
        stage.gate.set()
        await drain()

    first._drain = open_then_drain  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: asyncio.run(first.serve()))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while first.in_flight < 20:
            assert time.monotonic() < deadline, f"{first.in_flight} of 20 events started"
            time.sleep(0.05)
        kafka.producer(settings, first.transaction.transactional_id).init_transactions(30)
    finally:
        first.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert first.stats["processed"] == 19

    committed = kafka.consumer(settings, first.group).committed(
        [TopicPartition(settings.topics.policy, 0)], timeout=10)[0]
    assert decode_done(max(committed.offset, 0), committed.metadata) == set()
    assert read_all(settings, settings.topics.trajectories, 4) == []

    second = StageRuntime(FastEcho(settings), settings)
    run_until(second, lambda: second.stats["processed"] >= 20)
    keys = sorted(int(m.key()) for m in read_all(settings, settings.topics.trajectories, 4))
    assert keys == list(range(20))


def test_bad_events_go_to_the_dead_letter_topic_and_the_stage_keeps_going(
        settings: Settings) -> None:
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.policy, b"not avro", key="a")
    kafka.produce(producer, settings.topics.policy, codec().encode("Task", {
        "task_id": "t", "env": "arithmetic", "prompt": "?"}), key="b")  # wrong record type
    kafka.produce(producer, settings.topics.policy, policy_event(-1), key="c")  # invalid
    kafka.produce(producer, settings.topics.policy, policy_event(5), key="d")
    producer.flush()

    runtime = StageRuntime(SlowEcho(settings), settings)
    run_until(runtime, lambda: runtime.stats["processed"] >= 4)

    letters = [codec().decode_as("DeadLetter", m.value())
               for m in read_all(settings, settings.topics.dlq, 4)]
    reasons = {dl["source_offset"]: dl["reason"] for dl in letters}
    assert reasons[0].startswith("undecodable: not Avro")
    assert "expected a PolicyVersion event, got Task" in reasons[1]
    assert reasons[2] == "invalid: negative version"
    assert all(dl["source_topic"] == settings.topics.policy for dl in letters)
    by_offset = {dl["source_offset"]: dl for dl in letters}
    assert by_offset[0]["value"] == b"not avro" and by_offset[0]["key"] == b"a"  # bytes kept
    outputs = read_all(settings, settings.topics.trajectories, 4)
    assert [m.key() for m in outputs] == [b"5"]


def test_backpressure_bounds_in_flight_work(settings: Settings) -> None:
    settings = settings.override(max_in_flight=5)
    send_versions(settings, range(1, 200))
    runtime = StageRuntime(SlowEcho(settings), settings)
    peak = 0

    original = runtime._reap

    def reap_and_measure() -> None:
        nonlocal peak
        peak = max(peak, len(runtime._tasks))
        original()

    runtime._reap = reap_and_measure  # type: ignore[method-assign]
    run_until(runtime, lambda: runtime.stats["processed"] >= 199)
    assert 1 <= peak <= 5


class Steady(SlowEcho):
    """Every event takes 50 ms: in flight stays full while the backlog lasts."""

    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        await asyncio.sleep(0.05)
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


@pytest.mark.parametrize("fetch_buffer", [0, 7])
def test_the_fetch_buffer_holds_events_ready_beside_those_in_flight(
        settings: Settings, fetch_buffer: int) -> None:
    settings = settings.override(max_in_flight=5, fetch_buffer=fetch_buffer)
    send_versions(settings, range(1, 120))
    runtime = StageRuntime(Steady(settings), settings)
    peaks = {"in_flight": 0, "held": 0}
    original = runtime._reap

    def reap_and_measure() -> None:
        peaks["in_flight"] = max(peaks["in_flight"], runtime.in_flight)
        peaks["held"] = max(peaks["held"], runtime.in_flight + runtime.waiting)
        original()

    runtime._reap = reap_and_measure  # type: ignore[method-assign]
    run_until(runtime, lambda: runtime.stats["processed"] >= 119)
    assert peaks["in_flight"] == 5  # the bound on work, whatever the buffer
    if fetch_buffer:
        assert 5 < peaks["held"] <= 5 + fetch_buffer  # events waited, ready, beside them
    else:
        assert peaks["held"] == 5


class OneAtATime(SlowEcho):
    """Capacity for one event while none is in flight; notes on which capacity ask each event
    started and which ask first said 1 again after an event finished (it may finish between
    two asks: the runtime's events go on while its commit is out)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.busy = False
        self.freed = False  # an event finished since the last ask
        self.asks = 0
        self.opened: list[int] = []  # asks that said 1 first after an event finished
        self.started: list[int] = []  # the last ask before each event started

    def capacity(self) -> int | None:
        self.asks += 1
        if not self.busy and self.freed:
            self.opened.append(self.asks)
            self.freed = False
        return 0 if self.busy else 1

    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        self.started.append(self.asks)
        self.busy = True
        await asyncio.sleep(0.05)
        self.busy = False
        self.freed = True
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


def test_events_fetched_wait_for_capacity_and_start_the_moment_it_comes_back(
        settings: Settings) -> None:
    """A stage without capacity keeps the events already fetched instead of pausing (the client
    drops a paused partition's fetched events and, resumed, fetches again only after up to its
    fetch wait): each event starts on the very capacity ask that says 1 again."""
    send_versions(settings, range(1, 11))
    stage = OneAtATime(settings)
    runtime = StageRuntime(stage, settings)
    run_until(runtime, lambda: runtime.stats["processed"] >= 10)
    assert len(stage.started) == 10
    # Event i+1 starts on the ask that said 1 after event i: from the third on every one was
    # waiting by then.
    assert stage.started[2:] == stage.opened[1:9], (stage.started, stage.opened)


class TakesASlot(SlowEcho):
    """Capacity for two events; an event takes its slot in its first step, before it awaits,
    as RUN pins a server, and holds it about as long as a commit is out."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.busy = 0
        self.most = 0

    def capacity(self) -> int | None:
        return max(0, 2 - self.busy)

    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        self.busy += 1
        self.most = max(self.most, self.busy)
        try:
            await asyncio.sleep(0.002 * (event["version"] % 5))
        finally:
            self.busy -= 1
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


def test_events_started_in_one_pass_count_against_capacity_in_the_next(
        settings: Settings) -> None:
    """Events that finish while a commit is out are reaped in the pass that starts the next
    ones: that pass still lets the new ones take their slots before the next capacity ask
    (the runtime asked again at once, and RUN's servers took 4 episodes at a cap of 2)."""
    settings = settings.override(commit_interval_ms=20)
    send_versions(settings, range(1, 301))
    stage = TakesASlot(settings)
    runtime = StageRuntime(stage, settings)
    run_until(runtime, lambda: runtime.stats["processed"] >= 300, timeout=120)
    assert stage.most == 2
