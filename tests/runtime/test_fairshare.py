"""The fleet's fair share of RUN's episodes (rollstream.fairshare): weighted, work-conserving,
quotas respected, priority first to free slots without preemption."""

from __future__ import annotations

from dataclasses import replace

from rollstream.fairshare import Demand, allowances


def fill(slots: int, demands: dict[str, Demand]) -> dict[str, int]:
    """Each job takes, in turn, what it is allowed (as runtimes on one loop do) until none may
    take more; the jobs' episodes in flight then."""
    demands = dict(demands)
    for _ in range(slots * 4):
        took = False
        for job in demands:
            allowed = allowances(slots, demands)[job]
            if allowed and demands[job].wants:
                demands[job] = replace(demands[job], in_flight=demands[job].in_flight + allowed)
                took = True
        if not took:
            break
    return {j: d.in_flight for j, d in demands.items()}


def test_backlogged_jobs_get_their_weights_share() -> None:
    jobs = {"a": Demand(1, 0, True), "b": Demand(2, 0, True), "c": Demand(1, 0, True)}
    assert fill(8, jobs) == {"a": 2, "b": 4, "c": 2}
    assert fill(100, jobs) == {"a": 25, "b": 50, "c": 25}


def test_a_job_that_does_not_use_its_share_leaves_it_to_the_others() -> None:
    jobs = {"a": Demand(1, 0, True), "b": Demand(2, 0, True), "idle": Demand(1, 0, False)}
    in_flight = fill(12, jobs)
    assert in_flight == {"a": 4, "b": 8, "idle": 0}  # every slot used
    # The idle job may still look for work (one episode), below its share of 3.
    now = {j: replace(d, in_flight=in_flight[j]) for j, d in jobs.items()}
    assert allowances(12, now) == {"a": 0, "b": 0, "idle": 1}


def test_slots_freed_go_to_the_job_furthest_below_its_share() -> None:
    # b took everything while a was idle; a now wants work.
    demands = {"a": Demand(1, 1, True), "b": Demand(1, 7, True)}
    assert allowances(8, demands) == {"a": 0, "b": 0}  # full: nobody is preempted
    demands["b"] = replace(demands["b"], in_flight=5)  # two of b's episodes finished
    assert allowances(8, demands) == {"a": 2, "b": 0}
    demands["b"] = replace(demands["b"], in_flight=2)
    assert allowances(8, demands) == {"a": 3, "b": 2}  # then even again


def test_few_slots_are_still_shared() -> None:
    assert fill(2, {"a": Demand(1, 0, True), "b": Demand(2, 0, True)}) == {"a": 1, "b": 1}
    assert fill(3, {"a": Demand(1, 0, True), "b": Demand(2, 0, True)}) == {"a": 1, "b": 2}


def test_a_job_at_its_quota_gets_nothing_and_its_share_goes_to_the_others() -> None:
    jobs = {"a": Demand(1, 0, True, quota=3), "b": Demand(1, 0, True)}
    assert fill(10, jobs) == {"a": 3, "b": 7}
    assert allowances(10, {"a": Demand(1, 3, True, quota=3), "b": Demand(1, 2, True)})["a"] == 0


def test_priority_takes_free_slots_first_but_never_preempts() -> None:
    demands = {"low": Demand(1, 0, True), "high": Demand(1, 4, True, priority=1)}
    assert allowances(10, demands) == {"low": 0, "high": 6}
    # A full fleet: priority starts nothing until slots free up.
    assert allowances(4, {"low": Demand(1, 4, True), "high": Demand(1, 0, True, priority=9)}
                      ) == {"low": 0, "high": 0}
    # Its quota reached, the rest goes to the lower priority.
    demands = {"low": Demand(1, 0, True), "high": Demand(1, 4, True, quota=6, priority=1)}
    assert allowances(10, demands) == {"low": 4, "high": 2}


def test_no_slots_or_no_jobs() -> None:
    assert allowances(0, {"a": Demand(1, 0, True)}) == {"a": 0}
    assert allowances(8, {}) == {}
