"""The heap of a process that serves stages: tuned once, before it serves.

Its garbage collector: thousands of episodes in flight keep hundreds of thousands of objects
alive, and CPython's defaults (a young collection every 700 allocations, older generations after
10 of the younger) made its collector 17-18% of RUN's CPU per turn at 4,000 episodes
(benchmarks/turn_cpu.py); with these settings it is 1.5-2%.

Its C heap: every turn allocates and frees its episode's whole context several times over (the
request's ids and body, the response and its echoed ids), between turn records that live until
the episode ends. glibc keeps the pages of those freed blocks (one RUN process with 500 episodes
held at 24k-token contexts: 453 MB resident, 258 MB after malloc_trim), so a thread gives them
back every TRIM_S. at_scale, 1,000 episodes of 50 turns: the RUN processes peaked at 1,506 MB
together with a trim every 10 s, 1,246 MB every second, at the same CPU per turn (3.50 and 3.54
ms); a call takes about 1 ms, 13 ms when it gives back a few hundred MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
import time
from collections.abc import Callable

# Young collections every 50,000 allocations: a turn allocates a few thousand objects, most
# of them dead by its end, so fewer of them live long enough to be promoted and rescanned.
YOUNG = 50_000
# Full collections 20 x 100 young ones apart (CPython also waits until a quarter of the old
# generation is new): the old generation is the episodes in flight, rescanned for nothing.
MIDDLE, OLD = 20, 100
TRIM_S = 1.0


def settle(trim_s: float = TRIM_S) -> None:
    """Move what start-up made (modules, settings, the stage) out of every future collection,
    then widen the generations; and give freed C heap back every `trim_s`. Call once, when the
    process is about to serve."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
    trim_every(trim_s)


def trim_every(seconds: float = TRIM_S) -> None:
    """Give the C heap's freed pages back to the system every `seconds`, from a daemon thread
    (nothing where the C library has no malloc_trim)."""
    trim = _malloc_trim()
    if trim is not None:
        threading.Thread(target=_trim_every, args=(trim, seconds), name="malloc-trim",
                         daemon=True).start()


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def _trim_every(trim: Callable[[int], int], seconds: float) -> None:
    while True:  # a daemon thread: it ends with the process
        time.sleep(seconds)
        trim(0)  # ctypes releases the GIL: the event loop goes on meanwhile
