"""ProRL Agent's routes: `/start`, `/stop`, `/status`, `/add_llm_server`, `/clear_llm_server`,
`/process` (one trajectory, blocking) and `/cancel`.

The pipeline runs whether or not a caller "started" it, and its state is the log's, so `/start`
and `/stop` only acknowledge (a `/stop` cancels nothing: a caller that comes back with the same
`job_id` gets its result). `/add_llm_server` and `/clear_llm_server` set the job's own
inference servers (its `policy_urls`), which the fleet serving the job follows, unless the API
runs with `--fixed-llm-servers`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from rollstream.api import prorl_protocol as protocol
from rollstream.api.joblog import CANCELLED, task_id
from rollstream.api.serving import Refused, Validator, body, job_log, running_job, validated
from rollstream.config import Settings
from rollstream.service import jobs
from rollstream.telemetry import metrics


class ServingProrl:
    def __init__(self, settings: Settings, validate: Validator, *, timeout_s: float,
                 fixed_llm_servers: bool) -> None:
        self.settings = settings
        self.validate = validate
        self.timeout_s = timeout_s
        self.fixed_llm_servers = fixed_llm_servers
        self.pending: dict[str, int] = {}  # /process calls this process holds open, per job

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/start", self.start), ("POST", "/stop", self.stop),
                ("GET", "/status", self.status), ("POST", "/cancel", self.cancel),
                ("POST", "/add_llm_server", self.add_llm_server),
                ("POST", "/clear_llm_server", self.clear_llm_server),
                ("POST", "/process", self.process)]

    async def start(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "Server started successfully"})

    async def stop(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "Server stopped successfully"})

    async def status(self, request: web.Request) -> web.Response:
        log = job_log(request)
        await log.caught_up()
        unfinished = sum(1 for t in log.tasks.values()
                         if t.dialect == "prorl" and not t.finished)
        return web.json_response({"status": "running",
                                  "pending_jobs": self.pending.get(request["job"]["name"], 0),
                                  "running": request["job"]["state"] == "RUNNING",
                                  "jobs": unfinished})

    async def cancel(self, request: web.Request) -> web.Response:
        cancel = await body(request, protocol.CancelRequest)
        log = job_log(request)
        await log.caught_up()
        entry = log.tasks.get(task_id("prorl", cancel.job_id))
        # An unknown or finished job is acknowledged as ProRL does, and nothing is recorded: a
        # later /process with that id must not be born cancelled.
        if entry is not None and not entry.finished:
            await log.mark(entry.task["task_id"], CANCELLED)
        return web.json_response({"status": f"Cancel requested for job {cancel.job_id}"})

    async def add_llm_server(self, request: web.Request) -> web.Response:
        address = (await body(request, protocol.LLMServerRequest)).address
        if self.fixed_llm_servers:
            return web.json_response({"status": f"Ignored LLM server address: {address} (this "
                                                "API's jobs keep the servers their job names)"})
        url = address.rstrip("/").removesuffix("/v1")
        await self._set_servers(request, lambda urls: [*urls, url] if url not in urls else urls,
                                "add LLM server")
        return web.json_response({"status": f"Added LLM server address: {address}"})

    async def clear_llm_server(self, request: web.Request) -> web.Response:
        if self.fixed_llm_servers:
            return web.json_response({"status": "Ignored: this API's jobs keep the servers "
                                                "their job names"})
        await self._set_servers(request, lambda urls: [], "clear LLM servers")
        return web.json_response({"status": "Cleared all LLM server addresses"})

    async def _set_servers(self, request: web.Request, change: Any, what: str) -> None:
        name = request["job"]["name"]

        def write() -> None:
            cluster = self.settings
            job = jobs.get(cluster, name)  # the record now, not this process's copy
            updated = {**job, "policy_urls": change(job["policy_urls"]),
                       "updated_at_ms": jobs.now_ms()}
            jobs.put(cluster, jobs.validate(updated, cluster.prefix))  # type: ignore[arg-type]

        try:
            await asyncio.to_thread(write)
        except jobs.JobError as exc:
            raise Refused(500, f"Failed to {what}: {exc}") from None

    async def process(self, request: web.Request) -> web.Response:
        call = await body(request, protocol.ProcessRequest)
        log = running_job(request)
        tid = protocol.process_task_id(call)
        task = validated(self.validate, lambda: protocol.to_task(call, tid))
        name = request["job"]["name"]
        self.pending[name] = self.pending.get(name, 0) + 1
        try:
            await log.submit(task)
            metrics.api_task("prorl")
            entry = await log.until_finished(tid, self.timeout_s)
        finally:
            self.pending[name] -= 1
        if entry is None or not entry.finished:
            raise Refused(504, f"Processing timed out after {self.timeout_s:g} s; job "
                               f"{tid.partition(':')[2]} goes on: call /process again with the "
                               "same job_id for its result")
        return web.json_response(protocol.result(entry))
