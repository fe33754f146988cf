"""The collector of a serving process: start-up's objects frozen, cycles made while serving
still reclaimed, and young collections far apart (in a process of its own: it is global)."""

from __future__ import annotations

import subprocess
import sys

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
