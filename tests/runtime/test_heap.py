"""The heap of a serving process (each probe in a process of its own: the settings are global):
its collector (start-up's objects frozen, cycles made while serving still reclaimed, young
collections far apart) and its C heap (freed blocks given back to the system while it serves)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import gc, weakref
from rollstream.consume import heap

class Node:
    pass

before = Node(); before.me = before  # a start-up object in a cycle, alive
heap.settle()
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
assert gc.get_threshold() == (heap.YOUNG, heap.MIDDLE, heap.OLD)
assert gc.is_tracked(before) and gc.isenabled()

cycle = Node(); cycle.me = cycle  # garbage made while serving
alive = weakref.ref(cycle)
del cycle
# Enough live allocations for young collections to run on their own (freed ones do not count).
kept = [[] for _ in range(3 * heap.YOUNG)]
assert alive() is None, "a cycle made after settle() was never collected"
print("ok")
"""


def test_settle_freezes_start_up_and_still_collects_cycles() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


TRIM_PROBE = """
import os, sys, time
from rollstream.consume import heap

def rss_mb():
    pages = int(open(f"/proc/{os.getpid()}/statm").read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6

heap.settle(trim_s=float(sys.argv[1]))
# A turn's pattern: large blocks freed between small ones that stay (a 1 kB bytes object is
# malloc'd by glibc, as a turn record's fields are), so glibc can release none of them alone.
large, kept = [], []
for _ in range(2000):
    large.append(b"x" * 100_000)
    kept.append(bytes(1000))
before = rss_mb()
del large
time.sleep(3)
print(round(before), round(rss_mb()))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; malloc_trim is glibc's")
def test_settle_gives_freed_c_heap_back_while_serving() -> None:
    """The same freed blocks stay resident with trimming every hour, and go within seconds at a
    trim every 0.2 s."""
    resident = {}
    for every in (3600, 0.2):
        done = subprocess.run([sys.executable, "-c", TRIM_PROBE, str(every)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        resident[every] = [int(mb) for mb in done.stdout.split()]
    (full, idle), (full_trimmed, trimmed) = resident[3600], resident[0.2]
    assert min(full, full_trimmed) > 150, resident  # 200 MB were resident before the free
    assert idle > full - 50, resident  # glibc kept what was freed
    assert trimmed < full_trimmed - 150, resident  # the thread gave it back
