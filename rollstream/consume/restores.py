"""State restored for newly held partitions in the main loop, never in a rebalance callback.

Reading a compacted topic back can take seconds to minutes; inside `consumer.poll`'s callback
it would stop the event loop, and with it every episode in flight on the other partitions. Here
each assignment's restore is a task of the event loop (its reads run in a thread), the new
partitions stay paused until it is done, and the others go on meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class Restores:
    def __init__(self, restore: Callable[[list[int]], Awaitable[None]]) -> None:
        self._restore = restore
        self._tasks: dict[asyncio.Future, list[int]] = {}

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def start(self, partitions: list[int]) -> None:
        if partitions:
            self._tasks[asyncio.ensure_future(self._restore(partitions))] = partitions

    def done(self) -> list[int]:
        """Partitions whose state is back; raises what a restore raised."""
        back: list[int] = []
        for task in [t for t in self._tasks if t.done()]:
            parts = self._tasks.pop(task)
            if not task.cancelled():
                task.result()
                back.extend(parts)
        return back

    def release(self, partitions: set[int]) -> list[int]:
        """Give up the restores that read any of these partitions (no longer held; a restore
        writes its state only once it has read all of it); returns the other partitions they
        covered, still to be restored."""
        again: list[int] = []
        for task, parts in list(self._tasks.items()):
            if partitions & set(parts):
                task.cancel()
                del self._tasks[task]
                again.extend(p for p in parts if p not in partitions)
        return again

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
