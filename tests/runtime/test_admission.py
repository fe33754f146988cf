"""INIT's admission control follows the trainer's progress on <p>.policy (real broker)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rollstream.admission import AdmissionGate
from rollstream.cluster import kafka
from rollstream.config import Settings
from tests.helpers.runtime_helpers import publish_version


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def started(gate: AdmissionGate) -> AdmissionGate:
    assert gate.follower.caught_up.wait(30), "the gate never read <p>.policy to its end"
    return gate


@contextmanager
def full_gate(settings: Settings, stall_s: float, startup_s: float) -> Iterator[AdmissionGate]:
    """A started gate with a window of 2, both places taken."""
    gate = started(AdmissionGate(settings, window=2, stall_s=stall_s, startup_s=startup_s))
    try:
        gate.admit("t0")
        gate.admit("t1")
        yield gate
    finally:
        gate.close()


def test_capacity_is_the_window_beyond_what_the_trainer_consumed(settings: Settings) -> None:
    gate = AdmissionGate(settings, window=3, stall_s=60)
    try:
        assert started(gate).capacity() == 3
        for i in range(3):
            gate.admit(f"t{i}")
        assert gate.capacity() == 0  # the tasks partitions get paused
        publish_version(settings, 1, consumed=2)
        wait_for(lambda: gate.capacity() == 2)
        publish_version(settings, 0, consumed=99)  # an older version changes nothing
        time.sleep(0.5)
        assert gate.capacity() == 2
    finally:
        gate.close()


def test_a_task_let_in_again_after_a_rewind_is_counted_once(settings: Settings) -> None:
    gate = started(AdmissionGate(settings, window=2, stall_s=60))
    try:
        gate.admit("t0")
        gate.admit("t0")  # its input redone: the transaction that let it in had failed
        assert gate.capacity() == 1
    finally:
        gate.close()


def test_a_starting_trainer_is_not_taken_for_a_stalled_one(settings: Settings) -> None:
    with full_gate(settings, stall_s=0.3, startup_s=60) as gate:
        time.sleep(0.4)
        assert gate.capacity() == 0  # no step yet: past stall_s, within startup_s


def test_a_stalled_trainer_gets_one_more_window(settings: Settings) -> None:
    with full_gate(settings, stall_s=0.3, startup_s=0.3) as gate:
        assert gate.capacity() == 0
        time.sleep(0.4)
        assert gate.capacity() == 2  # no progress for stall_s: the loop must not deadlock


def test_a_new_version_is_progress_though_no_more_groups_were_consumed(
        settings: Settings) -> None:
    # A trainer working through groups its bridge took earlier publishes versions whose count
    # does not move; taking it for a stalled one would let windows in that end up stale.
    with full_gate(settings, stall_s=1.0, startup_s=1.0) as gate:
        time.sleep(1.1)  # past the patience, but not asked yet
        publish_version(settings, 1, consumed=0)
        wait_for(lambda: gate.follower.version == 1)
        assert gate.capacity() == 0


def test_time_without_work_in_flight_is_no_stall(settings: Settings) -> None:
    gate = started(AdmissionGate(settings, window=2, stall_s=1.0, startup_s=1.0))
    try:
        time.sleep(1.1)  # the trainer is starting and no task has come yet
        gate.admit("t0")
        gate.admit("t1")
        assert gate.capacity() == 0  # the clock started with the first task
    finally:
        gate.close()


def test_samples_still_arriving_are_no_stall(settings: Settings) -> None:
    # Slow rollouts: the window waits while samples are scored, and gets its extra window once
    # they stop and the trainer took no step.
    producer = kafka.producer(settings)
    with full_gate(settings, stall_s=2.0, startup_s=2.0) as gate:
        until = time.monotonic() + 4.0
        while time.monotonic() < until:
            kafka.produce(producer, settings.topics.scored, b"a sample", key="t#0")
            producer.flush()
            assert gate.capacity() == 0
            time.sleep(0.2)
        wait_for(lambda: gate.capacity() == 2)


def test_extra_windows_end_at_the_next_version(settings: Settings) -> None:
    # A trainer that dropped whole windows reports them all with its next version: were the
    # extra windows kept, that many tasks would be let in at once, all sampled by one policy.
    with full_gate(settings, stall_s=0.3, startup_s=0.3) as gate:
        time.sleep(0.4)
        assert gate.capacity() == 2  # stalled: one more window
        gate.admit("t2")
        gate.admit("t3")
        publish_version(settings, 1, consumed=3)
        wait_for(lambda: gate.follower.version == 1)
        assert gate.capacity() == 1  # 1 of 4 in flight; the extra window is gone


def test_a_restarted_gate_counts_from_what_the_trainer_had_consumed(settings: Settings) -> None:
    publish_version(settings, 7, consumed=50)
    gate = AdmissionGate(settings, window=3, stall_s=60)
    try:
        assert started(gate).capacity() == 3  # not 3 + 50
        for i in range(3):
            gate.admit(f"t{i}")
        assert gate.capacity() == 0
        publish_version(settings, 8, consumed=52)
        wait_for(lambda: gate.capacity() == 2)
    finally:
        gate.close()
