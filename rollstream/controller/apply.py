"""The inference controller: applies each PolicyVersion on <p>.policy to every inference server.

`apply_policy(event, servers, adapter=...)` is the whole mechanism, per server:
- LoRA (`kind: lora`): `POST /v1/load_lora_adapter` under the name `<adapter>-v<N>`
  (rollstream.contracts.wire; `rollstream-policy-v<N>` when the job names no adapter; vLLM needs
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), with `load_inplace` where that name is loaded already
  (its weights are replaced). RUN sends requests to the job's newest adapter by name, so a
  turn's version is the adapter it named. The job's adapters older than the previous one are
  unloaded; other jobs' adapters are never touched.
- A job with its own adapter on shared servers (`--adapter NAME`): on vLLM only LoRA versions
  apply (full weights would replace the base model every job shares, so they are refused);
  on the embedded server a full weight set is loaded as the job's adapter
  (`/v1/load_lora_adapter`: an embedded "adapter" is a whole tiny model).
- full weights, embedded policy server: `POST /v1/load_weights {path, version}`; the server
  drains its running batch on the old weights before it swaps.
- full weights, vLLM (VLLM_SERVER_DEV_MODE=1), by what the server is (`GET /version`,
  `GET /weight_info`):
  - vLLM 0.32+ (the weight label routes exist): `/pause?mode=keep` (requests queue rather
    than fail) → `/collective_rpc reload_weights {weights_path}` → `/reset_prefix_cache` →
    `/update_weight_version {new_version: "N"}` → `/resume`. From 0.33 responses carry native
    `choices[].weight_versions`; on 0.32 RUN's router reads `/weight_info` around each request
    instead (the label is set only inside the pause, after the reload: see routing). No
    middleware is needed (and none would be right with several API-server processes).
  - vLLM 0.12: its `reload_weights()` takes no arguments and re-reads the path the server was
    started from, so full reloads work in place only: the trainer writes each checkpoint to
    that path and publishes it as the event's `uri`; any other `uri` is refused before anything
    is paused (use LoRA, or vLLM 0.33). `/pause?wait_for_inflight_requests=true` → clear the
    stamp → `reload_weights` → `/reset_prefix_cache` → stamp N → `/resume`, where the stamp is
    rollstream.vllm_middleware's; a failed reload puts the previous stamp back.
  Without the middleware or native labels, responses carry no version and RUN records -1
  (unknown) rather than a guess.

`rollstream controller` runs it as a service for one job (its prefix and `--adapter`): it
reads <p>.policy from the beginning (the topic holds one small event per trainer step, and the
newest version is the one every server must have), never rolls a server back to an older
version, and every `health_interval_s` re-applies the newest version to servers that do not
report it (one that was down, or newly listed in `policy_url_file`; for a job's adapter, also
one that lost it).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from rollstream import config
from rollstream.contracts.wire import VERSION_PATH, check_adapter, lora_name, lora_version
from rollstream.telemetry import health, metrics

log = logging.getLogger("rollstream.controller")


class ApplyError(RuntimeError):
    """A server refused or failed a step of a weight update; the message names the step."""


class WrongCheckpoint(SystemExit):
    """A server refuses the published checkpoint as the wrong kind (it will every time): the
    controller stops with this one message (a SystemExit: no retrying handler holds it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Applied:
    server: str
    version: int
    ok: bool
    detail: str  # the steps taken, or why it failed


async def apply_policy(
    event: Mapping[str, Any],
    servers: Sequence[str],
    *,
    session: aiohttp.ClientSession | None = None,
    timeout_s: float = 600.0,
    adapter: str = "",
) -> list[Applied]:
    """Apply one PolicyVersion event of the job whose adapter base name is `adapter` ("": the
    default) to every server, concurrently; one result per server.

    A server that fails does not stop the others: the caller retries it (the service does)."""
    check_adapter(adapter)
    own = session is None
    session = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    try:
        return list(await asyncio.gather(*(_apply(session, url, event, adapter)
                                           for url in servers)))
    finally:
        if own:
            await session.close()


async def current_version(session: aiohttp.ClientSession, url: str,
                          adapter: str = "") -> int | None:
    """The policy version a server reports it serves the job of `adapter`: the newest of the
    job's LoRA adapters it lists; for the default job, else vLLM's native weight label (when it
    is a number), else its version stamp (embedded server, or vLLM with the middleware); None
    if it reports none or cannot be reached."""
    try:
        models = await _call(session, "GET", url, "/v1/models")
        adapters = [lora_version(str(m.get("id", "")), adapter) for m in models.get("data", [])]
        versions = [v for v in adapters if v is not None]
        if versions or adapter:  # a job's own adapter: the base model's version is not its
            return max(versions, default=None)
        info = await _call(session, "GET", url, "/weight_info", missing_ok=True)
        if isinstance(info, dict):
            label = str(info.get("weight_version"))
            return int(label) if label.isdigit() else None
        stamp = await _call(session, "GET", url, VERSION_PATH, missing_ok=True)
    except (aiohttp.ClientError, TimeoutError, ApplyError, AttributeError):
        return None
    return stamp.get("version") if isinstance(stamp, dict) else None


async def _apply(session: aiohttp.ClientSession, url: str, event: Mapping[str, Any],
                 adapter: str) -> Applied:
    started = time.monotonic()
    applied = await _apply_steps(session, url, event, adapter)
    metrics.policy_update(url, applied.ok, time.monotonic() - started)
    return applied


async def _apply_steps(session: aiohttp.ClientSession, url: str,
                       event: Mapping[str, Any], adapter: str) -> Applied:
    version = int(event["version"])
    try:
        models = await _call(session, "GET", url, "/v1/models")
        embedded = any(m.get("owned_by") == "rollstream" for m in models.get("data", []))
        if event.get("kind", "full") == "lora":
            if embedded:
                raise ApplyError("the embedded policy server has no LoRA support: its adapters "
                                 "are full weight sets (publish kind full with --adapter)")
            detail = await _load_lora(session, url, version, event["uri"], models, adapter)
        elif embedded:
            try:
                if adapter:
                    detail = await _load_lora(session, url, version, event["uri"], models,
                                              adapter)
                else:
                    await _call(session, "POST", url, "/v1/load_weights",
                                {"path": event["uri"], "version": version})
                    detail = "load_weights"
            except ApplyError as exc:
                # A checkpoint of the other kind is refused every time: stop, saying which
                # server loads it, rather than asking again at every health check. (A missing
                # .safetensors file may still be on its way, so that one is retried.)
                uri = str(event["uri"])
                if "HTTP 400" in str(exc) and ("not a Rollstream policy checkpoint" in str(exc)
                                               or not uri.endswith(".safetensors")):
                    raise WrongCheckpoint(
                        f"policy v{version}: {url} is the embedded policy server, which loads "
                        "Rollstream policy checkpoints (one .safetensors file, as `rollstream "
                        f"train` writes them); {uri} is not one. A Hugging Face checkpoint "
                        "(a save_pretrained directory, as `rollstream train --hf-model` and "
                        "the TRL adapter write) is loaded by vLLM: serve the model with vLLM "
                        "and list it in --policy-url (docs/inference.md). The server "
                        f"answered: {exc}") from exc
                raise
        elif adapter:
            raise ApplyError(f"job adapter {adapter!r}: full weights would replace the base "
                             f"model every job on this server shares; publish LoRA versions")
        else:
            detail = await _reload_vllm(session, url, version, event["uri"], models)
    except (aiohttp.ClientError, TimeoutError, ApplyError) as exc:
        log.warning("policy v%d on %s failed: %s", version, url, exc)
        return Applied(url, version, False, f"{type(exc).__name__}: {exc}")
    log.info("policy v%d on %s: %s", version, url, detail)
    return Applied(url, version, True, detail)


async def _load_lora(session: aiohttp.ClientSession, url: str, version: int, uri: str,
                     models: Any, adapter: str) -> str:
    name = lora_name(version, adapter)
    loaded = {str(m.get("id")) for m in models.get("data", [])}
    body: dict[str, Any] = {"lora_name": name, "lora_path": uri}
    if name in loaded:
        body["load_inplace"] = True  # this version's weights again, e.g. republished
    await _call(session, "POST", url, "/v1/load_lora_adapter", body)
    # Keep the previous adapter: RUN may still have requests naming it in flight. Only this
    # job's: another job's adapters never parse as this job's versions.
    stale = sorted(m for m in loaded
                   if (v := lora_version(m, adapter)) is not None and v < version - 1)
    for old in stale:
        await _call(session, "POST", url, "/v1/unload_lora_adapter", {"lora_name": old})
    return (f"load_lora_adapter {name}" + (" in place" if name in loaded else "")
            + (f", unloaded {', '.join(stale)}" if stale else ""))


@dataclass(frozen=True)
class VllmServer:
    """What a vLLM server supports for a full-weight update, read from the server itself."""

    version: tuple[int, ...]  # from GET /version; (0,) when it does not say
    native_versions: bool  # /weight_info and /update_weight_version exist (weight labels)
    root: str  # the path the server loaded its model from (its /v1/models card)

    @property
    def reloads_from_path(self) -> bool:
        """`reload_weights(weights_path=...)`: vLLM 0.32 (tested for real) and 0.33 have it; in
        0.12 the worker's `reload_weights()` takes no arguments and re-reads the launch path."""
        return self.version >= RELOAD_PATH_SINCE or self.native_versions


RELOAD_PATH_SINCE = (0, 32)


def parse_version(text: str) -> tuple[int, ...]:
    """`0.12.0`, `0.33.1rc1.dev3+g...` -> (0, 12, 0), (0, 33, 1); (0,) when unreadable."""
    parts = re.findall(r"\d+", text.split("+")[0].split("rc")[0].split(".dev")[0])
    return tuple(int(p) for p in parts[:3]) or (0,)


async def probe_vllm(session: aiohttp.ClientSession, url: str, models: Any) -> VllmServer:
    about = await _call(session, "GET", url, "/version", missing_ok=True)
    version = parse_version(str(about.get("version", ""))) if isinstance(about, dict) else (0,)
    native = await _call(session, "GET", url, "/weight_info", missing_ok=True) is not _MISSING
    cards = models.get("data", []) if isinstance(models, dict) else []
    root = str(cards[0].get("root") or cards[0].get("id")) if cards else ""
    return VllmServer(version, native, root)


async def _reload_vllm(session: aiohttp.ClientSession, url: str, version: int, uri: str,
                       models: Any) -> str:
    server = await probe_vllm(session, url, models)
    if not server.reloads_from_path and uri.rstrip("/") != server.root.rstrip("/"):
        # Refuse before pausing anything: nothing on the server changes.
        raise ApplyError(
            f"vLLM {'.'.join(map(str, server.version))} reloads full weights only from the "
            f"path it was started with ({server.root}); write each checkpoint there and "
            f"publish that path, use LoRA updates, or run vLLM >= 0.33")
    if server.native_versions:
        return await _reload_native(session, url, version, uri)
    return await _reload_legacy(session, url, version)


async def _reload_native(session: aiohttp.ClientSession, url: str, version: int,
                         uri: str) -> str:
    """vLLM 0.32 and 0.33: `mode=keep` queues new requests instead of answering 503 (`wait`
    and `abort` reject them until /resume); 0.33's engine labels the tokens each weight version
    sampled (`choices[].weight_versions`), 0.32's label is read by RUN around each request.
    The label is set only after a complete reload and before /resume, so a failed one leaves
    the old label, which still names the weights in use."""
    steps: list[str] = []
    await _call(session, "POST", url, "/pause", params={"mode": "keep"})
    steps.append("pause keep")
    try:
        await _call(session, "POST", url, "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": uri}})
        steps.append("reload_weights")
        if await _call(session, "POST", url, "/reset_prefix_cache",
                       missing_ok=True) is not _MISSING:
            steps.append("reset_prefix_cache")
        await _call(session, "POST", url, "/update_weight_version",
                    {"new_version": str(version)})
        steps.append(f"weight_version {version}")
        # A server that also runs the middleware: keep its header in step.
        if await _call(session, "POST", url, VERSION_PATH, {"version": version},
                       missing_ok=True) is not _MISSING:
            steps.append(f"stamp v{version}")
    finally:
        await _call(session, "POST", url, "/resume")
        steps.append("resume")
    return ", ".join(steps)


async def _reload_legacy(session: aiohttp.ClientSession, url: str, version: int) -> str:
    """vLLM 0.12: `/pause` lets running requests finish and holds new ones until /resume;
    `reload_weights()` re-reads the launch path, where the new checkpoint already is. The
    version comes from rollstream.vllm_middleware's stamp: cleared for the window, set to N
    after a complete reload, and put back to the previous version after a failed one (the
    reload failed before it replaced the weights in use, as vLLM's own label semantics
    assume), so a server never stays without a version."""
    steps: list[str] = []
    previous = await _call(session, "GET", url, VERSION_PATH, missing_ok=True)
    stamped = isinstance(previous, dict)
    # wait_for_inflight_requests is 0.12's spelling; mode=keep is ignored there.
    pause = {"wait_for_inflight_requests": "true", "clear_cache": "true"}
    await _call(session, "POST", url, "/pause", params=pause)
    steps.append("pause")
    done = False
    try:
        if stamped:
            await _call(session, "POST", url, VERSION_PATH, {"version": None})
        await _call(session, "POST", url, "/collective_rpc", {"method": "reload_weights"})
        steps.append("reload_weights (from the launch path)")
        if await _call(session, "POST", url, "/reset_prefix_cache",
                       missing_ok=True) is not _MISSING:
            steps.append("reset_prefix_cache")
        done = True
    finally:
        if stamped:
            restored = version if done else previous.get("version")
            await _call(session, "POST", url, VERSION_PATH, {"version": restored})
            steps.append(f"stamp v{restored}")
        await _call(session, "POST", url, "/resume")
        steps.append("resume")
    return ", ".join(steps)


_MISSING = object()  # an endpoint the server does not have (404)


async def _call(session: aiohttp.ClientSession, method: str, url: str, path: str,
                body: Any = None, *, params: Mapping[str, str] | None = None,
                missing_ok: bool = False) -> Any:
    """JSON (or text) of a successful call; `_MISSING` on 404 when `missing_ok`."""
    async with session.request(method, url + path, json=body, params=params) as response:
        text = await response.text()
        if response.status == 404 and missing_ok:
            return _MISSING
        if response.status >= 400:
            raise ApplyError(f"{method} {path}: HTTP {response.status}: {text[:500]}")
        if response.content_type == "application/json":
            return await response.json()
        return text  # vLLM's LoRA endpoints answer plain text


# --- the service ------------------------------------------------------------------------------


class Controller:
    """Consumes <p>.policy and keeps every server on the newest version (see module doc)."""

    def __init__(self, settings: config.Settings) -> None:
        # confluent-kafka only where the service runs
        from rollstream.policy_versions import PolicyReader

        self.settings = settings
        # No group: every controller reads the whole topic, newest version wins.
        self.reader = PolicyReader(settings)
        self.latest: dict | None = None
        self.applied: dict[str, int] = {}
        self._stopping = False
        self.health = health.component("controller", "reading the policy topic")

    def stop(self) -> None:
        self._stopping = True

    async def serve(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(600.0, self.settings.inference.request_timeout_s))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            next_check = 0.0
            try:
                while not self._stopping:
                    if self.reader.poll():
                        self.latest = self.reader.latest
                        next_check = 0.0  # apply now
                    if self.reader.at_end:
                        self.health.ready()
                    now = asyncio.get_running_loop().time()
                    if self.latest is not None and now >= next_check:
                        await self.reconcile(session)
                        next_check = now + self.settings.inference.health_interval_s
                    await asyncio.sleep(0.1)
            finally:
                self.reader.close()

    async def reconcile(self, session: aiohttp.ClientSession) -> list[Applied]:
        """Apply the newest version to every listed server that does not report it."""
        assert self.latest is not None
        version = self.latest["version"]
        servers = self.settings.inference.policy_urls()
        adapter = self.settings.inference.adapter
        reported = await asyncio.gather(*(current_version(session, u, adapter) for u in servers))
        metrics.servers_checked(version, len(servers), sum(v is not None for v in reported))
        # A server that cannot report a full-weight version is trusted once applied; a job's
        # adapter is always listed, so one that is not is loaded again (a restarted server).
        todo = [u for u, v in zip(servers, reported, strict=True) if v != version and not (
            v is None and not adapter and self.applied.get(u) == version)]
        results = (await apply_policy(self.latest, todo, session=session, adapter=adapter)
                   if todo else [])
        for r in results:
            if r.ok:
                self.applied[r.server] = r.version
        return results
