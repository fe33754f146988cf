"""The fleet's fair share of RUN's episodes (rollstream.service.fairshare): weighted,
work-conserving, quotas respected, priority first to free slots without preemption; one plan per
round of asks."""

from __future__ import annotations

import random
from dataclasses import replace

from rollstream.service.fairshare import Demand, Plan, allowances


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


def test_one_plan_per_round_of_asks_and_never_more_than_the_slots() -> None:
    """8 jobs ask in turn, in shuffled order, take what they are allowed and finish episodes at
    random: a water-filling per round (a job asking again starts the next) and one more where a
    job the plan gave nothing freed a slot, never one per ask of every job, and the fleet never
    holds more episodes than its slots."""
    slots = 300
    weights = {f"j{i}": 1.0 + i % 3 for i in range(8)}
    in_flight = dict.fromkeys(weights, 0)
    plan = Plan(lambda: slots, lambda: {j: Demand(w, in_flight[j], True)
                                        for j, w in weights.items()})
    rng = random.Random(7)
    rounds = 200
    for _ in range(rounds):
        order = list(weights)
        rng.shuffle(order)
        for job in order:
            in_flight[job] -= sum(rng.random() < 0.1 for _ in range(in_flight[job]))
            in_flight[job] += plan.allowance(job, in_flight[job])
            assert sum(in_flight.values()) <= slots
    # A round ends when a job asks again (with a shuffled order that may be before every job
    # asked, never before two did), or a job left nothing by its plan freed a slot.
    assert rounds <= plan.made < rounds * len(weights)
    assert sum(in_flight.values()) >= slots * 0.8  # still handed out: work-conserving
    share = in_flight["j2"] / in_flight["j0"]  # weights 3 and 1
    assert 2.0 <= share <= 4.0, in_flight


def test_a_plan_is_drawn_down_by_what_a_job_took_and_a_freed_slot_is_handed_out_at_once(
        ) -> None:
    in_flight = {"a": 0, "b": 0}
    plan = Plan(lambda: 8, lambda: {j: Demand(1, n, True) for j, n in in_flight.items()})
    assert plan.allowance("a", 0) == 4
    assert plan.allowance("b", 2) == 2  # b started 2 since the plan was made: 2 of its 4 left
    assert plan.allowance("c", 0) == 0  # a job outside the share
    in_flight.update(a=4, b=4)
    plan = Plan(lambda: 8, lambda: {j: Demand(1, n, True) for j, n in in_flight.items()})
    assert plan.allowance("a", 4) == 0
    in_flight["b"] = 3  # one of b's episodes ended after the plan was made
    assert plan.allowance("b", 3) == 1  # a new plan, from the counts now, hands b that slot
    assert plan.allowance("a", 4) == 0  # not a second time
    assert plan.made == 2
    # The slot freed goes by weight, not to the job that freed it: a is above its share.
    in_flight.update(a=5, b=3)
    plan = Plan(lambda: 8, lambda: {j: Demand(1, n, True) for j, n in in_flight.items()})
    assert plan.allowance("a", 5) == 0
    in_flight["a"] = 4
    assert plan.allowance("a", 4) == 0
    assert plan.allowance("b", 3) == 1


def test_ties_go_to_the_least_served_job_not_the_first_name() -> None:
    """10 slots at weights 1:2:1: a and c tie for the tenth. Ties broken by name gave a 3 slots
    and c 2 for good (30/50/20); by service received the tenth alternates and the shares
    average out to the weights'."""
    weights = {"a": 1.0, "b": 2.0, "c": 1.0}
    in_flight = dict.fromkeys(weights, 0)
    started = dict.fromkeys(weights, 0)
    plan = Plan(lambda: 10, lambda: {j: Demand(w, in_flight[j], True, started=started[j])
                                     for j, w in weights.items()})
    rng = random.Random(11)
    held = dict.fromkeys(weights, 0)
    rounds = 4000
    for _ in range(rounds):
        for job in weights:  # the loop's fixed order: a always asks first
            in_flight[job] -= sum(rng.random() < 0.1 for _ in range(in_flight[job]))
            more = plan.allowance(job, in_flight[job])
            in_flight[job] += more
            started[job] += more
        for job in weights:
            held[job] += in_flight[job]
    shares = {j: n / sum(held.values()) for j, n in held.items()}
    assert abs(shares["a"] - 0.25) <= 0.02 and abs(shares["c"] - 0.25) <= 0.02, shares
    assert abs(shares["b"] - 0.5) <= 0.02, shares
    # Within one water-filling too: the less served of two tied jobs takes the odd slot.
    tied = {"a": Demand(1, 0, True), "c": Demand(1, 0, True)}
    assert allowances(3, tied, served={"a": 5, "c": 4}) == {"a": 1, "c": 2}
    assert allowances(3, tied, served={"a": 4, "c": 5}) == {"a": 2, "c": 1}


def test_a_job_new_to_the_plan_starts_at_the_others_service_not_at_zero() -> None:
    in_flight = {"a": 0}
    started = {"a": 0}
    plan = Plan(lambda: 4, lambda: {j: Demand(1, n, True, started=started.get(j, 0))
                                    for j, n in in_flight.items()})
    for _ in range(3):  # a runs alone for a while: 4 episodes started, ended, started again
        in_flight["a"] = plan.allowance("a", 0)
        started["a"] += in_flight["a"]
        plan.allowance("a", in_flight["a"])  # the next plan sees them started
        in_flight["a"] = 0
    assert plan.served["a"] == 12
    in_flight["new"] = 0
    plan.allowance("a", 0)
    assert plan.served["new"] == plan.served["a"] == 12


def test_service_counts_an_episode_that_ends_as_another_starts() -> None:
    """Service is the episodes a job started, not its in-flight count's rise: a job whose
    episode ended as its next one started has been served, and loses the next tie to one that
    was not (counted by the rise, a looked unserved and took the odd slot again by name)."""
    in_flight = {"a": 1, "c": 1}
    started = {"a": 1, "c": 1}
    plan = Plan(lambda: 3, lambda: {j: Demand(1, in_flight[j], True, started=started[j])
                                    for j in in_flight})
    assert plan.allowance("a", 1) == 1  # the odd slot: a tie, both unserved
    started["a"] += 1  # a starts it, and one of its episodes ends meanwhile
    assert plan.allowance("c", 1) == 0
    plan.allowance("a", 1)  # a asks again (still 1 in flight): the next plan
    assert plan.served["a"] == plan.served["c"] + 1
    assert plan.allowance("c", 1) == 1  # the odd slot goes to c, served less


def test_a_job_with_nothing_to_do_gains_no_credit_for_the_ties() -> None:
    """A job idle while another was served comes back at the other's service, not behind it
    (behind, it would win every tie until it had caught up with service it never wanted)."""
    in_flight = {"busy": 0, "idle": 0}
    started = {"busy": 0, "idle": 0}
    wants = {"busy": True, "idle": False}
    plan = Plan(lambda: 3, lambda: {j: Demand(1, in_flight[j], wants[j], started=started[j])
                                    for j in in_flight})
    for _ in range(5):  # busy runs: 3 started, 3 ended, each round
        more = plan.allowance("busy", 0)
        started["busy"] += more
        plan.allowance("busy", 0)
    assert plan.served["busy"] >= 12 and plan.served["idle"] == plan.served["busy"]
    wants["idle"] = True
    in_flight["busy"] = 1
    plan.allowance("busy", 1)
    assert plan.served["idle"] == plan.served["busy"]  # back at the busy job's service


def test_a_job_with_no_event_ready_gains_no_credit_either() -> None:
    """Wanting (input seen lately) but with nothing fetched to start is idle for the ties."""
    in_flight = {"busy": 0, "slow": 0}
    started = {"busy": 0, "slow": 0}
    plan = Plan(lambda: 2, lambda: {j: Demand(1, in_flight[j], True, started=started[j],
                                              ready=j == "busy") for j in in_flight})
    for _ in range(4):
        more = plan.allowance("busy", 0)
        started["busy"] += more
        plan.allowance("busy", 0)
    assert plan.served["slow"] == plan.served["busy"] > 0
