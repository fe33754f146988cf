"""A recording stand-in of vLLM's dev-mode and runtime-LoRA routes, and PolicyVersion events, for
the controller's tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from rollstream.contracts.wire import VERSION_PATH


def policy_event(version: int, uri: str, kind: str = "full") -> dict:
    return {"version": version, "kind": kind, "uri": uri, "step_id": f"s{version}",
            "metrics": {}, "created_at_ms": 0}


def fake_vllm(calls: list[str], adapters: list[str]) -> web.Application:
    """vLLM in dev mode with runtime LoRA and the version middleware's endpoint, recording
    every call in order. Full-weight reloads per vLLM release
    are tested against tests/helpers/vllm_standins.py (test_vllm_updates.py)."""
    app = web.Application()

    async def record(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        calls.append(f"{request.method} {request.path} {json.dumps(body)}".strip())
        if request.path == "/v1/load_lora_adapter":
            adapters.append(body["lora_name"])
            return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added.")
        if request.path == "/v1/unload_lora_adapter":
            adapters.remove(body["lora_name"])
        return web.json_response({})

    async def models(request: web.Request) -> web.Response:
        cards = [{"id": "Qwen/Qwen3-4B", "owned_by": "vllm", "parent": None}]
        cards += [{"id": a, "owned_by": "vllm", "parent": "Qwen/Qwen3-4B"} for a in adapters]
        return web.json_response({"object": "list", "data": cards})

    app.router.add_get("/v1/models", models)
    for path in ("/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", VERSION_PATH,
                 "/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        app.router.add_post(path, record)
    return app


def against(app: web.Application, body: Callable[[str], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with TestServer(app, host="127.0.0.1") as server:
            return await body(str(server.make_url("")).rstrip("/"))

    return asyncio.run(main())
