"""The API's application: each endpoint group's routes at the root (the job is the token's) and
under `/jobs/{job}` (the job is named, and the token must be its), behind the token check; and
the process that serves it (HTTP, or HTTPS given a certificate)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rollstream.api import access
from rollstream.api.serving import Validator
from rollstream.api.serving_polar import ServingPolar
from rollstream.api.serving_prorl import ServingProrl
from rollstream.config import Settings
from rollstream.telemetry import health, metrics

log = logging.getLogger("rollstream.api")

JOB_PATH = "/jobs/{job}"


@web.middleware
async def count(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Requests by route (its pattern, never the path: a path holds caller ids) and status."""
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "(none)"
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        metrics.api_request(name, exc.status)
        raise
    metrics.api_request(name, response.status)
    return response


def build_app(registry: access.Jobs, prorl: ServingProrl, polar: ServingPolar) -> web.Application:
    app = web.Application(middlewares=[count, access.middleware(registry)],
                          client_max_size=16 << 20)
    app.router.add_get("/health", polar.health)
    for base in ("", JOB_PATH):
        for method, path, handler in [*prorl.routes(), *polar.routes()]:
            app.router.add_route(method, base + path, handler)
    return app


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"rollstream api: cannot load --tls-cert {cert} / --tls-key {key}: "
                         f"{exc}") from None
    return context


class ApiServer:
    """`rollstream api`: serves until `stop()`."""

    def __init__(self, settings: Settings, validate: Validator, *, host: str, port: int,
                 job: str | None, timeout_s: float, fixed_llm_servers: bool,
                 callback_attempts: int, deadline_grace_s: float,
                 tls: ssl.SSLContext | None) -> None:
        self.settings = settings
        self.host, self.port, self.job, self.tls = host, port, job, tls
        self.deadline_grace_s = deadline_grace_s
        self.prorl = ServingProrl(settings, validate, timeout_s=timeout_s,
                                  fixed_llm_servers=fixed_llm_servers)
        self.polar = ServingPolar(validate, callback_attempts=callback_attempts)
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        self._stopped.set()

    async def serve(self) -> None:
        registry = access.Jobs(self.settings, only=self.job, grace_s=self.deadline_grace_s)
        registry.on_new_log.append(self.polar.watch)
        runner = web.AppRunner(build_app(registry, self.prorl, self.polar))
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.tls)
        await site.start()
        health.component("api").ready()
        scheme = "https" if self.tls else "http"
        bound = runner.addresses[0][1] if runner.addresses else self.port
        log.info("API on %s://%s:%s for %s", scheme, self.host, bound,
                 f"job {self.job}" if self.job else f"the jobs of {self.settings.topics.jobs}")
        try:
            await self._stopped.wait()
        finally:
            await runner.cleanup()
            await self.polar.close()
            await registry.close()
