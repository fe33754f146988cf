"""Admission control: INIT lets a task into the pipeline only while the work in flight fits what
the trainer can take within the staleness bound.

The trainer publishes, with every PolicyVersion, how many groups it is done with (trained or
dropped). INIT admits a task while `admitted - consumed < window`; otherwise its capacity is 0
and the runtime pauses the tasks partitions: backpressure through Kafka, the tasks wait in the
log. Rollouts therefore never run more than `window` groups ahead of training, whatever the
speed of the stages. If the trainer makes no progress (no new version) and no sample reaches
<p>.scored for three times what the trainer recently took to step once the samples stopped (at
least `stall_s`: every group of a window was dropped for lack of reward variance, so no step
was taken and no version published), one more window is let in, so the loop cannot stall.
Scaling the wait with the trainer's own step time keeps a slow (busy) trainer from being taken
for a stalled one; waiting for the scored samples to stop keeps slow rollouts from being taken
for one. Every new version is progress,
also one whose count of consumed groups did not move. Before the trainer's first step the wait
is `startup_s` (30 s): a trainer that is still loading is not a stalled one either. The wait
starts when work enters an empty pipeline, not before: time without tasks is no stall. Every
extra window is sampled by a policy the trainer will have left behind when it gets there (the
bridge's staleness bound drops it) and brings the rest of the tasks forward to older policies:
the rule must fire on real stalls only.
Extra windows last until the trainer's next version: its count then says what is really in
flight, and letting the extra windows stay would, once that count catches up on groups it had
dropped, let all of them in at once, every one sampled by the same policy.
INIT counts the groups in flight from what the trainer had consumed when the gate started (the
newest committed version, read before any task is let in): a restarted INIT assumes an empty
pipeline and may let up to one window more in. A task let in again because its input was redone
(a transaction that failed, a broker restart) is counted once: each counted id is remembered
for a while.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque

from confluent_kafka import KafkaException, TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.events import PolicyVersion
from rollstream.dedup import RecentIds
from rollstream.policy_versions import PolicyReader

# The PolicyVersion metric in which the trainer (trainer_bridge.train_loop) reports the groups
# it is done with: the one place this name is defined.
CONSUMED = "groups_consumed"

log = logging.getLogger("rollstream.admission")

SCORED_CHECK_S = 0.5  # how often the end offsets of <p>.scored are read


class PolicyFollower:
    """Follows <p>.policy in a background thread: the newest version and its metrics; and when
    <p>.scored last grew (its end offsets: no records are read), so rollouts still under way
    are told from a trainer that has everything and took no step."""

    def __init__(self, settings: Settings) -> None:
        self.version = -1
        self.consumed = 0
        self.at_start = (-1, 0)  # (version, consumed) when the follower caught up
        self.caught_up = threading.Event()
        self.scored_at = time.monotonic()
        self._scored = settings.topics.scored
        self._partitions: list[int] = []
        self._ends: list[int] = []
        self._reader = PolicyReader(settings)
        # Offsets asked of its own client: behind the reader's long-poll fetches, each answer
        # would wait up to half a second.
        self._probe = kafka.reader(settings, [])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="policy-follower", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        # First to the end of <p>.policy: the count of groups in flight starts from there.
        while not self._stop.is_set() and not self._reader.at_end:
            self._take(self._reader.poll(0.2))
        self.at_start = (self.version, self.consumed)
        self.caught_up.set()
        next_check = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_check:
                self._check_scored()
                next_check = time.monotonic() + SCORED_CHECK_S
            self._take(self._reader.poll(0.2))

    def _take(self, events: list[PolicyVersion]) -> None:
        for event in events:
            self.version = event["version"]
            self.consumed = int(event["metrics"].get(CONSUMED, self.consumed))

    def _check_scored(self) -> None:
        try:
            if not self._partitions:
                meta = self._probe.list_topics(self._scored, timeout=2).topics[self._scored]
                self._partitions = sorted(meta.partitions)
            ends = [self._probe.get_watermark_offsets(
                TopicPartition(self._scored, p), timeout=2, cached=False)[1]
                for p in self._partitions]
        except KafkaException:
            return  # the broker is away: nothing is known to have grown
        if self._ends and ends != self._ends:  # the first reading is where counting starts
            self.scored_at = time.monotonic()
        self._ends = ends

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._reader.close()
        self._probe.close()


class AdmissionGate:
    def __init__(self, settings: Settings, window: int, stall_s: float = 3.0,
                 startup_s: float = 30.0) -> None:
        self.window = window
        self.stall_s = stall_s
        self.startup_s = startup_s
        self.admitted = 0
        # Recently admitted ids: a redo comes soon after the first try.
        self._recent = RecentIds(max(16 * window, 10_000))
        self.follower = PolicyFollower(settings)
        self._bonus = 0
        self._seen: tuple[int, int] | None = None  # (version, consumed) once caught up
        self._last_progress = time.monotonic()
        self._intervals: deque[float] = deque(maxlen=5)

    def in_flight(self) -> int:
        """Groups let in since the gate started that the trainer has not consumed."""
        return self.admitted - (self.follower.consumed - self.follower.at_start[1])

    def capacity(self) -> int:
        if not self.follower.caught_up.is_set():
            return 0  # what the trainer has consumed is not known yet
        seen = (self.follower.version, self.follower.consumed)
        if self._seen is None:
            self._seen = self.follower.at_start
        now = time.monotonic()
        # Samples still arriving: the rollouts are slow, not the trainer stalled.
        quiet_since = max(self._last_progress, self.follower.scored_at)
        if seen != self._seen:
            # How long the trainer took to step once nothing more was arriving: the wait for
            # rollouts is not the trainer's, and would stretch every real stall.
            self._intervals.append(now - quiet_since)
            self._seen, self._last_progress = seen, now
            self._bonus = 0
            quiet_since = now
        room = self.window - self.in_flight() + self._bonus
        if self._intervals:
            patience = max(self.stall_s, 3 * statistics.median(self._intervals))
        else:  # no step yet: the trainer may still be starting (imports, loading a model)
            patience = max(self.stall_s, self.startup_s)
        if room <= 0 and now - quiet_since > patience:
            log.info("no trainer progress for %.1f s and no sample scored for %.1f s with %d "
                     "groups in flight: one more window", now - self._last_progress,
                     now - self.follower.scored_at, self.in_flight())
            self._bonus += self.window
            self._last_progress = now
            room += self.window
        return max(room, 0)

    def admit(self, task_id: str) -> None:
        if task_id in self._recent:
            return
        self._recent.add(task_id)
        if self.in_flight() <= 0:
            self._last_progress = time.monotonic()  # into an empty pipeline: the stall clock starts
        self.admitted += 1

    def close(self) -> None:
        self.follower.close()
