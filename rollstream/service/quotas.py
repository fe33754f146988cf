"""A job's quotas on a shared fleet: episodes in flight, sandboxes open at once, turns per
second, tasks queued.

The fleet (rollstream.service.fleet) builds each job's JobQuotas from the job's record (its `job`
is replaced when the record changes, so a new quota counts at once) and hands it to the job's
stage as it builds it: INIT counts the tasks it takes, RUN paces its turns (rollstream.turns.Turns)
and RUN and EVAL open their sandboxes under it (rollstream.sandbox.Sandboxes). Outside a fleet
there are none.

A job at a quota is paused, never dropped: the runtime's room for new events (`room`, given to
StageRuntime as its `limit`) drops to 0, the job's partitions pause and its events wait in the
log. Quota 0 means none.

- quota_episodes: RUN's episodes of the job in flight over the fleet (rollstream.service.fairshare
  applies it to the jobs sharing the servers; here it also bounds a job with servers of its
  own). Each RUN process takes its `portion`: the parts of the job's episodes partitions it
  holds, which add up to the quota over the fleet.
- quota_sandboxes: the job's sandboxes open at once on this host (its processes sharing one
  sandbox root), RUN's and EVAL's together. Each holds one of the job's numbered slots, a lock
  file under the sandbox root (`<root>/quotas/<job prefix>/<n>.lock`; flock, so the slots of a
  killed process free themselves); creating a sandbox waits for a free slot. RUN and EVAL take
  a new event only while a slot is left for it: each counts its events in flight as sandboxes
  (an episode or a scoring opens at most one at a time), plus the slots held elsewhere.
- quota_turns_per_s: RUN's sampled turns of the job over the fleet, paced in each RUN process
  at the quota times its share of the job's episodes partitions (so processes together never
  pace above it): each turn waits (asleep) until 1/rate after the previous one's moment (a
  token bucket holding one token). RUN takes the job's episodes one at a time, and none while
  the next turn has to wait: it would only wait too, holding an inference slot the other jobs
  could use.
- quota_tasks_queued: tasks INIT has expanded whose episodes RUN has not finished (waiting or
  in flight): RUN's lag on the job's `<p>.episodes` (records past RUN's committed offsets,
  uncommitted ones too, read every PROBE_S), divided by the group size of the job's last task,
  plus the tasks INIT took that the reading may not count yet (those of the VISIBLE_S before
  it, and since). INIT takes no task of the job at the quota.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from functools import cached_property
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.events import Job
from rollstream.sandbox.leases import sandbox_root

log = logging.getLogger("rollstream.service.quotas")

PROBE_S = 0.5  # how often INIT reads RUN's lag on the job's episodes
VISIBLE_S = 1.0  # by when the episodes of a task INIT took are on the broker
SLOT_WAIT_S = 0.1  # how often a sandbox waiting for a slot looks again (slots free elsewhere)
HELD_S = 0.2  # how long a count of the slots held is used before it is made again
# Up to this many offsets of lag are read to count them exactly (transaction markers take
# offsets too); beyond, the offsets are the count.
EXACT_LIMIT = 20_000


def portion(quota: int, held: Collection[int], count: int) -> int:
    """The part of a fleet-wide `quota` that falls to a process holding partitions `held` of
    the `count` of its input topic. Partition p's part is quota // count, plus one for the first
    quota % count partitions, so the parts of all partitions add up to the quota. A process's
    part is never under 1, so its partitions never starve: a fleet can then go over the quota,
    by at most one per process, and only when the quota is under the partition count. The whole
    quota while the count is not known yet (a process's first poll); 0 (none) stays 0."""
    if not quota or not count:
        return quota
    base, extra = divmod(quota, count)
    return max(1, sum(base + (p < extra) for p in held))


def rate_share(held: Collection[int], count: int) -> float:
    """The fraction of a fleet-wide rate that a process holding partitions `held` of `count`
    paces at (one partition's, holding none; 1 while the count is not known)."""
    return max(len(held), 1) / count if count else 1.0


class Slot:
    """One of a job's sandbox slots, held until `release`."""

    def __init__(self, owner: SandboxSlots, fd: int) -> None:
        self._owner, self._fd = owner, fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the lock
            self._fd = -1
            self._owner.held -= 1


class SandboxSlots:
    """A job's sandbox slots on this host: lock files, one per slot, shared by its processes."""

    def __init__(self, job_prefix: str, root: str) -> None:
        """`root`: the sandbox root setting (SandboxSettings.root) the slots live under."""
        self.job_prefix = job_prefix
        self.root = root
        self.held = 0  # slots held by this runtime
        self._counted = (0.0, 0)  # (when, slots held by anyone)

    @cached_property
    def directory(self) -> Path:
        # At first use: a stage that opens no sandbox (INIT) never makes the sandbox root.
        return sandbox_root(self.root) / "quotas" / self.job_prefix

    def _path(self, n: int) -> Path:
        return self.directory / f"{n}.lock"

    def _try(self, n: int) -> int | None:
        """The locked slot's file descriptor, or None when another holds it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path(n), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    async def acquire(self, quota: Callable[[], int]) -> Slot | None:
        """A free slot of the first `quota()`, read again at each look (the job may change);
        None once the job has no quota."""
        while count := quota():
            for n in range(count):
                fd = self._try(n)
                if fd is not None:
                    self.held += 1
                    return Slot(self, fd)
            await asyncio.sleep(SLOT_WAIT_S)
        return None

    def in_use(self, quota: int) -> int:
        """Slots held by anyone (this runtime too), counted at most every HELD_S."""
        now = time.monotonic()
        if now - self._counted[0] >= HELD_S:
            taken = 0
            for n in range(quota):
                fd = self._try(n)
                if fd is None:
                    taken += 1
                else:
                    os.close(fd)
            self._counted = (now, taken)
        return self._counted[1]


class QueueProbe:
    """RUN's lag on the job's episodes, read in a thread every PROBE_S: `reading` is (lag in
    episodes, INIT's tasks taken that the lag surely counts), None until the first one."""

    def __init__(self, settings: Settings, taken: Callable[[], int]) -> None:
        self.reading: tuple[int, int] | None = None
        self._topic = settings.topics.episodes
        self._taken = taken
        # Never joins RUN's group: its id is only for RUN's committed offsets. Uncommitted
        # records count (INIT's own, not yet committed, are queued too).
        self._consumer = Consumer({**settings.kafka(), "group.id": settings.topics.group("run"),
                                   "enable.auto.commit": False,
                                   "isolation.level": "read_uncommitted"})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="queue-probe", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        # INIT's tasks taken at past readings' starts: a task taken shortly before a reading
        # may not be on the broker yet (its records still on their way, in a transaction
        # being opened), so only those taken VISIBLE_S before are taken as counted in the lag.
        taken: deque[tuple[float, int]] = deque()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                taken.append((now, self._taken()))
                while len(taken) > 1 and taken[1][0] <= now - VISIBLE_S:
                    taken.popleft()
                visible = taken[0][1] if taken[0][0] <= now - VISIBLE_S else 0
                try:
                    self.reading = (self._lag(), visible)
                except KafkaException as exc:  # the broker is away: the last reading stands
                    log.info("reading RUN's lag on %s: %s", self._topic, exc)
                self._stop.wait(PROBE_S)
        finally:
            self._consumer.close()

    def _lag(self) -> int:
        meta = self._consumer.list_topics(self._topic, timeout=10).topics[self._topic]
        parts = [TopicPartition(self._topic, p) for p in sorted(meta.partitions)]
        spans = {}  # partition -> (first offset past RUN's committed, end)
        for tp in self._consumer.committed(parts, timeout=10):
            low, high = kafka.watermarks(self._consumer, TopicPartition(self._topic, tp.partition))
            if high > max(tp.offset, low):
                spans[tp.partition] = (max(tp.offset, low), high)
        upper = sum(high - start for start, high in spans.values())
        return self._count(spans) if upper <= EXACT_LIMIT else upper

    def _count(self, spans: dict[int, tuple[int, int]]) -> int:
        """The records in each partition's span: the offsets less the transaction markers (a
        consumer never hands those out), so a job's quota is not eaten by its markers."""
        if not spans:
            return 0
        self._consumer.assign([TopicPartition(self._topic, p, start)
                               for p, (start, _) in spans.items()])
        try:
            count, left = 0, dict(spans)
            deadline = time.monotonic() + PROBE_S * 4
            while left and time.monotonic() < deadline:
                for msg in self._consumer.consume(500, timeout=0.1):
                    if msg.error() is None and msg.partition() in left:
                        count += msg.offset() < left[msg.partition()][1]
                for tp in self._consumer.position([TopicPartition(self._topic, p)
                                                   for p in left]):
                    if tp.offset >= left[tp.partition][1]:
                        del left[tp.partition]
            # Not read to the end in time: the rest count as offsets (never too few).
            for tp in self._consumer.position([TopicPartition(self._topic, p) for p in left]):
                start, high = left[tp.partition]
                count += high - max(start, tp.offset)
            return count
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        """Stop reading; the thread ends (and closes its client) without being waited for, as
        the fleet's loop must not block on a slow cluster call."""
        self._stop.set()


class JobQuotas:
    """The quotas of one job's runtime of one stage (`stage`: init, run or eval; the fleet
    builds them before the stage they are handed to, and names the stage once it is built)."""

    def __init__(self, job: Job, settings: Settings, stage: str = "") -> None:
        self.job = job
        self.stage = stage
        self.settings = settings
        self.slots = SandboxSlots(job["prefix"], settings.sandbox.root)
        self._next_turn = 0.0  # when the next turn may be sampled
        self._taken = 0  # tasks INIT took
        self._group_size = 1  # of the last task INIT took
        self._probe: QueueProbe | None = None
        # The job's input partitions this process holds, and their count (the fleet sets it to
        # its runtime's): a fleet-wide quota is applied here at this process's part of it.
        self.holding: Callable[[], tuple[Collection[int], int]] = lambda: ((), 0)

    @property
    def name(self) -> str:
        """The job's name (it labels the job's sandboxes)."""
        return self.job["name"]

    def room(self, in_flight: int) -> int | None:
        """How many more events the job's runtime may take now; None: no quota limits it."""
        if self.stage == "init":
            return self._queue_room()
        rooms = [r for r in (self._episode_room(in_flight), self._sandbox_room(in_flight),
                             self._turn_room()) if r is not None]
        return min(rooms, default=None)

    def episode_quota(self) -> int:
        """This process's portion of the job's quota_episodes; 0: none."""
        if self.stage != "run":
            return 0
        return portion(self.job["quota_episodes"], *self.holding())

    def _episode_room(self, in_flight: int) -> int | None:
        """RUN's episodes of the job in flight. The fair share applies it too; this is also
        the bound of a job with servers of its own, which is outside the share."""
        quota = self.episode_quota()
        return max(0, quota - in_flight) if quota else None

    def _sandbox_room(self, in_flight: int) -> int | None:
        quota = self.job["quota_sandboxes"]
        if not quota or self.stage not in ("run", "eval"):
            return None
        elsewhere = max(0, self.slots.in_use(quota) - self.slots.held)
        return max(0, quota - in_flight - elsewhere)

    def _turn_room(self) -> int | None:
        """At most one more episode per look (not one in flight: its episodes take turns at
        the pace), and none while the job's next turn must wait: an episode taken then would
        only wait too, holding an inference slot the other jobs could use."""
        if self.stage != "run" or self.job["quota_turns_per_s"] <= 0:
            return None
        return 0 if self._next_turn > time.monotonic() else 1

    # -- tasks queued (INIT) -----------------------------------------------------------------

    def _queue_room(self) -> int | None:
        quota = self.job["quota_tasks_queued"]
        if not quota:
            return None
        if self._probe is None:
            self._probe = QueueProbe(self.settings, lambda: self._taken)
        reading = self._probe.reading
        if reading is None:
            return 0  # what is queued is not known yet
        lag, taken_then = reading
        queued = math.ceil(lag / self._group_size) + self._taken - taken_then
        return max(0, quota - queued)

    def took(self, group_size: int) -> None:
        """INIT expanded a task of the job into `group_size` episodes."""
        self._taken += 1
        self._group_size = max(1, group_size)

    # -- turns per second (RUN) --------------------------------------------------------------

    async def turn(self) -> None:
        """Wait until the job may sample its next turn."""
        rate = self.job["quota_turns_per_s"] * rate_share(*self.holding())
        if rate <= 0:
            return
        now = time.monotonic()
        at = max(now, self._next_turn)
        self._next_turn = at + 1 / rate  # reserved before the wait: waiters queue up in order
        if at > now:
            await asyncio.sleep(at - now)

    # -- sandboxes (RUN, EVAL) ---------------------------------------------------------------

    async def sandbox_slot(self) -> Slot | None:
        """A slot for one more of the job's sandboxes, waited for; None: no quota."""
        return await self.slots.acquire(lambda: self.job["quota_sandboxes"])

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
