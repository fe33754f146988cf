"""Per-partition progress for out-of-order work, committed exactly once.

Stages finish events out of order (a short episode overtakes a long one). Kafka stores one
offset per partition, so the committed offset is the lowest unfinished one (the watermark) and
the offsets already finished above it travel in the commit's metadata string, inside the same
transaction as their outputs. After a crash or rebalance the next owner resumes at the watermark
and skips the offsets listed in the metadata: their outputs are already committed.
"""

from __future__ import annotations

from collections import OrderedDict

METADATA_PREFIX = "rs1:"
# Kafka's default offset.metadata.max.bytes is 4096; stay well below it. A partition whose
# finished-above-watermark list would not fit is paused until its watermark moves.
METADATA_BUDGET = 3000
FAST_BUDGET_CHECK = 256  # offsets; each costs at most ~10 characters of metadata


def encode_done(watermark: int, done: list[int]) -> str:
    """Sorted finished offsets above the watermark as base-36 runs: 'start+len' or 'start'."""
    if not done:
        return ""
    parts: list[str] = []
    prev = watermark
    run_start = run_len = None
    for off in done:
        if run_start is not None and off == run_start + run_len:
            run_len += 1
            continue
        if run_start is not None:
            parts.append(_run(run_start - prev, run_len))
            prev = run_start + run_len
        run_start, run_len = off, 1
    parts.append(_run(run_start - prev, run_len))
    return METADATA_PREFIX + ",".join(parts)


def _run(gap: int, length: int) -> str:
    return _b36(gap) if length == 1 else f"{_b36(gap)}+{_b36(length)}"


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def decode_done(watermark: int, metadata: str | None) -> set[int]:
    """Inverse of encode_done; metadata written by anything else means 'nothing skipped'."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return set()
    done: set[int] = set()
    prev = watermark
    for part in metadata[len(METADATA_PREFIX) :].split(","):
        gap, _, length = part.partition("+")
        start = prev + int(gap, 36)
        n = int(length, 36) if length else 1
        done.update(range(start, start + n))
        prev = start + n
    return done


class PartitionProgress:
    """Offsets of one partition seen by this process, in arrival order, with their state."""

    def __init__(self, committed: int, skip: set[int] | None = None) -> None:
        self.watermark = committed
        self._skip = skip or set()
        self._seen: OrderedDict[int, bool] = OrderedDict()  # offset -> finished?
        self.dirty = False

    def should_skip(self, offset: int) -> bool:
        """True for an offset whose output a previous owner already committed."""
        return offset in self._skip

    def started(self, offset: int) -> None:
        if self.watermark < 0:  # nothing committed yet: we start where the consumer started
            self.watermark = offset
        self._seen[offset] = False

    def passed(self, offset: int) -> None:
        """Started and finished at once (sync work, skips, dead letters)."""
        if self._seen:
            self.started(offset)
            self.finished(offset)
            return
        if self._skip:
            self._skip.discard(offset)  # nothing in flight: the watermark simply moves past it
        self.watermark = offset + 1
        self.dirty = True

    def finished(self, offset: int) -> None:
        self._seen[offset] = True
        self._skip.discard(offset)
        # Offsets are not contiguous (transaction markers, compaction): advance over what arrived.
        while self._seen:
            first, done = next(iter(self._seen.items()))
            if not done:
                break
            self._seen.popitem(last=False)
            self.watermark = first + 1
        self.dirty = True

    def metadata(self) -> str:
        done = sorted({o for o, d in self._seen.items() if d} | self._skip)
        return encode_done(self.watermark, [o for o in done if o >= self.watermark])

    def over_budget(self) -> bool:
        if len(self._seen) + len(self._skip) < FAST_BUDGET_CHECK:
            return False  # cannot exceed the budget: even one run per offset fits
        return len(self.metadata()) > METADATA_BUDGET
