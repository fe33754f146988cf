"""The inference client against vLLM's documented contract (fixtures written from vLLM 0.12+'s
/v1/completions fields) and against the embedded policy server, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rollstream.contracts.inference import END, EmbeddedChatTemplate
from rollstream.dev.background import BackgroundServer
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.inference.client import (
    BadRequest,
    Completion,
    ContextOverflow,
    InferenceClient,
    InferenceError,
    ServerError,
    parse_load,
    request_body,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"
VLLM_REQUEST = json.loads((FIXTURES / "vllm_completion_request.json").read_text())
VLLM_RESPONSE = json.loads((FIXTURES / "vllm_completion_response.json").read_text())
QWEN_PROMPT = VLLM_REQUEST["prompt"]
QWEN_STOP = [151645]  # <|im_end|>
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 64, "seed": 1234}
SAMPLED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens")
PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")


def test_request_body_matches_the_vllm_fixture() -> None:
    body = request_body(QWEN_PROMPT, SAMPLING, QWEN_STOP, "Qwen/Qwen3-4B-Instruct-2507")
    assert body == VLLM_REQUEST
    assert json.dumps(body) == json.dumps(VLLM_REQUEST)  # same field order, same JSON types


def test_request_body_pins_every_sampling_field() -> None:
    body = request_body([1, 2], {"max_tokens": 8}, [END], "m")
    for field in (*SAMPLED_FIELDS, *PENALTIES, "n", "stop_token_ids", "ignore_eos"):
        assert field in body, field
    assert body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["skip_special_tokens"] is False and body["include_stop_str_in_output"] is False
    assert "seed" not in body  # no seed: the server's own randomness
    assert isinstance(body["temperature"], float) and isinstance(body["top_k"], int)
    with pytest.raises(ValueError, match="unknown sampling"):
        request_body([1], {"temprature": 0.5}, [], "m")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def fake_vllm(completions: Handler, body: Callable[[str], Awaitable[Any]]) -> Any:
    """Run `body(url)` against a tiny aiohttp server standing in for vLLM."""
    app = web.Application()

    async def models(request: web.Request) -> web.Response:
        card = {"id": VLLM_RESPONSE["model"], "object": "model", "max_model_len": 40960}
        return web.json_response({"object": "list", "data": [card]})

    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    async with TestServer(app, host="127.0.0.1") as server:
        return await body(str(server.make_url("")).rstrip("/"))


def complete_qwen(completions: Handler) -> Completion:
    """The fixture's Qwen prompt completed against `completions`, the model name discovered."""
    async def call(url: str) -> Completion:
        async with InferenceClient(url) as client:
            return await client.complete(QWEN_PROMPT, SAMPLING, QWEN_STOP)

    return asyncio.run(fake_vllm(completions, call))


def test_client_parses_vllm_response() -> None:
    seen: list[Any] = []

    async def completions(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response(VLLM_RESPONSE)  # real vLLM: no policy version header

    completion = complete_qwen(completions)
    assert seen == [VLLM_REQUEST]  # model name discovered from /v1/models
    choice = VLLM_RESPONSE["choices"][0]
    assert completion.token_ids == choice["token_ids"] == [13048, 1052, 0, 151645]
    assert completion.logprobs == choice["logprobs"]["token_logprobs"]
    assert completion.finish_reason == "stop" and completion.text == "Hi there!"
    assert completion.policy_version is None and completion.latency_ms > 0


def error_handler(status: int, payload: Any) -> Handler:
    async def completions(request: web.Request) -> web.Response:
        return web.json_response(payload, status=status)

    return completions


def vllm_error(message: str, status: int) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def call_with(handler: Handler, timeout_s: float = 5) -> BaseException:
    async def call(url: str) -> BaseException:
        async with InferenceClient(url, "m", timeout_s) as client:
            with pytest.raises(InferenceError) as info:
                await client.complete([1, 2, 3], SAMPLING, [])
            return info.value

    return asyncio.run(fake_vllm(handler, call))


def test_context_overflow_from_vllm_messages() -> None:
    too_long = (
        "This model's maximum context length is 40960 tokens. However, your request has "
        "41000 input tokens. Please reduce the length of the input messages."
    )
    err = call_with(error_handler(400, vllm_error(too_long, 400)))
    assert isinstance(err, ContextOverflow) and not err.retryable
    assert (err.max_model_len, err.prompt_tokens, err.status) == (40960, 41000, 400)
    too_many = (
        "'max_tokens' or 'max_completion_tokens' is too large: 2048. This model's maximum "
        "context length is 40960 tokens and your request has 40000 input tokens "
        "(2048 > 40960 - 40000)."
    )
    err = call_with(error_handler(400, vllm_error(too_many, 400)))
    assert isinstance(err, ContextOverflow) and err.prompt_tokens == 40000
    # The pre-0.10 flat error shape is understood too.
    flat = {"object": "error", "message": too_long, "type": "BadRequestError", "code": 400}
    assert isinstance(call_with(error_handler(400, flat)), ContextOverflow)


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [(400, BadRequest, False), (404, BadRequest, False), (503, ServerError, True),
     (500, ServerError, True), (429, ServerError, True)],
)  # fmt: skip
def test_http_errors_are_typed(status: int, kind: type, retryable: bool) -> None:
    err = call_with(error_handler(status, vllm_error("nope", status)))
    assert type(err) is kind and err.retryable is retryable and err.status == status


def test_timeout_and_refused_are_retryable() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response(VLLM_RESPONSE)

    err = call_with(slow, timeout_s=0.2)
    assert isinstance(err, ServerError) and err.retryable

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def refused() -> None:
        async with InferenceClient(f"http://127.0.0.1:{port}", "m") as client:
            await client.complete([1], SAMPLING, [])

    with pytest.raises(ServerError):
        asyncio.run(refused())


def test_response_without_token_ids_is_a_contract_error() -> None:
    old = json.loads(json.dumps(VLLM_RESPONSE))
    old["choices"][0]["token_ids"] = None  # a server that ignored return_token_ids
    err = call_with(error_handler(200, old))
    assert type(err) is InferenceError and not err.retryable


def test_non_finite_logprobs_are_read_and_garbage_is_a_server_error() -> None:
    """A server writing a logprob as -Infinity (Python's json.dumps does) is read as the json
    module reads it; a body that is not JSON at all is a retryable server error."""
    response = json.loads(json.dumps(VLLM_RESPONSE))
    response["choices"][0]["logprobs"]["token_logprobs"][0] = float("-inf")

    async def completions(request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(response), content_type="application/json")

    completion = complete_qwen(completions)
    assert completion.logprobs[0] == float("-inf")
    assert completion.logprobs[1:] == response["choices"][0]["logprobs"]["token_logprobs"][1:]

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(body=b'{"choices": [', content_type="application/json")

    err = call_with(garbage)
    assert isinstance(err, ServerError) and err.retryable and "invalid JSON" in str(err)


# --- against the embedded policy server ------------------------------------------------------


@pytest.fixture(scope="module")
def policy() -> Any:
    with BackgroundServer() as url:
        yield url


def test_client_against_embedded_server(policy: str) -> None:
    template = EmbeddedChatTemplate()
    prompt = template.first_prompt("list the files")
    sampling = {"temperature": 1.0, "top_p": 0.95, "top_k": 50, "max_tokens": 200, "seed": 9}

    async def call() -> tuple[Completion, Completion, Completion, str | None]:
        async with InferenceClient(policy) as client:
            first = await client.complete(prompt, sampling, template.stop_token_ids)
            again = await client.complete(prompt, sampling, template.stop_token_ids)
            # Next turn: the previous ids verbatim, plus the new observation.
            turn2 = prompt + first.token_ids + template.observation_delta("a.py b.py")
            second = await client.complete(turn2, sampling, template.stop_token_ids)
            return first, again, second, client.model

    first, again, second, model = asyncio.run(call())
    assert model == "rollstream-tiny"
    assert first.token_ids == again.token_ids and first.logprobs == again.logprobs
    for c in (first, second):
        assert c.policy_version == 0 and c.server == policy
        assert len(c.token_ids) == len(c.logprobs) and all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason == "stop" and c.token_ids[-1] == END


def test_client_context_overflow_and_length_against_embedded_server(policy: str) -> None:
    async def call() -> tuple[Completion, ContextOverflow]:
        async with InferenceClient(policy) as client:
            short = await client.complete([65] * 10, {"max_tokens": 5}, [])
            with pytest.raises(ContextOverflow) as info:
                await client.complete([65] * 2040, {"max_tokens": 64}, [])
            return short, info.value

    short, overflow = asyncio.run(call())
    assert short.finish_reason == "length" and len(short.token_ids) == 5
    assert overflow.max_model_len == 2048 and overflow.prompt_tokens == 2040


# --- what a router reads: load gauges, models, LoRA by name, the prompt echo ----------------


def test_load_gauges_from_a_vllm_metrics_page() -> None:
    # Two engines (data parallel): requests add up, KV usage is the fullest engine's.
    load = parse_load((FIXTURES / "vllm_metrics.txt").read_text())
    assert load == {"running": 15.0, "waiting": 5.0, "kv_usage": 0.42}
    assert parse_load("vllm:gpu_cache_usage_perc 0.5\n") == {"kv_usage": 0.5}  # pre-0.10 name
    assert parse_load("# nothing here\n") == {}


def test_embedded_server_serves_the_same_load_gauges(policy: str) -> None:
    async def call() -> tuple[dict[str, float], bool, list[dict[str, Any]]]:
        async with InferenceClient(policy) as client:
            return await client.load(), await client.healthy(), await client.models()

    load, healthy, models = asyncio.run(call())
    assert healthy and set(load) == {"running", "waiting", "kv_usage"}
    assert models[0]["id"] == "rollstream-tiny"


def echoing(seen: list[Any]) -> Handler:
    """vLLM answering the fixture's response, echoing the fixture's Qwen prompt; each request's
    body goes to `seen`."""
    echoed = json.loads(json.dumps(VLLM_RESPONSE))
    echoed["choices"][0]["prompt_token_ids"] = QWEN_PROMPT

    async def completions(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response(echoed)

    return completions


def test_lora_adapter_is_requested_by_name_and_echo_mismatch_is_caught() -> None:
    seen: list[Any] = []

    async def call(url: str) -> BaseException:
        async with InferenceClient(url) as client:
            await client.complete(QWEN_PROMPT, SAMPLING, QWEN_STOP, model="rollstream-policy-v3")
            with pytest.raises(InferenceError, match="prompt_token_ids differ") as info:
                await client.complete(QWEN_PROMPT[:-1], SAMPLING, QWEN_STOP)
            return info.value

    err = asyncio.run(fake_vllm(echoing(seen), call))
    assert seen[0] == {**VLLM_REQUEST, "model": "rollstream-policy-v3"}
    assert not err.retryable


def test_an_int32_context_is_sent_as_the_same_json_and_checked_against_the_echo() -> None:
    """RUN holds an episode's context as an int32 array: the server reads the body a list of the
    same ids makes (the fixture's), and the echoed ids are compared by value, so one id changed
    is caught."""
    seen: list[Any] = []

    async def call(url: str) -> Completion:
        context = np.asarray(QWEN_PROMPT, dtype=np.int32)
        changed = context.copy()
        changed[3] += 1
        async with InferenceClient(url) as client:
            completion = await client.complete(context, SAMPLING, QWEN_STOP)
            with pytest.raises(InferenceError, match="prompt_token_ids differ"):
                await client.complete(changed, SAMPLING, QWEN_STOP)
            return completion

    completion = asyncio.run(fake_vllm(echoing(seen), call))
    assert seen[0] == VLLM_REQUEST and seen[1]["prompt"][3] == QWEN_PROMPT[3] + 1
    assert completion.token_ids == VLLM_RESPONSE["choices"][0]["token_ids"]


def test_simulated_server_follows_the_same_contract() -> None:
    with Fleet([SimulatedServer()]) as fleet:

        async def call() -> tuple[Completion, dict[str, float]]:
            async with InferenceClient(fleet.urls[0]) as client:
                return await client.complete([1, 2, 3], SAMPLING, [END]), await client.load()

        completion, load = asyncio.run(call())
    assert completion.token_ids[-1] == END and completion.finish_reason == "stop"
    assert completion.policy_version == 0 and load["running"] == 0.0


@pytest.mark.parametrize("prompt", ["Say hi", [[1, 2], [3, 4]], [1, 2**40], None])
def test_simulated_server_refuses_what_is_not_token_ids_by_name(prompt: Any) -> None:
    with Fleet([SimulatedServer()]) as fleet:

        async def post() -> tuple[int, Any]:
            async with aiohttp.ClientSession() as session, session.post(
                    fleet.urls[0] + "/v1/completions",
                    json={"prompt": prompt, "max_tokens": 1}) as response:
                return response.status, await response.json()

        status, answer = asyncio.run(post())
    assert status == 400 and "prompt must be a list of token ids" in answer["error"]["message"]
