"""Stand-ins for vLLM 0.12, 0.32 and 0.33 servers (no GPU here), as far as RUN and the controller
see them. Tokens come from the embedded policy's engine; the control plane follows each release's
source (read from the released wheels):

- both: `GET /version` → {"version": "0.12.0" | "0.33.0"}; `/v1/models` cards `owned_by: vllm`
  with `root` = the path the model was loaded from; `/collective_rpc` answers {"results": [...]}
  and an exception in the worker surfaces as a plain-text 500 (FastAPI's default).
- 0.12 (vllm/entrypoints/openai/api_server.py, v1/engine/async_llm.py, v1/worker/gpu_worker.py):
  `/pause?wait_for_inflight_requests=&clear_cache=`: new requests wait until `/resume` (they
  are not rejected); without `wait_for_inflight_requests` running requests are aborted.
  `Worker.reload_weights(self)` takes no arguments and re-reads the launch path, so any
  `kwargs` raise TypeError. No weight labels: the version comes from the Rollstream middleware
  (its `/rollstream/policy_version` endpoint and response header, mirrored here).
- 0.33 (vllm/entrypoints/rl/online/api_router.py, v1/engine/core.py, outputs.py):
  `/pause?mode=abort|wait|keep` (default abort): in abort and wait modes new requests are
  rejected with 503 "Generation is paused. Please retry after it resumes." until `/resume`;
  keep queues them. `reload_weights(weights_path=...)`. Weight labels: the initial label is
  "default", `POST /update_weight_version {"new_version": str}`, `GET /weight_info` →
  {"weight_version": label}, and `return_weight_versions: true` adds
  `choices[].weight_versions: [{"version", "start", "end"}]`.
- 0.32 (checked against the real CPU build, tests/inference/test_vllm_real.py): 0.33's control plane
  (pause modes, `reload_weights(weights_path=...)`, the weight label routes) but no
  `choices[].weight_versions` on /v1/completions.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from rollstream.contracts.wire import POLICY_VERSION_HEADER, VERSION_PATH
from rollstream.policy_server.app import PolicyServer, _errors
from rollstream.policy_server.engine import Engine
from rollstream.policy_server.model import load

MODEL = "Qwen/Qwen3-4B"
PAUSED_503 = "Generation is paused. Please retry after it resumes."


class VllmStandIn:
    def __init__(self, release: str, model_path: Path, *, reload_delay_s: float = 0.0,
                 middleware: bool = True) -> None:
        assert release in ("0.12.0", "0.32.0", "0.33.0")
        self.release = release
        self.root = str(model_path)
        model, version = load(model_path)
        self.engine = Engine(model, version, max_batch=64, seed=0)
        self.inner = PolicyServer(self.engine, MODEL, self.root)
        self.reload_delay_s = reload_delay_s
        self.middleware = middleware and release == "0.12.0"
        self.stamp: int | None = version  # the middleware's, started with the base version
        self.label = "default"  # 0.33's weight label
        self.paused: str | None = None  # None, or the pause mode
        self.resumed = asyncio.Event()
        self.in_flight = 0
        self.calls: list[str] = []  # control-plane calls in order, for assertions
        self.rejected = 0  # completions answered 503 while paused

    @property
    def legacy(self) -> bool:
        return self.release == "0.12.0"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors])  # the inner server's error JSON
        app.router.add_routes([
            web.get("/version", self.version),
            web.get("/v1/models", self.models),
            web.get("/health", self.inner.health),
            web.get("/metrics", self.inner.metrics),
            web.post("/v1/completions", self.completions),
            web.post("/pause", self.pause),
            web.post("/resume", self.resume),
            web.post("/collective_rpc", self.collective_rpc),
            web.post("/reset_prefix_cache", self.reset_prefix_cache),
        ])
        if self.middleware:
            app.router.add_routes([web.get(VERSION_PATH, self.stamp_endpoint),
                                   web.post(VERSION_PATH, self.stamp_endpoint)])
        if not self.legacy:
            app.router.add_routes([web.post("/update_weight_version", self.update_label),
                                   web.get("/weight_info", self.weight_info)])

        async def engine_ctx(app: web.Application) -> Any:
            self.engine.start()
            yield
            await self.engine.stop()

        app.cleanup_ctx.append(engine_ctx)
        return app

    # -- serving -------------------------------------------------------------------------------

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.release})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm",
                "root": self.root, "parent": None, "max_model_len": self.engine.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        while self.paused is not None:
            if not self.legacy and self.paused != "keep":
                self.rejected += 1
                return web.json_response({"error": {
                    "message": PAUSED_503, "type": "Service Unavailable", "param": None,
                    "code": 503}}, status=503)
            await self.resumed.wait()
        body = await request.json()
        self.in_flight += 1
        try:
            response = await self.inner.completions(request)
        finally:
            self.in_flight -= 1
        assert isinstance(response, web.Response) and response.body is not None
        data = json.loads(response.body)  # type: ignore[arg-type]
        headers = {}
        if self.middleware and self.stamp is not None:
            headers[POLICY_VERSION_HEADER] = str(self.stamp)
        for choice in data["choices"]:
            if self.release == "0.33.0" and body.get("return_weight_versions"):
                n = len(choice["token_ids"] or [])
                choice["weight_versions"] = [{"version": self.label, "start": 0, "end": n}]
        return web.json_response(data, headers=headers)  # vLLM sends no version header

    # -- the control plane ---------------------------------------------------------------------

    async def pause(self, request: web.Request) -> web.Response:
        self.calls.append(f"pause {dict(request.query)}")
        if self.legacy:
            mode = "wait" if request.query.get("wait_for_inflight_requests") == "true" else (
                "abort")
        else:
            mode = request.query.get("mode", "abort")
            if mode not in ("abort", "wait", "keep"):
                return web.json_response({"error": f"Invalid pause mode: {mode}"}, status=400)
        if mode == "abort":  # the stand-in cannot abort a decode: the controller must not ask
            return web.json_response({"error": "stand-in: abort mode not simulated"},
                                     status=500)
        self.resumed.clear()
        self.paused = mode
        while mode == "wait" and self.in_flight:
            await asyncio.sleep(0.01)
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self.calls.append("resume")
        self.paused = None
        self.resumed.set()
        return web.json_response({"status": "resumed"})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(f"collective_rpc {json.dumps(body, sort_keys=True)}")
        if body.get("method") != "reload_weights":
            return web.Response(status=500, text="Internal Server Error")
        kwargs = body.get("kwargs") or {}
        if self.legacy and kwargs:
            # Worker.reload_weights(self) -> TypeError in the worker -> unhandled -> 500.
            return web.Response(status=500, text="Internal Server Error")
        path = kwargs.get("weights_path") or self.root
        await asyncio.sleep(self.reload_delay_s)
        try:
            await self.engine.load_weights(path, None)
        except (OSError, ValueError, RuntimeError):
            return web.Response(status=500, text="Internal Server Error")
        return web.json_response({"results": [None]})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.calls.append("reset_prefix_cache")
        return web.Response(status=200)

    async def stamp_endpoint(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            self.stamp = (await request.json())["version"]
            self.calls.append(f"stamp {self.stamp}")
        return web.json_response({"version": self.stamp})

    async def update_label(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body.get("new_version"), str):
            return web.json_response({"detail": "new_version: a string is required"},
                                     status=422)
        self.label = body["new_version"]
        self.calls.append(f"weight_version {self.label}")
        return web.json_response({"success": True, "new_version": self.label})

    async def weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.label})
