"""Polar's routes: `POST /rollout/task/submit`, `GET` and `DELETE /rollout/task/{task_id}`, the
server-sent event stream `GET /events`, `GET /health`; and its result callbacks.

A submit is accepted once the task is committed to the job's tasks topic; the same task_id
again is the same task (its status is answered, no second rollout). Polling reads the log and
always works. A callback (`callback_url`) is POSTed when the task is over, with the header
`X-Rollstream-Result-Id` (the task_id) so a receiver can drop a second copy: it is retried with
backoff until a 2xx, then recorded on the log as delivered; a process that restarts, or another
process, delivers what is not recorded (at least once, where Polar tries once).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
from aiohttp import web

from rollstream.api import polar_protocol as protocol
from rollstream.api.joblog import (
    CALLED_BACK,
    CANCELLED,
    SUBSCRIBER_QUEUE,
    ApiTask,
    JobLog,
    task_id,
    timestamp,
)
from rollstream.api.serving import Refused, Validator, body, job_log, running_job, validated
from rollstream.telemetry import metrics

logger = logging.getLogger("rollstream.api")

RESULT_ID_HEADER = "X-Rollstream-Result-Id"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "Connection": "keep-alive", "X-Accel-Buffering": "no"}
PING_S = 15.0
CALLBACK_TIMEOUT_S = 10.0


class ServingPolar:
    def __init__(self, validate: Validator, *, callback_attempts: int = 12,
                 callback_backoff_s: float = 0.5) -> None:
        self.validate = validate
        self.callback_attempts = callback_attempts
        self.callback_backoff_s = callback_backoff_s
        self._delivering: set[tuple[int, str]] = set()  # (the log's id, task id)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/rollout/task/submit", self.submit),
                ("GET", "/rollout/task/{task_id}", self.get),
                ("DELETE", "/rollout/task/{task_id}", self.delete),
                ("GET", "/events", self.events)]

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "nodes": 0})

    async def submit(self, request: web.Request) -> web.Response:
        call = await body(request, protocol.TaskRequest)
        log = running_job(request)
        tid = task_id("polar", call.task_id)
        await log.caught_up()
        if tid not in log.tasks and log.cancelled_before(tid):
            raise Refused(409, f"task {call.task_id} was cancelled before submission")
        task = validated(self.validate, lambda: protocol.to_task(call, tid))
        known = log.tasks.get(tid)
        await log.submit(task)
        metrics.api_task("polar")
        # A new task is running when accepted (it may be over by the time it is read back); a
        # known one is answered as it is.
        status = "running" if known is None else known.status()
        return web.json_response({"task_id": call.task_id, "status": status})

    async def _known(self, request: web.Request) -> tuple[JobLog, str, ApiTask | None]:
        log = job_log(request)
        await log.caught_up()
        tid = task_id("polar", request.match_info["task_id"])
        return log, tid, log.tasks.get(tid)

    async def get(self, request: web.Request) -> web.Response:
        _, _, entry = await self._known(request)
        if entry is None:
            raise Refused(404, "Task not found")
        return web.json_response(protocol.task_status(entry))

    async def delete(self, request: web.Request) -> web.Response:
        log, tid, entry = await self._known(request)
        caller_id = request.match_info["task_id"]
        if entry is None:
            if request.query.get("register_if_missing", "false").lower() not in ("1", "true"):
                raise Refused(404, "Task not found")
            await log.mark(tid, CANCELLED)  # a later submit of the id is refused (409)
            return web.json_response({"task_id": caller_id, "status": "cancelled",
                                      "total_sessions": 0, "completed_sessions": 0,
                                      "results": [], "result_paths": []})
        if not entry.finished:  # once read back it is cancelled, or it was done first
            await log.mark(tid, CANCELLED)
        return web.json_response(protocol.task_status(entry))

    async def events(self, request: web.Request) -> web.StreamResponse:
        log = job_log(request)
        await log.caught_up()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=SUBSCRIBER_QUEUE)
        log.subscribers.add(queue)
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await response.prepare(request)
            await _frame(response, {"type": "hello", "data": {}})
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), PING_S)
                except TimeoutError:
                    event = {"type": "ping", "data": {}}
                await _frame(response, event)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away
        finally:
            log.subscribers.discard(queue)
        return response

    # -- callbacks ---------------------------------------------------------------------------

    def watch(self, joblog: JobLog) -> None:
        """Deliver the callbacks of a job's Polar tasks (called once per JobLog, as it is
        made: a restarted process resumes them before any call)."""
        joblog.on_finished.append(lambda entry: self._finished(joblog, entry))

    def _finished(self, joblog: JobLog, entry: ApiTask) -> None:
        if entry.dialect != "polar" or not entry.meta.get("api.callback_url"):
            return
        key = (id(joblog), entry.task["task_id"])
        if key in self._delivering:
            return
        self._delivering.add(key)
        task = asyncio.ensure_future(self._deliver(joblog, entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, joblog: JobLog, entry: ApiTask) -> None:
        """POST the task's result until a 2xx (at most `callback_attempts` tries, backing off),
        then record it delivered. Markers read back at start are waited for first, so a
        restarted process does not repeat what the log says was delivered."""
        await joblog.caught_up()
        if entry.called_back:
            return
        url = entry.meta["api.callback_url"]
        payload = protocol.task_result(entry)
        headers = {RESULT_ID_HEADER: entry.caller_id}
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=CALLBACK_TIMEOUT_S))
        for attempt in range(self.callback_attempts):
            if entry.called_back:  # another process delivered it meanwhile
                return
            try:
                async with self._session.post(url, json=payload, headers=headers) as answer:
                    if answer.status < 300:
                        await joblog.mark(entry.task["task_id"], CALLED_BACK)
                        metrics.api_callback(True)
                        return
                    reason = f"HTTP {answer.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = type(exc).__name__
            metrics.api_callback(False)
            delay = min(60.0, self.callback_backoff_s * 2 ** attempt)
            logger.warning("callback of task %s to %s failed (%s); attempt %d of %d, next in "
                        "%.1f s", entry.caller_id, url, reason, attempt + 1,
                        self.callback_attempts, delay)
            await asyncio.sleep(delay)
        logger.error("callback of task %s to %s given up after %d attempts; polling has it",
                  entry.caller_id, url, self.callback_attempts)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()


async def _frame(response: web.StreamResponse, event: dict[str, Any]) -> None:
    if "ts" not in event:
        event = {"type": event["type"], "ts": timestamp(), "data": event["data"]}
    await response.write(f"data: {json.dumps(event, default=str)}\n\n".encode())
