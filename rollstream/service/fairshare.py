"""Weighted, work-conserving fair share of RUN's in-flight episodes between the jobs of a fleet.

`allowances` says how many more episodes each job may start now, from the fleet's slots (the
shared inference servers' episodes at their caps) and each job's demand. It is pure. A fleet
asks it through a `Plan`: one water-filling per round of the jobs' asks (each job's runtime asks
once per pass of the loop, Stage.capacity), which each job's taking of episodes then draws
down, so N jobs cost one water-filling instead of N and one free slot is never handed out twice.

- Free slots go one at a time to the job that wants work (input is waiting) with the fewest
  episodes in flight per unit of weight: backlogged jobs converge on their weights' shares
  (with few slots, as near as whole episodes allow). A tie goes to the job that has received
  the least service per unit of weight (episodes started, its virtual time), never by name: a
  share that is not a whole number of slots (10 slots at weights 1:2:1) alternates between the
  tied jobs and averages out, instead of one job keeping the extra slot for good.
- Work-conserving: a job that wants nothing leaves its share to the others.
- Quota (episodes in flight): a job at it gets 0; its partitions pause, nothing is dropped.
- Priority only orders who takes free slots: a higher priority takes them first; it never
  preempts, running episodes are never stopped to make room.
- A job that wants nothing (its last look found no input) may still start one episode while
  it is below its weight's share of the slots, so that new input is seen even when the others
  fill the fleet: at most one episode per such job beyond the slots, and the slots that free up
  next go to it first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Demand:
    weight: float
    in_flight: int
    wants: bool  # input is waiting (its last poll filled what it asked for)
    quota: int = 0  # episodes in flight at most; 0: none
    priority: int = 0
    started: int = 0  # episodes the job has started so far: its service, for ties
    ready: bool = True  # events it fetched wait to start (wanting, it may have none yet)


def allowances(slots: int, demands: Mapping[str, Demand],
               served: Mapping[str, float] | None = None) -> dict[str, int]:
    """How many more episodes each job may start now; `served`: the episodes each job has
    started so far, which break ties (none: all equal)."""
    served = served or {}
    free = max(0, slots - sum(d.in_flight for d in demands.values()))
    room = {j: max(0, d.quota - d.in_flight) if d.quota else slots
            for j, d in demands.items()}
    out = dict.fromkeys(demands, 0)

    def key(j: str) -> tuple[int, float, float, float, str]:
        # Highest priority, then fewest in flight per weight, then least service per weight
        # (the name only makes the order total).
        d = demands[j]
        return (-d.priority, (d.in_flight + out[j]) / d.weight,
                (served.get(j, 0.0) + out[j]) / d.weight, -d.weight, j)

    # Water-filling, a slot at a time.
    queue = [key(j) for j, d in demands.items() if d.wants and room[j]]
    heapq.heapify(queue)
    while free and queue:
        j = heapq.heappop(queue)[-1]
        out[j] += 1
        free -= 1
        if out[j] < room[j]:
            heapq.heappush(queue, key(j))
    active = sum(d.weight for d in demands.values() if d.wants or d.in_flight)
    for j, d in demands.items():
        below_share = d.in_flight * (active + (0 if d.in_flight else d.weight)) < slots * d.weight
        if not d.wants and below_share:
            out[j] = min(room[j], 1)
    return out


class Plan:
    """The allowances of one round of asks, shared by every job.

    A plan is made at the first ask and kept until a job asks a second time (the next pass of
    the loop), a job not in it asks, or a job the plan gives nothing more asks with fewer
    episodes in flight than the plan counted (one of them ended): the slot it freed is then
    handed out at once, by weight, instead of a pass later by the next plan. Within a plan a
    job may start what it was allotted less what it started since (its in-flight count above
    the plan's): each job's in-flight count stays within the plan's plus its allotment, so the
    fleet's stays within the slots, however the asks and episodes interleave.

    The plan keeps each job's service, the episodes it started (its `started` count's rise:
    counted, not inferred from its in-flight count, which an episode that ends as another
    starts leaves unchanged), for the ties; a job new to it, or one with no event ready to
    start now, is kept at no less than the least service per weight of the jobs that have, as a
    flow that returns takes the current virtual time in fair queueing, so that it does not
    win every tie until it has caught up with jobs that ran while it had nothing to do.
    """

    def __init__(self, slots: Callable[[], int],
                 demands: Callable[[], Mapping[str, Demand]]) -> None:
        self.slots = slots
        self.demands = demands
        self.made = 0  # plans made so far
        self._base: Mapping[str, Demand] = {}
        self._allotted: dict[str, int] = {}
        self._asked: set[str] = set()
        self.served: dict[str, float] = {}  # episodes started, by job

    def allowance(self, job: str, in_flight: int) -> int:
        """How many more episodes `job`, with `in_flight` episodes now, may start now."""
        if (job in self._asked or job not in self._base
                or (in_flight < self._base[job].in_flight and not self._left(job, in_flight))):
            self._make()
        self._asked.add(job)
        return self._left(job, in_flight)

    def _left(self, job: str, in_flight: int) -> int:
        """What the plan lets `job` start yet: its allotment less what it started since."""
        base = self._base.get(job)
        if base is None:
            return 0
        return max(0, self._allotted[job] - max(0, in_flight - base.in_flight))

    def _make(self) -> None:
        base = self.demands()
        served = {}
        for j, d in base.items():
            before = self._base.get(j)
            if j in self.served and before is not None:
                served[j] = self.served[j] + max(0, d.started - before.started)
        # The fleet's virtual time: the least service per weight of the jobs with events ready
        # to start. A job new to the plan, or with none ready now, is brought up to it: what
        # it did not take while it had nothing to start is no credit, or a job back from idle
        # (or slow to fetch, or topped up in bursts) would win every tie until the others'
        # lead was spent.
        busy = [served[j] / base[j].weight for j in served if base[j].wants and base[j].ready]
        least = min(busy or [served[j] / base[j].weight for j in served], default=0.0)
        self.served = {j: served[j] if j in served and d.wants and d.ready
                       else max(served.get(j, 0.0), least * d.weight)
                       for j, d in base.items()}
        self._base = base
        self._allotted = allowances(self.slots(), base, self.served)
        self._asked.clear()
        self.made += 1
