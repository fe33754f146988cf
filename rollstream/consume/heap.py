"""The garbage collector of a process that serves stages: tuned once, before it serves.

Thousands of episodes in flight keep hundreds of thousands of objects alive, and CPython's
defaults (a young collection every 700 allocations, older generations after 10 of the younger)
made its collector 17-18% of RUN's CPU per turn at 4,000 episodes (benchmarks/turn_cpu.py);
with these settings it is 1.5-2%.
"""

from __future__ import annotations

import gc

# Young collections every 50,000 allocations: a turn allocates a few thousand objects, most
# of them dead by its end, so fewer of them live long enough to be promoted and rescanned.
YOUNG = 50_000
# Full collections 20 x 100 young ones apart (CPython also waits until a quarter of the old
# generation is new): the old generation is the episodes in flight, rescanned for nothing.
MIDDLE, OLD = 20, 100


def settle() -> None:
    """Move what start-up made (modules, settings, the stage) out of every future collection,
    then widen the generations. Call once, when the process is about to serve."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
