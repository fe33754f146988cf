"""The stats app's faust transport: a commit waits for the changelog records queued before it.

The SIGKILL tests in test_stats.py show the whole effect (exact totals after a restart); this
one pins the step they depend on, which a kill only hits by chance: a record that faust's
buffer task has taken off its queue but not yet handed to the producer.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from rollstream.ops.faust_transport import _Buffer


class _SlowChannel:
    """A topic whose publish waits until released, as a producer blocked on its transaction
    lock does while another transaction commits."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.sent: list[Any] = []

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        self.started.set()
        await self.release.wait()
        self.sent.append(fut)


def test_a_commit_waits_for_a_record_taken_off_the_queue_but_not_yet_handed_over() -> None:
    async def scenario() -> None:
        channel = _SlowChannel()
        buffer = _Buffer()
        buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))
        await buffer.start()
        try:
            record = SimpleNamespace(message=SimpleNamespace(channel=channel))
            buffer.put(record)
            await asyncio.wait_for(channel.started.wait(), 10)
            assert buffer.size == 0  # off the queue: faust's own flush returns here
            await asyncio.wait_for(buffer.flush(), 10)
            assert channel.sent == []
            handed_over = asyncio.create_task(buffer.handed_over())
            await asyncio.sleep(0.2)
            assert not handed_over.done()
            channel.release.set()
            await asyncio.wait_for(handed_over, 10)
            assert channel.sent == [record]
        finally:
            await buffer.stop()

    asyncio.run(scenario())
