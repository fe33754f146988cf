"""When a loop commits, and what happens to a commit while it is out.

A commit that waits on the cluster (a coordinator moving) must not stop the group: the
transaction hands the loop each call it waits on (rollstream/cluster/transaction.py), and the loop
serves its consumer between two waits, so a rebalance is answered and partitions lost are
handed back. The transaction never calls back into the loop. What the rebalance means for the
commit under way is recorded on its `CommitInFlight`, the one place the rebalance callbacks
and the commit share, instead of flags on the loop; the loop reads it between two waits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

IDLE_COMMIT_MS = 20  # earliest commit after the last one when no more input is waiting


class CommitClock:
    """Under load, one transaction per interval; when the input runs dry, commit soon so
    downstream sees results without waiting out the interval."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self._last = time.monotonic()

    def due(self, idle: bool) -> bool:
        now = time.monotonic()
        elapsed_ms = (now - self._last) * 1000
        if elapsed_ms >= self.interval_ms or (idle and elapsed_ms >= IDLE_COMMIT_MS):
            self._last = now
            return True
        return False


@dataclass
class CommitInFlight:
    """The main loop's commit, out while the group is served.

    Partitions revoked meanwhile are committed by it (their offsets are in it); partitions lost,
    an event handed out by a partition that should have been paused, or a consumer that failed
    mean the transaction is no longer wanted: the loop abandons the call out, and rewinds."""

    abandoned: str | None = None  # why, once it is no longer wanted

    def abandon(self, reason: str) -> None:
        self.abandoned = self.abandoned or reason
