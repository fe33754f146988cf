"""Admission control: INIT lets a task into the pipeline only while the work in flight fits what
the trainer can take within the staleness bound.

The trainer publishes, with every PolicyVersion, how many groups it is done with (trained or
dropped). INIT admits a task while `admitted - consumed < window`; otherwise its capacity is 0
and the runtime pauses the tasks partitions: backpressure through Kafka, the tasks wait in the
log. Rollouts therefore never run more than `window` groups ahead of training, whatever the
speed of the stages. If the trainer makes no progress for three times its recent step
interval (at least `stall_s`: every group of a window was dropped for lack of reward variance,
so no step was taken and no version published), one more window is let in, so the loop cannot
stall; scaling the wait with the step interval keeps a slow (busy) trainer from being taken for
a stalled one. Before the trainer's first step the wait is `startup_s` (30 s): a trainer that
is still loading is not a stalled one either. The bridge's staleness bound still applies.
INIT's count of admitted tasks starts at 0 when a process starts: after a restart it may let
up to one window more in. A task let in again because its input was redone (a transaction that
failed, a broker restart) is counted once: each counted id is remembered for a while.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque

from rollstream.config import Settings
from rollstream.policy_versions import PolicyReader

# The PolicyVersion metric in which the trainer (trainer_bridge.train_loop) reports the groups
# it is done with: the one place this name is defined.
CONSUMED = "groups_consumed"


class PolicyFollower:
    """Follows <p>.policy in a background thread: the newest version and its metrics."""

    def __init__(self, settings: Settings) -> None:
        self.version = -1
        self.consumed = 0
        self._reader = PolicyReader(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="policy-follower", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            for event in self._reader.poll(0.2):
                self.version = event["version"]
                self.consumed = int(event["metrics"].get(CONSUMED, self.consumed))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._reader.close()


class AdmissionGate:
    def __init__(self, settings: Settings, window: int, stall_s: float = 3.0,
                 startup_s: float = 30.0) -> None:
        self.window = window
        self.stall_s = stall_s
        self.startup_s = startup_s
        self.admitted = 0
        # Recently admitted ids (an ordered set): a redo comes soon after the first try.
        self._recent: dict[str, None] = {}
        self._memory = max(16 * window, 10_000)
        self.follower = PolicyFollower(settings)
        self._bonus = 0
        self._last_consumed = 0
        self._last_progress = time.monotonic()
        self._intervals: deque[float] = deque(maxlen=5)

    def capacity(self) -> int:
        consumed = self.follower.consumed
        now = time.monotonic()
        if consumed != self._last_consumed:
            self._intervals.append(now - self._last_progress)
            self._last_consumed, self._last_progress = consumed, now
        room = self.window - (self.admitted - consumed - self._bonus)
        if self._intervals:
            patience = max(self.stall_s, 3 * statistics.median(self._intervals))
        else:  # no step yet: the trainer may still be starting (imports, loading a model)
            patience = max(self.stall_s, self.startup_s)
        if room <= 0 and now - self._last_progress > patience:
            self._bonus += self.window
            self._last_progress = now
            room += self.window
        return max(room, 0)

    def admit(self, task_id: str) -> None:
        if task_id in self._recent:
            return
        self._recent[task_id] = None
        if len(self._recent) > self._memory:
            del self._recent[next(iter(self._recent))]
        self.admitted += 1

    def close(self) -> None:
        self.follower.close()
