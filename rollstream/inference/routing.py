"""Routing RUN's inference calls across N vLLM-compatible servers.

- Affinity: an episode is pinned to one server for all its turns, so that server's prefix cache
  holds its conversation; it moves only when its server is down, removed or ejected (then the
  next server gets the whole token history, which every request carries anyway).
- Balance: a new episode goes to the usable server with the least live load: the episodes this
  process has pinned there, plus the requests other clients have on it (`vllm:num_requests_
  running` + `vllm:num_requests_waiting` from /metrics, less ours), plus `vllm:kv_cache_usage_
  perc` to break ties; then the fewest episodes ever assigned, so equal servers take turns.
- Cap: at most `max_episodes` episodes pinned per server (each has at most one request in
  flight, so this also caps in-flight requests). `capacity()` is how many more episodes fit;
  at 0 RUN's runtime pauses its partitions instead of queueing. An episode moved off a dead
  server may take its new server over the cap: it was admitted already.
- Health: every `health_interval_s`, /health, /metrics and /v1/models of every server, and the
  server list itself is re-read (servers can be added and removed while running). A refused
  connection ejects a server at once; `EJECT_AFTER` consecutive failed requests (5xx, timeouts)
  eject it too, until a later health check finds it answering again.
- Jobs: a router serves one job's episodes; `adapter` is the job's LoRA adapter base name on
  shared servers. Every request names that job's newest adapter on the server
  (`<adapter>-v<N>`, rollstream.contracts.wire), never another job's. Until a server lists a
  first one (a new job, before its trainer's first version), the job samples the servers' base
  model: its turns record no adapter and policy version 0. From then on a server that lists
  none of the job's adapters is not usable for the job (it takes none of its episodes, and
  `capacity()` counts it as full), and when no healthy server has one, a turn waits for the
  controller to load it as it waits out a weight update, rather than failing as infra. Which
  adapter a server lacks is logged once per server and adapter. With no `adapter` (the
  default) a server's newest `rollstream-policy-v<N>`, or else its base model, serves.
- Policy version: a response's `X-Rollstream-Policy-Version` header (embedded server, or vLLM
  with rollstream.vllm_middleware) is exact. A server with Rollstream LoRA adapters is sent the
  newest adapter by name, and that adapter's version is the turn's. vLLM 0.33's own labels
  (`choices[].weight_versions`, set by the controller) come next. vLLM 0.32 has the label
  (`GET /weight_info`) but does not put it on responses: the label is read before a request is
  sent and again after its response, and a turn is stamped only when both reads agree. The
  controller sets a label only after the reload, while the server is paused, and resumes after,
  so equal reads mean every token was sampled by the weights they name; reads that differ (the
  turn straddled an update) are `VersionUnknown`. A server that stamped its
  responses before and sends one without a stamp is inside a weight update: `VersionUnknown`,
  and RUN samples the turn again. A server that never stamps gives -1 (unknown), never a guess.
  Update windows (`VersionUnknown`, a paused vLLM's 503) do not count as server failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollstream.config import InferenceSettings
from rollstream.contracts.codec import Ids
from rollstream.contracts.wire import check_adapter, lora_version
from rollstream.inference.client import (
    BadRequest,
    Completion,
    InferenceClient,
    InferenceError,
    ServerError,
    ServerUpdating,
)
from rollstream.telemetry import metrics

log = logging.getLogger("rollstream.inference.routing")

EJECT_AFTER = 3  # consecutive failed requests that take a server out of rotation
UNKNOWN_VERSION = -1


class NoServer(ServerError):
    """No usable inference server right now (all down, ejected or removed)."""


class VersionUnknown(ServerUpdating):
    """The response came from a server in the middle of a weight update: sample it again."""


class AdapterMissing(ServerUpdating):
    """No healthy server holds the job's adapter (not loaded yet, or just unloaded): wait for
    the controller, as for a weight update; not a failing server."""


def labelled_version(spans: Sequence[Mapping[str, Any]]) -> int:
    """The turn's version from vLLM's `weight_versions` spans. A turn paused (`mode=keep`)
    across an update has two spans; it records the oldest, so staleness is never understated
    (its logprobs are still each token's own). A label that is not a number (vLLM's initial
    "default") is unknown."""
    labels = [str(span.get("version")) for span in spans]
    if not all(label.isdigit() for label in labels):
        return UNKNOWN_VERSION
    return min(int(label) for label in labels)


@dataclass
class Server:
    url: str
    client: InferenceClient
    needs_adapter: bool = False  # the job has an adapter version: only servers with one serve
    healthy: bool = False  # until the first health check or successful request says otherwise
    removed: bool = False  # no longer listed: takes no new episodes, finishes its requests
    episodes: int = 0  # episodes pinned here now
    assigned: int = 0  # episodes ever pinned here (ties go to the least used)
    in_flight: int = 0
    failures: int = 0  # consecutive failed requests
    foreign: float = 0.0  # other clients' running + waiting requests at the last scrape
    kv_usage: float = 0.0
    lora: tuple[str, int] | None = None  # the job's newest adapter: (model name, version)
    # vLLM's weight label at the last completed read of /weight_info; None: no such route.
    weight_label: str | None = None
    stamps_versions: bool = False

    @property
    def usable(self) -> bool:
        return self.healthy and not self.removed and not self.lacks_adapter

    @property
    def lacks_adapter(self) -> bool:
        return self.needs_adapter and self.lora is None

    def score(self) -> tuple[float, int]:
        return self.episodes + self.foreign + self.kv_usage, self.assigned


class Router:
    def __init__(
        self,
        urls: Sequence[str] | Callable[[], Sequence[str]],
        *,
        max_episodes: int = 64,
        timeout_s: float = 60.0,
        health_interval_s: float = 2.0,
        adapter: str = "",
        job: str = "",
    ) -> None:
        """`adapter`: the job's adapter (only servers listing `<adapter>-v<N>` serve it once one
        does); `job`: its name, which labels what the router reports of that adapter."""
        self._urls = urls if callable(urls) else (lambda: list(urls))
        self.adapter = check_adapter(adapter)
        self.max_episodes = max_episodes
        self.timeout_s = timeout_s
        self.health_interval_s = health_interval_s
        self.servers: dict[str, Server] = {}
        self.pins: dict[str, Server] = {}  # episode id → its server
        self.migrations = 0
        # The job's newest adapter any server listed so far (version, name); None: none yet,
        # so the job samples the base model.
        self.newest_adapter: tuple[int, str] | None = None
        self._lack_logged: set[tuple[str, str]] = set()  # (server, adapter) said once
        self.job = job
        self._lacking: dict[tuple[str, str], int] = {}  # (server, adapter) → the gauge's value
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, settings: InferenceSettings, adapter: str = "", job: str = "") -> Router:
        """A router over the servers `settings` name (re-read as their file changes), with
        their bounds, timeout and health interval."""
        return cls(settings.policy_urls, max_episodes=settings.server_max_in_flight,
                   timeout_s=settings.request_timeout_s,
                   health_interval_s=settings.health_interval_s, adapter=adapter, job=job)

    async def start(self) -> None:
        await self.check()
        self._task = asyncio.create_task(self._health_loop(), name="router-health")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for server in self.servers.values():
            await server.client.close()
        self._report_lacking({})

    # -- admission -------------------------------------------------------------------------

    def capacity(self) -> int:
        """How many more episodes the usable servers take before every one is at its cap."""
        return sum(max(0, self.max_episodes - s.episodes)
                   for s in self.servers.values() if s.usable)

    def slots(self) -> int:
        """How many episodes the usable servers take at once, at their caps."""
        return self.max_episodes * sum(1 for s in self.servers.values() if s.usable)

    def pin(self, episode_id: str, prefer: str | None = None) -> Server | None:
        """The episode's server: its current one while usable, else `prefer` (where a resumed
        episode ran before) if usable, else the least loaded one with room (None: none now)."""
        current = self.pins.get(episode_id)
        if current is not None and current.usable:
            return current
        wanted = self.servers.get(prefer or "")
        if current is None and wanted is not None and wanted.usable:
            return self._move(episode_id, wanted)
        usable = [s for s in self.servers.values() if s.usable]
        if not usable:
            return None
        # Prefer servers below the cap; a moving episode takes the least loaded regardless.
        roomy = [s for s in usable if s.episodes < self.max_episodes]
        return self._move(episode_id, min(roomy or usable, key=Server.score))

    def release(self, episode_id: str) -> None:
        server = self.pins.pop(episode_id, None)
        if server is not None:
            server.episodes -= 1

    def _move(self, episode_id: str, server: Server) -> Server:
        old = self.pins.get(episode_id)
        if old is not None:
            old.episodes -= 1
            self.migrations += 1
            metrics.migrated(old.url)
            log.info("episode %s moves from %s to %s", episode_id, old.url, server.url)
        self.pins[episode_id] = server
        server.episodes += 1
        server.assigned += 1
        return server

    # -- requests --------------------------------------------------------------------------

    async def complete(self, episode_id: str, prompt_ids: Ids,
                       sampling: Mapping[str, Any], stop_token_ids: Sequence[int]) -> Completion:
        """One attempt on the episode's server. Raises ServerError (retryable: the caller
        backs off and calls again, possibly landing on another server) or InferenceError."""
        server = self.pin(episode_id)
        if server is None:
            if any(s.lacks_adapter and s.healthy for s in self.servers.values()):
                raise AdapterMissing(f"no healthy server holds a {self.adapter}-v<N> adapter yet")
            raise NoServer("no usable inference server (all down, ejected or removed)")
        lora = server.lora
        label_before = server.weight_label
        server.in_flight += 1
        started = time.monotonic()
        try:
            completion = await server.client.complete(
                prompt_ids, sampling, stop_token_ids, model=lora[0] if lora else None)
        except ServerError as exc:
            self._failed(server, exc)
            metrics.inference_request(server.url, ok=False)
            raise
        except BadRequest as exc:
            if lora is None or exc.status != 404:
                raise
            # The adapter went between two health checks: this server is no longer of use to
            # the job; the turn is sampled again where the adapter is.
            if server.lora == lora:
                server.lora = None
            raise AdapterMissing(f"{lora[0]} is gone: {exc}", server=server.url) from exc
        finally:
            server.in_flight -= 1
            metrics.server_time(time.monotonic() - started)  # the job's share of server time
        server.failures = 0
        server.healthy = True
        metrics.inference_request(server.url, ok=True)
        completion.adapter = lora[0] if lora else None
        if self.adapter and lora is None:
            completion.policy_version = 0  # the base model, before the job's first version
        elif completion.policy_version is not None:
            server.stamps_versions = True
        elif lora is not None:
            completion.policy_version = lora[1]  # the adapter the request named
        elif completion.weight_versions:
            completion.policy_version = labelled_version(completion.weight_versions)
        elif label_before is not None:
            completion.policy_version = await self._bracketed_version(server, label_before)
        elif server.stamps_versions:
            raise VersionUnknown("response without a policy version: weights being updated",
                                 server=server.url)
        else:
            completion.policy_version = UNKNOWN_VERSION
        return completion

    async def _bracketed_version(self, server: Server, before: str) -> int:
        """The version of a turn from labels read around it (module doc): `before`, read
        before the request was sent, and a read begun after its response."""
        try:
            after = await server.client.weight_label()
        except InferenceError as exc:
            raise VersionUnknown(f"weight label unreadable after the turn: {exc}",
                                 server=server.url) from exc
        if after is not None:
            server.weight_label = after
        if after != before:
            raise VersionUnknown(f"weights changed during the turn ({before!r} -> {after!r})",
                                 server=server.url)
        return labelled_version([{"version": after}])

    def _failed(self, server: Server, exc: ServerError) -> None:
        if isinstance(exc, ServerUpdating):
            return  # a weight update, not a failing server
        server.failures += 1
        if server.healthy and (exc.unreachable or server.failures >= EJECT_AFTER):
            server.healthy = False
            log.warning("server %s out of rotation: %s", server.url, exc)

    # -- health and the server list ---------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check()
            except Exception:  # a bug here must not stop routing; the next round tries again
                log.exception("health check failed")

    async def check(self) -> None:
        """Re-read the server list, then every server's health, load and models."""
        listed = list(dict.fromkeys(u.rstrip("/") for u in self._urls()))
        for url in listed:
            if url not in self.servers:
                self.servers[url] = Server(url, InferenceClient(url, timeout_s=self.timeout_s),
                                           needs_adapter=self.newest_adapter is not None)
                log.info("server %s added", url)
            self.servers[url].removed = False
        for url, server in list(self.servers.items()):
            if url not in listed and not server.removed:
                server.removed = True
                log.info("server %s removed; its episodes move at their next turn", url)
            if server.removed and server.in_flight == 0 and server.episodes == 0:
                del self.servers[url]
                await server.client.close()
        await asyncio.gather(*(self._probe(s) for s in self.servers.values() if not s.removed))
        if self.adapter:
            self._adapters_seen()

    def _adapters_seen(self) -> None:
        """Once a server lists one of the job's adapters, servers without one are of no use to
        the job; say once per server and adapter which one a server lacks."""
        listed = [s.lora for s in self.servers.values() if s.lora is not None]
        newest = max(((v, name) for name, v in listed), default=None)
        if newest is not None and (self.newest_adapter is None or newest > self.newest_adapter):
            self.newest_adapter = newest
        wanted = (self.newest_adapter[1] if self.newest_adapter is not None
                  else f"{self.adapter}-v<N>")
        lacking: dict[tuple[str, str], int] = {}
        for server in self.servers.values():
            server.needs_adapter = self.newest_adapter is not None
            if not server.healthy or server.removed or server.lora is not None:
                continue
            lacking[(server.url, wanted)] = int(self.newest_adapter is not None)
            if (server.url, wanted) in self._lack_logged:
                continue
            self._lack_logged.add((server.url, wanted))
            if self.newest_adapter is None:
                log.info("server %s lists no %s adapter yet: the job samples its base model "
                         "(policy version 0) until the controller loads the job's first version",
                         server.url, wanted)
            else:
                log.warning("server %s lacks %s (the job's newest adapter): not usable for this "
                            "job until the controller loads it", server.url, wanted)
        self._report_lacking(lacking)

    def _report_lacking(self, lacking: dict[tuple[str, str], int]) -> None:
        for url, adapter in self._lacking.keys() - lacking.keys():
            metrics.ADAPTER_LACKING.remove(url, adapter, self.job)
        for (url, adapter), value in lacking.items():
            metrics.ADAPTER_LACKING.labels(url, adapter, self.job).set(value)
        self._lacking = lacking

    async def _probe(self, server: Server) -> None:
        try:
            healthy = await server.client.healthy()
            load = await server.client.load() if healthy else {}
            models = await server.client.models() if healthy else []
            label = await server.client.weight_label() if healthy else None
        except InferenceError as exc:
            healthy, load, models, label = False, {}, [], None
            log.debug("probe of %s failed: %s", server.url, exc)
        if healthy != server.healthy:
            log.info("server %s %s", server.url, "healthy" if healthy else "unhealthy")
        server.healthy = healthy
        if healthy:
            server.failures = 0
        reported = load.get("running", 0.0) + load.get("waiting", 0.0)
        server.foreign = max(0.0, reported - server.in_flight)
        server.kv_usage = load.get("kv_usage", 0.0)
        adapters = [(lora_version(str(m.get("id", "")), self.adapter), str(m.get("id")))
                    for m in models]
        newest = max(((v, name) for v, name in adapters if v is not None), default=None)
        held = server.lora
        server.lora = (newest[1], newest[0]) if newest else None
        if healthy and server.lora is not None and held is None:
            log.info("server %s holds %s: usable for this job", server.url, server.lora[0])
        if healthy:
            server.weight_label = label
        metrics.server_probed(server)
