"""Who may call: a bearer token of a job (`rollstream jobs token`) reaches that job only.

The jobs come from the cluster's jobs topic, followed as they change, so a token created,
rotated or revoked there takes effect here within a poll. A request names its job by its token
(the root paths), or in its path (`/jobs/NAME/...`) where the token must be that job's; an API
started for one job (`--job`) refuses every other job's token. A token is never logged or put
in an answer: errors say which job, never which token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rollstream.api.joblog import GRACE_S, JobLog, Unavailable
from rollstream.config import Settings
from rollstream.contracts.events import Job
from rollstream.service import jobs
from rollstream.telemetry import health

log = logging.getLogger("rollstream.api")

# Headers that carry the token: the standard one, and Polar's control-plane header, which its
# CLI and trainer bridge send when POLAR_CONTROL_PLANE_TOKEN is set.
POLAR_TOKEN_HEADER = "X-Polar-Control-Token"
PUBLIC = ("/health",)


class Jobs:
    """The cluster's jobs as this process knows them, and one JobLog per job called for."""

    def __init__(self, settings: Settings, only: str | None = None,
                 grace_s: float = GRACE_S) -> None:
        self.settings = settings
        self.only = only
        self.grace_s = grace_s
        self.logs: dict[str, JobLog] = {}
        self.on_new_log: list[Callable[[JobLog], None]] = []
        self._reader = jobs.JobReader(settings)
        self._ready = health.component("api-jobs", f"reading {settings.topics.jobs}")
        self.caught_up = asyncio.Event()  # the jobs topic was read to its end once
        self._follow = asyncio.ensure_future(self._follow_loop())

    async def _follow_loop(self) -> None:
        while True:
            await asyncio.to_thread(self._reader.poll, 0.5)
            if self._reader.at_end and not self.caught_up.is_set():
                self._ready.ready()
                self.caught_up.set()
            # Every callable job's log is read back at start, not on its first call: its
            # unfinished callbacks resume at once.
            for job in list(self._reader.jobs.values()):
                if job["api_tokens"] and self.only in (None, job["name"]):
                    self.log_of(job)

    def job_of(self, token: str) -> Job | None:
        return jobs.job_of_token(self._reader.jobs.values(), token)

    def log_of(self, job: Job) -> JobLog:
        found = self.logs.get(job["name"])
        # A log that could not read its topics is made anew: they may exist by now.
        if found is None or found.failed or found.settings.prefix != job["prefix"]:
            if found is not None:
                asyncio.ensure_future(found.close())
            found = self.logs[job["name"]] = JobLog(jobs.job_settings(self.settings, job),
                                                    self.grace_s)
            for hook in self.on_new_log:
                hook(found)
        return found

    async def close(self) -> None:
        self._follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._follow
        for job_log in self.logs.values():
            await job_log.close()
        self._reader.close()
        self._ready.close()


def bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get(POLAR_TOKEN_HEADER) or None


def _refuse(status: int, detail: str) -> web.Response:
    return web.json_response({"detail": detail}, status=status,
                             headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)


def middleware(registry: Jobs) -> Callable[..., Any]:
    """Sets request["job"] and request["log"] from the token, or answers 401/403."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if request.path in PUBLIC:
            return await handler(request)
        token = bearer(request)
        if token is None:
            return _refuse(401, "no token: send `Authorization: Bearer TOKEN` with a token of "
                                "the job (`rollstream jobs token create JOB`)")
        await registry.caught_up.wait()  # a token is unknown only once every job was read
        job = registry.job_of(token)
        if job is None:
            return _refuse(401, "the token is not one of any job's (revoked, or mistyped)")
        named = request.match_info.get("job") or registry.only
        if named is not None and named != job["name"]:
            return _refuse(403, f"the token is not job {named}'s")
        request["job"] = job
        request["log"] = registry.log_of(job)
        try:
            return await handler(request)
        except Unavailable as exc:
            return _refuse(503, str(exc))

    return authenticate
