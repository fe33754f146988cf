"""The inference controller: one PolicyVersion applied to every server, per server kind."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from rollstream.contracts.wire import VERSION_PATH, lora_name
from rollstream.controller.apply import Applied, apply_policy, current_version
from rollstream.dev.background import BackgroundServer
from rollstream.dev.processes import free_port
from rollstream.policy_server.model import build_model, save
from rollstream.vllm_middleware import PolicyVersionMiddleware
from tests.helpers.controller_helpers import against, fake_vllm, policy_event


def test_full_weights_need_a_vllm_that_says_how_to_reload_them() -> None:
    # A server that answers neither /version nor /weight_info is treated as vLLM 0.12: it can
    # reload only from its launch path, so another path is refused before anything is paused.
    calls: list[str] = []
    app = fake_vllm(calls, [])
    [result] = against(app, lambda url: apply_policy(policy_event(7, "/ckpt/step-7"), [url]))
    assert not result.ok and "only from the path it was started with" in result.detail
    assert calls == []


def test_lora_is_loaded_by_version_name_and_old_adapters_unloaded() -> None:
    calls: list[str] = []
    adapters = [lora_name(1), lora_name(2)]
    app = fake_vllm(calls, adapters)

    async def apply_and_read(url: str) -> tuple[list[Applied], int | None]:
        results = await apply_policy(policy_event(3, "/adapters/3", kind="lora"), [url])
        async with aiohttp.ClientSession() as session:
            return results, await current_version(session, url)

    [result], version = against(app, apply_and_read)
    assert result.ok and version == 3
    assert adapters == [lora_name(2), lora_name(3)]  # the previous one kept for in-flight turns
    assert json.loads(calls[0].split(" ", 2)[2]) == {"lora_name": lora_name(3),
                                                     "lora_path": "/adapters/3"}


def test_embedded_servers_reload_and_a_dead_one_is_reported(tmp_path: Path) -> None:
    checkpoint = tmp_path / "policy.safetensors"
    save(build_model(seed=5), checkpoint, version=5)
    dead = f"http://127.0.0.1:{free_port()}"
    with BackgroundServer() as a, BackgroundServer() as b:

        async def main() -> tuple[list[Applied], list[int | None], list[Applied]]:
            results = await apply_policy(policy_event(5, str(checkpoint)), [a, b, dead])
            lora = await apply_policy(policy_event(6, "x", kind="lora"), [a])
            async with aiohttp.ClientSession() as session:
                versions = [await current_version(session, u) for u in (a, b, dead)]
            return results, versions, lora

        results, versions, lora = asyncio.run(main())
    assert [r.ok for r in results] == [True, True, False]
    assert "ClientConnectorError" in results[2].detail
    assert versions == [5, 5, None]
    assert not lora[0].ok and "no LoRA support" in lora[0].detail


def test_middleware_stamps_completions_with_the_version_it_was_told() -> None:
    sent: list[dict] = []

    async def inner(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def call(mw: PolicyVersionMiddleware, method: str, path: str,
                   body: bytes = b"") -> dict:
        sent.clear()

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await mw({"type": "http", "method": method, "path": path}, receive, send)
        return dict(sent[0].get("headers", []))

    async def main() -> None:
        mw = PolicyVersionMiddleware(inner)
        assert (await call(mw, "POST", "/v1/completions"))[b"x-rollstream-policy-version"] == b"0"
        await call(mw, "POST", VERSION_PATH, b'{"version": null}')
        assert b"x-rollstream-policy-version" not in await call(mw, "POST", "/v1/completions")
        await call(mw, "POST", VERSION_PATH, b'{"version": 4}')
        assert json.loads(sent[1]["body"]) == {"version": 4}
        assert (await call(mw, "POST", "/v1/completions"))[b"x-rollstream-policy-version"] == b"4"
        assert b"x-rollstream-policy-version" not in await call(mw, "GET", "/health")
        await call(mw, "POST", VERSION_PATH, b'{"version": "4"}')
        assert sent[0]["status"] == 400

    asyncio.run(main())
