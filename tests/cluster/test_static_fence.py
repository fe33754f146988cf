"""A static member fenced by the broker (what a broker restart does to a member that rejoins
with its own group.instance.id) rebuilds its consumer and goes on; it does not sit idle on a
dead consumer."""

from __future__ import annotations

import asyncio
import threading
import time

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.runtime import EventContext, Output, StageRuntime
from tests.helpers.runtime_helpers import SlowEcho, send_versions


class Echo(SlowEcho):
    async def handle(self, event: dict, ctx: EventContext) -> list[Output]:
        return [Output(self.topics.trajectories, str(event["version"]), "PolicyVersion", event)]


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_fenced_static_member_rebuilds_its_consumer_and_goes_on(settings: Settings) -> None:
    settings = settings.override(instance_id="fenced")
    runtime = StageRuntime(Echo(settings), settings)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.serve()))
    thread.start()
    try:
        send_versions(settings, range(1, 11))
        wait(lambda: runtime.stats["processed"] >= 10, 60, f"first events: {runtime.stats}")
        # Another consumer joins with the same static id: the broker fences the runtime's.
        intruder = kafka.consumer(settings, runtime.group)
        intruder.subscribe([settings.topics.policy])
        try:
            wait(lambda: intruder.poll(0.2) is not None or bool(intruder.assignment()), 60,
                 "the intruder joined")
            wait(lambda: runtime.stats["consumer_rebuilds"] >= 1, 60,
                 f"the fenced consumer rebuilt: {runtime.stats}")
        finally:
            intruder.close()
        send_versions(settings, range(11, 21))
        wait(lambda: runtime.stats["processed"] >= 20, 90, f"events after: {runtime.stats}")
    finally:
        runtime.stop()
        thread.join(60)
    assert not thread.is_alive()
