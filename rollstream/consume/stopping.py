"""A graceful stop as a value: when it was asked for, and when blocking work gives up.

SIGTERM/SIGINT: stop taking events, let in-flight ones finish within the drain timeout, commit
(one bounded call more), leave the group (bounded): every blocking Kafka call is bounded by
`deadline` (a `Deadline` the transaction reads) or abandoned (see transaction.py), so a cluster
that does not answer cannot keep the process alive.
"""

from __future__ import annotations

import contextlib
import signal
import time

from rollstream.cluster.transaction import CALL_TIMEOUT_S, Deadline


class Stopping:
    def __init__(self, drain_timeout_s: float) -> None:
        self.drain_timeout_s = drain_timeout_s
        self.asked_at: float | None = None
        # When blocking Kafka work gives up: the drain timeout after a stop request, plus one
        # bounded call for the last commit; never before one. The transaction reads it.
        self.deadline = Deadline()

    @property
    def asked(self) -> bool:
        return self.asked_at is not None

    def ask(self) -> None:
        if self.asked_at is None:
            self.asked_at = time.monotonic()
            self.deadline.at = self.asked_at + self.drain_timeout_s + CALL_TIMEOUT_S

    def drain_left(self) -> float:
        """Seconds left for in-flight work to finish."""
        if self.asked_at is None:
            return self.drain_timeout_s
        return max(0.0, self.asked_at + self.drain_timeout_s - time.monotonic())

    def on_signals(self) -> None:
        # A plain handler, not loop.add_signal_handler: it runs between two bounded Kafka calls
        # even while the loop is blocked in a commit that retries, so the deadline starts then.
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread (tests use threads)
                signal.signal(sig, lambda *_: self.ask())
