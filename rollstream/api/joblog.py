"""One job's API state, read from its log: the tasks the API accepted (`<p>.tasks`), their
episodes' results (`<p>.scored`) and the API's markers (`<p>.seen`, keys `api/...`: a task
cancelled, a callback delivered). Nothing lives only in memory, so any API process answers for
any task, and a restarted one reads back every task it had accepted.

A task the API publishes has the id `<dialect>:<the caller's id>`: the same caller id is the
same task, which INIT expands once (rollstream.dedup), so a caller that retries or reconnects
gets the first rollout's result, never a second rollout.

A deadline (Polar's `timeout_seconds`) is in the task record; a result scored after it does
not count, and the task is over once the deadline plus a grace (GRACE_S: results scored in
time may still be committing) has passed: every process reads the same verdict from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import AdminClient

from rollstream.cluster.follower import Follower
from rollstream.cluster.kafka import process_id, produce, transaction, transactional_producer
from rollstream.config import Settings
from rollstream.contracts.codec import DecodeError, codec
from rollstream.contracts.events import SCORED_TRAJECTORY, TASK, ScoredTrajectory, Task
from rollstream.telemetry import health

log = logging.getLogger("rollstream.api")

DIALECTS = ("prorl", "polar")
MARKER = "api/"  # the API's keys on <p>.seen; the stages read their own prefixes only
CANCELLED, CALLED_BACK = "cancelled", "called-back"
# Past a task's deadline, how long results scored before it may still be committed.
GRACE_S = 30.0
SUBSCRIBER_QUEUE = 256  # events a slow /events client may fall behind by (then the oldest go)

class Unavailable(Exception):
    """The job's topics cannot be read (missing, refused): its calls are answered 503."""


class RequestError(ValueError):
    """A request that cannot become a task; the message names the field."""


def task_id(dialect: str, caller_id: str) -> str:
    return f"{dialect}:{caller_id}"


def now_ms() -> int:
    return int(time.time() * 1000)


def timestamp() -> str:
    """Now, as Polar's events give it (ISO 8601, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class ApiTask:
    """A task the API accepted, as its log says it is now."""

    task: Task
    results: dict[int, ScoredTrajectory] = field(default_factory=dict)
    cancelled: bool = False
    called_back: bool = False
    timed_out: bool = False
    announced: bool = False  # its end was told (events, callbacks) once

    @property
    def dialect(self) -> str:
        return self.task["task_id"].partition(":")[0]

    @property
    def caller_id(self) -> str:
        return self.task["task_id"].partition(":")[2]

    @property
    def meta(self) -> dict[str, str]:
        return self.task["metadata"]

    @property
    def deadline_ms(self) -> int | None:
        timeout = self.meta.get("api.timeout_s")
        if timeout is None:
            return None
        return self.task["created_at_ms"] + int(float(timeout) * 1000)

    @property
    def complete(self) -> bool:
        return len(self.results) >= self.task["group_size"]

    @property
    def finished(self) -> bool:
        return self.complete or self.cancelled or self.timed_out

    def status(self) -> str:
        """Polar's task status: running, completed (every sample, or the deadline), cancelled."""
        if self.cancelled and not self.complete:
            return "cancelled"
        return "completed" if self.complete or self.timed_out else "running"


class JobLog:
    """Follows one job's topics (a thread reads, the event loop applies) and sends the API's
    records to them (one transaction per batch of concurrent requests)."""

    def __init__(self, settings: Settings, grace_s: float = GRACE_S) -> None:
        self.settings = settings
        self.grace_s = grace_s
        self.failed: str | None = None  # why the topics cannot be read
        self.tasks: dict[str, ApiTask] = {}
        self._early: dict[str, dict[int, ScoredTrajectory]] = {}  # results ahead of their task
        self._markers: dict[str, set[str]] = {}  # markers ahead of their task
        self.marked: set[tuple[str, str]] = set()  # (marker, task id) read back
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self.subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self.on_finished: list[Callable[[ApiTask], None]] = []
        self._caught_up = asyncio.Event()
        self._stop = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._pending: list[tuple[str, str, bytes, asyncio.Future[None]]] = []
        self._send_wake = asyncio.Event()
        self._producer: Any = None
        self._ready = health.component(f"api-{settings.prefix}", "reading the job's topics")
        self._thread = threading.Thread(target=self._read, name=f"api-{settings.prefix}",
                                        daemon=True)
        self._thread.start()
        self._background = [asyncio.ensure_future(self._send_loop()),
                            asyncio.ensure_future(self._deadline_loop())]

    # -- reading -------------------------------------------------------------------------------

    def _partitions(self) -> list[TopicPartition]:
        topics = self.settings.topics
        names = (topics.tasks, topics.scored, topics.seen)
        found = AdminClient(self.settings.kafka()).list_topics(timeout=self.settings.timeout_s)
        missing = [n for n in names if n not in found.topics or found.topics[n].error]
        if missing:
            raise RuntimeError(f"topics {missing} do not exist (create the job's topics: "
                               "rollstream jobs create)")
        return [TopicPartition(n, p, OFFSET_BEGINNING) for n in names
                for p in sorted(found.topics[n].partitions)]

    def _read(self) -> None:
        try:
            follower = Follower(self.settings, self._partitions())
        except Exception as exc:  # shown on /ready; the job's calls answer 503
            self._loop.call_soon_threadsafe(self._fail, str(exc))
            return
        try:
            while not self._stop.is_set():
                # consume() waits out its timeout unless `limit` records come: wait for one,
                # then take what is there at once (a result is answered as soon as it is read).
                records = follower.poll(0.5, limit=1)
                if records:
                    records += follower.poll(0, limit=500)
                decoded = [d for d in map(self._decode, records) if d]
                at_end = follower.at_end
                if decoded or at_end:
                    self._loop.call_soon_threadsafe(self._apply, decoded, at_end)
        except Exception as exc:  # a reader that died is said so, not waited on
            self._loop.call_soon_threadsafe(self._fail, str(exc))
        finally:
            follower.close()

    def _fail(self, reason: str) -> None:
        self.failed = f"the topics of {self.settings.prefix} cannot be read: {reason}"
        self._ready.not_ready(self.failed)
        log.error("%s", self.failed)
        self._caught_up.set()  # waiters wake up to the failure
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _decode(self, msg: Any) -> tuple[str, str, Any] | None:
        """(kind, key, value) of a record that is the API's, None for the others (undecoded)."""
        key = msg.key().decode() if msg.key() is not None else ""
        topic = msg.topic()
        try:
            if topic == self.settings.topics.tasks:
                if key.partition(":")[0] in DIALECTS:
                    return "task", key, codec().decode_as(TASK, msg.value())
            elif topic == self.settings.topics.scored:
                if key.partition(":")[0] in DIALECTS:
                    return "scored", key, codec().decode_as(SCORED_TRAJECTORY, msg.value())
            elif key.startswith(MARKER):
                kind, _, tid = key[len(MARKER):].partition("/")
                return "marker", tid, kind
        except DecodeError as exc:
            log.warning("skipping an undecodable record on %s at %d: %s", topic, msg.offset(), exc)
        return None

    def _apply(self, records: list[tuple[str, str, Any]], at_end: bool) -> None:
        for kind, key, value in records:
            if kind == "task":
                self._add_task(value)
            elif kind == "scored":
                tid, _, index = key.rpartition("#")
                self._add_result(tid, int(index), value)
            else:
                self._add_marker(key, value)
        if at_end and not self._caught_up.is_set():
            self._caught_up.set()
            self._ready.ready()
            log.info("%s: %d API tasks read back", self.settings.prefix, len(self.tasks))

    def _add_task(self, task: Task) -> None:
        tid = task["task_id"]
        if tid in self.tasks:
            return  # a retried submit: INIT rolls the first out, the first counts
        entry = ApiTask(task)
        self.tasks[tid] = entry
        self._event("task.created", entry, status="running", num_samples=task["group_size"],
                    harness=entry.meta.get("api.harness"), model=entry.meta.get("api.model"))
        for index, scored in self._early.pop(tid, {}).items():
            self._add_result(tid, index, scored)
        for marker in self._markers.pop(tid, set()):
            self._add_marker(tid, marker)
        self._changed(entry)

    def _add_result(self, tid: str, index: int, scored: ScoredTrajectory) -> None:
        entry = self.tasks.get(tid)
        if entry is None:
            self._early.setdefault(tid, {}).setdefault(index, scored)
            return
        deadline = entry.deadline_ms
        if (index in entry.results or entry.finished
                or (deadline is not None and scored["scored_at_ms"] > deadline)):
            return
        entry.results[index] = scored
        self._event("session.state_changed", entry, session_id=f"{tid}#{index}",
                    status=session_status(scored))
        self._event("task.updated", entry, completed_sessions=len(entry.results),
                    total_sessions=entry.task["group_size"])
        self._changed(entry)

    def _add_marker(self, tid: str, marker: str) -> None:
        self.marked.add((marker, tid))
        for waiter in self._waiters.pop(tid, []):
            if not waiter.done():
                waiter.set_result(None)
        entry = self.tasks.get(tid)
        if entry is None:
            self._markers.setdefault(tid, set()).add(marker)
            return
        if marker == CANCELLED and not entry.finished:
            entry.cancelled = True
            self._changed(entry)
        elif marker == CALLED_BACK:
            entry.called_back = True

    async def _deadline_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            late = now_ms() - int(self.grace_s * 1000)
            for entry in list(self.tasks.values()):
                deadline = entry.deadline_ms
                if not entry.finished and deadline is not None and deadline < late:
                    entry.timed_out = True
                    self._changed(entry)

    def _changed(self, entry: ApiTask) -> None:
        for waiter in self._waiters.pop(entry.task["task_id"], []):
            if not waiter.done():
                waiter.set_result(None)
        if entry.finished and not entry.announced:
            entry.announced = True
            self._event("task.completed", entry, status=entry.status(),
                        completed_sessions=len(entry.results))
            for callback in self.on_finished:
                callback(entry)

    def _event(self, kind: str, entry: ApiTask, **data: Any) -> None:
        """An event for /events subscribers (Polar's tasks only: its stream's clients)."""
        if entry.dialect != "polar" or not self._caught_up.is_set():
            return  # what happened before this process started is not news
        event = {"type": kind, "ts": timestamp(),
                 "data": {"task_id": entry.caller_id, **data}}
        for queue in self.subscribers:
            if queue.full():
                queue.get_nowait()  # the oldest goes, as Polar's bus does
            queue.put_nowait(event)

    def cancelled_before(self, tid: str) -> bool:
        """A cancel (Polar's `register_if_missing`) came for `tid` before any task did."""
        return CANCELLED in self._markers.get(tid, set())

    async def caught_up(self) -> None:
        """Wait until the topics were read to their end once (what the log held at start)."""
        await self._caught_up.wait()
        if self.failed is not None:
            raise Unavailable(self.failed)

    async def wait(self, tid: str, timeout_s: float) -> ApiTask | None:
        """The task once it changed (or `timeout_s` passed): None if it is not there."""
        waiter = self._loop.create_future()
        self._waiters.setdefault(tid, []).append(waiter)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, timeout_s)
        if self.failed is not None:
            raise Unavailable(self.failed)
        return self.tasks.get(tid)

    async def until_finished(self, tid: str, timeout_s: float) -> ApiTask | None:
        deadline = time.monotonic() + timeout_s
        entry = self.tasks.get(tid)
        while (entry is None or not entry.finished) and time.monotonic() < deadline:
            entry = await self.wait(tid, deadline - time.monotonic())
        return entry

    # -- writing -------------------------------------------------------------------------------

    async def submit(self, task: dict[str, Any]) -> ApiTask:
        """Publish a validated task (unless the log holds it already) and return it once read
        back: the caller is answered for what the log holds, as any other process would be."""
        await self.caught_up()
        tid = task["task_id"]
        if tid not in self.tasks:
            task = {**task, "created_at_ms": task["created_at_ms"] or now_ms()}
            await self._send(self.settings.topics.tasks, tid, codec().encode(TASK, task))
        entry = self.tasks.get(tid)
        while entry is None:
            entry = await self.wait(tid, 5.0)
        return entry

    async def mark(self, tid: str, marker: str) -> None:
        """Record `marker` for `tid`, returning once it is read back (what this process
        answers next already reflects it)."""
        await self._send(self.settings.topics.seen, f"{MARKER}{marker}/{tid}", b"")
        while (marker, tid) not in self.marked:
            await self.wait(tid, 5.0)

    async def _send(self, topic: str, key: str, value: bytes) -> None:
        done: asyncio.Future[None] = self._loop.create_future()
        self._pending.append((topic, key, value, done))
        self._send_wake.set()
        await done

    async def _send_loop(self) -> None:
        while True:
            await self._send_wake.wait()
            self._send_wake.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            try:
                await asyncio.to_thread(self._commit, batch)
            except Exception as exc:  # every request of the batch learns it failed
                log.error("%s: sending %d records failed: %s", self.settings.prefix,
                          len(batch), exc)
                self._producer = None  # a fenced or broken producer is made anew
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for *_, done in batch:
                if not done.done():
                    done.set_result(None)

    def _commit(self, batch: list[tuple[str, str, bytes, Any]]) -> None:
        if self._producer is None:
            self._producer = transactional_producer(
                self.settings, process_id(self.settings, self.settings.topics.group("api")))
        with transaction(self._producer):
            for topic, key, value, _ in batch:
                produce(self._producer, topic, value, key=key)

    async def close(self) -> None:
        self._stop.set()
        for task in self._background:
            task.cancel()
        await asyncio.to_thread(self._thread.join, 5.0)
        self._ready.close()


def session_status(scored: ScoredTrajectory) -> str:
    """Polar's session status of an episode: ERROR when the infrastructure or the environment
    failed, else COMPLETED (an agent's bad answer is a completed session with its reward)."""
    return "ERROR" if scored["failure_class"] in ("infra", "env") else "COMPLETED"
