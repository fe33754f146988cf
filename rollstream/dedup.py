"""Idempotence by id: a stage handles each task / episode id once, however often it arrives.

A re-published task or a duplicated trajectory carries an id the stage has already handled.
Kafka's transactions make each *event* count once; this makes each *id* count once:

- the stage writes a marker `<stage>/<id>` to the compacted `<prefix>.seen` topic in the same
  transaction as its outputs, on the partition its input came from, so the marker is committed
  exactly when the outputs are (a crash loses both or neither);
- when it is assigned a partition it reads that partition of `seen` back (in the stage's main
  loop while that partition stays paused), so the memory survives restarts and moves to
  whichever process takes the partition over;
- memory is bounded: the latest `dedup_window` ids per partition are kept (oldest forgotten
  first), and the topic forgets markers after its retention (7 days, as the inputs).

Ids are keys, and duplicates land on the partition of their first copy as long as producers
key events by id with the same partitioner (every Rollstream producer does).

An episode can be played more than once (RUN retries infra failures, stages/run.py): each id
is remembered with the newest attempt handled (the marker's value; empty: 0), so a newer
attempt of an id is handled and an older or the same one is a duplicate.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.runtime import Output

log = logging.getLogger("rollstream.dedup")


class RecentIds:
    """The newest `limit` ids with the newest attempt of each, oldest forgotten first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._ids: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._ids

    def attempt(self, event_id: str) -> int | None:
        """The newest attempt of `event_id` handled; None: none was."""
        return self._ids.get(event_id)

    def add(self, event_id: str, attempt: int = 0) -> None:
        self._ids[event_id] = max(attempt, self._ids.get(event_id, attempt))
        self._ids.move_to_end(event_id)
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)


class SeenIds:
    """The ids one stage has handled, per input partition."""

    def __init__(self, settings: Settings, stage: str) -> None:
        self.settings = settings
        self.topic = settings.topics.seen
        self.prefix = f"{stage}/"
        self.window = settings.stage.dedup_window
        self._seen: dict[int, RecentIds] = {}

    def read(self, partitions: list[int], attempts: int = 5,
             attempt_s: float = 60.0) -> dict[int, RecentIds]:
        """The markers of the given partitions, read back (committed ones only; a transaction
        still open when the read starts is waited for a short while, not for a killed writer's
        whole transaction timeout). A read that does not reach the end in `attempt_s` (a broker
        still recovering after a restart, under load) is tried again, not fatal to the stage.
        Blocking, and touches no state: run it in a thread (see `load`)."""
        tps = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions]
        for attempt in range(1, attempts):
            try:
                return self._read(tps, attempt_s)
            except TimeoutError as exc:
                log.warning("restoring handled ids, attempt %d of %d: %s", attempt, attempts, exc)
        return self._read(tps, attempt_s)

    def _read(self, tps: list[TopicPartition], timeout_s: float) -> dict[int, RecentIds]:
        seen = {tp.partition: RecentIds(self.window) for tp in tps}
        for msg in kafka.read_partitions(self.settings, tps, timeout_s):
            key = msg.key().decode()
            if key.startswith(self.prefix):
                value = msg.value() or b""
                seen[msg.partition()].add(key[len(self.prefix):],
                                          int(value) if value.isdigit() else 0)
        return seen

    def restore(self, partitions: list[int], attempts: int = 5,
                attempt_s: float = 60.0) -> None:
        """Read the markers of newly assigned partitions back, blocking (see `read`)."""
        self._seen.update(self.read(partitions, attempts, attempt_s))

    async def load(self, partitions: list[int]) -> None:
        """`restore` for a stage's main loop: the read runs in a thread, the others go on."""
        self._seen.update(await asyncio.to_thread(self.read, partitions))

    def forget(self, partitions: list[int]) -> None:
        for p in partitions:
            self._seen.pop(p, None)

    def claim(self, partition: int, event_id: str, attempt: int = 0) -> bool:
        """True the first time `event_id` is seen on `partition` at `attempt` or a later one
        (it is remembered at once, so a copy arriving while the first is still being handled is
        refused too, and so is an older attempt arriving after a newer one)."""
        seen = self._seen.setdefault(partition, RecentIds(self.window))
        newest = seen.attempt(event_id)
        if newest is not None and newest >= attempt:
            log.info("%s%s: attempt %d already handled (newest %d), skipped", self.prefix,
                     event_id, attempt, newest)
            return False
        seen.add(event_id, attempt)
        return True

    def marker(self, partition: int, event_id: str, attempt: int = 0) -> Output:
        """The output that records `event_id` (at `attempt`) as handled; emit it with the
        event's outputs."""
        return Output(self.topic, f"{self.prefix}{event_id}", None,
                      str(attempt).encode() if attempt else b"", partition=partition)
