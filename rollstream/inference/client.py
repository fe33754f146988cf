"""Async client for vLLM-compatible inference servers (vLLM itself, or the embedded policy).

RUN sends token ids and gets token ids back (POST /v1/completions with a token-id prompt), so a
multi-turn conversation is never re-tokenized. Every sampling parameter is sent explicitly:
vLLM fills omitted ones from the model's generation_config.json (and max_tokens defaults to 16),
which would silently change the policy being sampled.

Errors are typed for the caller's decision: `ContextOverflow` (the conversation no longer fits:
end the episode as truncated), `ServerError` (retryable: 5xx, 429, refused, timeout; its
`unreachable` flag says the server is down, not just failing), `BadRequest` (any other 4xx: a
bug, not retryable), plain `InferenceError` for a response that does not follow the contract
(including a server that saw other prompt ids than were sent: the per-turn prefix check).

Besides completions, the client reads what a router needs: `/health`, the `vllm:*` load gauges
from `/metrics`, the models a server lists (LoRA adapters included) and vLLM's weight label.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson

from rollstream.contracts.codec import Ids, id_list
from rollstream.contracts.inference import SAMPLING_DEFAULTS
from rollstream.contracts.wire import POLICY_VERSION_HEADER

_OVERFLOW = re.compile(r"maximum context length|maximum model length|max_model_len", re.I)
_MAX_LEN = re.compile(r"maximum (?:context|model) length (?:is|of) (\d+)", re.I)
_PROMPT_LEN = re.compile(r"(\d+) input tokens|prompt \(length (\d+)\)", re.I)


class InferenceError(Exception):
    retryable = False

    def __init__(self, message: str, *, server: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.status = status


class ServerError(InferenceError):
    """5xx, 429, connection refused or reset, timeout: try again (here or on another server)."""

    retryable = True

    def __init__(self, message: str, *, server: str = "", status: int | None = None,
                 unreachable: bool = False) -> None:
        super().__init__(message, server=server, status=status)
        self.unreachable = unreachable  # no connection at all: the server is down


class ServerUpdating(ServerError):
    """The server is inside a weight update (paused, or between versions): retry once it is
    done. Not a failure of the server: it neither counts toward ejection nor the retry budget."""


class ServerPaused(ServerUpdating):
    """503 from a vLLM paused with `mode=wait` or `mode=abort` ("Generation is paused")."""


class BadRequest(InferenceError):
    """A 4xx the request itself caused; retrying it unchanged fails the same way."""


class ContextOverflow(BadRequest):
    """The prompt (or prompt + max_tokens) exceeds the server's max_model_len."""

    def __init__(self, message: str, *, server: str = "", status: int | None = None) -> None:
        super().__init__(message, server=server, status=status)
        max_len = _MAX_LEN.search(message)
        prompt_len = _PROMPT_LEN.search(message)
        self.max_model_len = int(max_len.group(1)) if max_len else None
        self.prompt_tokens = int(next(filter(None, prompt_len.groups()))) if prompt_len else None


# vLLM's load gauges (summed over engines; kv usage is the fullest engine's). The pre-0.10 name of
# the KV gauge is read too.
LOAD_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
}


def parse_load(text: str) -> dict[str, float]:
    """`running`, `waiting` and `kv_usage` from a Prometheus /metrics page (absent: not listed)."""
    load: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        key = LOAD_GAUGES.get(name.strip())
        if key is None:
            continue
        try:
            value = float(rest.rsplit("}", 1)[-1].split()[0])
        except (IndexError, ValueError):
            continue
        load[key] = max(load.get(key, 0.0), value) if key == "kv_usage" else (
            load.get(key, 0.0) + value)
    return load


@dataclass
class Completion:
    token_ids: list[int]  # every sampled id, including the stop token that ended the turn
    logprobs: list[float]  # one per token id, as the server reported it
    finish_reason: str  # "stop" or "length"
    text: str
    server: str
    policy_version: int | None  # None when the server does not report it (real vLLM)
    latency_ms: float
    # vLLM 0.33's `choices[].weight_versions`: [{version, start, end}] over the output tokens
    # (the label set with /update_weight_version); None from servers without it.
    weight_versions: list[dict[str, Any]] | None = None
    adapter: str | None = None  # the LoRA adapter the request named (the router sets it)


def request_body(
    prompt_ids: Ids,
    sampling: Mapping[str, Any],
    stop_token_ids: Sequence[int],
    model: str,
) -> dict[str, Any]:
    """The exact /v1/completions body: sampling from `sampling` (SamplingParams keys), every
    other knob that changes the sampled distribution pinned to its neutral value."""
    unknown = set(sampling) - set(SAMPLING_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown sampling parameters: {sorted(unknown)}")
    s = {**SAMPLING_DEFAULTS, **sampling}
    body: dict[str, Any] = {
        "model": model,
        # RUN's context itself (an int32 array, which orjson writes as a list), not a copy held
        # while the turn decodes; a list as given: no int() per id (at 32k ids that was about
        # half of building the body).
        "prompt": prompt_ids if isinstance(prompt_ids, list | np.ndarray) else list(prompt_ids),
        "max_tokens": int(s["max_tokens"]),
        "temperature": float(s["temperature"]),
        "top_p": float(s["top_p"]),
        "top_k": int(s["top_k"]),
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_tokens": 0,
        "n": 1,
    }
    if s["seed"] is not None:
        body["seed"] = int(s["seed"])
    body.update(
        {
            "stop": [],
            "stop_token_ids": [int(t) for t in stop_token_ids],
            "ignore_eos": False,
            "include_stop_str_in_output": False,
            "skip_special_tokens": False,
            # vLLM's default puts spaces between special tokens in `text`; keep it the plain
            # detokenization, which chat templates see again as the assistant message.
            "spaces_between_special_tokens": False,
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            # vLLM 0.33 labels which weights sampled each token; older servers ignore the field.
            "return_weight_versions": True,
            "echo": False,
            "stream": False,
        }
    )
    return body


class InferenceClient:
    """One server; one aiohttp session (connection pool) for the client's lifetime."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout_s: float = 60,
        max_connections: int = 256,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._model_lock = asyncio.Lock()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def model_name(self) -> str:
        """The configured model, else the first one the server lists (looked up once)."""
        async with self._model_lock:
            if self.model is None:
                data, _ = await self._request("GET", "/v1/models")
                try:
                    self.model = str(data["data"][0]["id"])
                except (KeyError, IndexError, TypeError) as exc:
                    raise InferenceError(
                        f"unexpected /v1/models response: {data!r}", server=self.base_url
                    ) from exc
            return self.model

    async def models(self) -> list[dict[str, Any]]:
        """The model cards of GET /v1/models (the base model, then any LoRA adapters)."""
        data, _ = await self._request("GET", "/v1/models")
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise InferenceError(f"unexpected /v1/models response: {data!r}", server=self.base_url)
        return data["data"]

    async def healthy(self) -> bool:
        """GET /health answers 200 (vLLM: 503 while the engine is dead)."""
        try:
            status, _, _ = await self._send("GET", "/health")
        except ServerError:
            return False
        return status == 200

    async def load(self) -> dict[str, float]:
        """The server's load gauges from /metrics; empty when it serves none."""
        status, raw, _ = await self._send("GET", "/metrics")
        return parse_load(raw.decode("utf-8", errors="replace")) if status == 200 else {}

    async def weight_label(self) -> str | None:
        """vLLM's weight label (`GET /weight_info`, set with /update_weight_version; "default"
        until then); None when the server has no such route."""
        status, raw, _ = await self._send("GET", "/weight_info")
        if status in (404, 405):
            return None
        if status != 200:
            raise ServerError(f"GET /weight_info: HTTP {status}", server=self.base_url,
                              status=status)
        try:
            return str(json.loads(raw)["weight_version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise InferenceError(f"unexpected /weight_info response: {raw[:200]!r}",
                                 server=self.base_url) from exc

    async def complete(
        self,
        prompt_ids: Ids,
        sampling: Mapping[str, Any],
        stop_token_ids: Sequence[int],
        model: str | None = None,
    ) -> Completion:
        """One completion. `model` overrides the server's model, e.g. a LoRA adapter's name."""
        body = request_body(prompt_ids, sampling, stop_token_ids,
                            model or await self.model_name())
        start = time.perf_counter()
        data, headers = await self._request("POST", "/v1/completions", body)
        latency_ms = (time.perf_counter() - start) * 1000
        try:
            choice = data["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
            finish_reason = str(choice["finish_reason"])
            text = str(choice["text"])
            echoed = choice.get("prompt_token_ids")
            spans = choice.get("weight_versions")
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            # e.g. token_ids null: the server ignored return_token_ids (vLLM older than 0.10.2)
            raise InferenceError(
                f"completion response lacks token_ids/logprobs: {exc!r}", server=self.base_url
            ) from exc
        if len(token_ids) != len(logprobs):
            raise InferenceError(
                f"{len(token_ids)} token ids but {len(logprobs)} logprobs", server=self.base_url
            )
        if echoed is not None and echoed != id_list(body["prompt"]):
            # The prefix check from the server's side: it must have seen exactly our ids.
            raise InferenceError("the server's prompt_token_ids differ from the ids sent",
                                 server=self.base_url)
        version = headers.get(POLICY_VERSION_HEADER)
        return Completion(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish_reason,
            text=text,
            server=self.base_url,
            policy_version=int(version) if version is not None and version.isdigit() else None,
            latency_ms=latency_ms,
            weight_versions=list(spans) if isinstance(spans, list) else None,
        )

    async def _send(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, bytes, Mapping[str, str]]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout,
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
        url = self.base_url + path
        # orjson: a turn's body and response carry the whole context's ids (at 32k ids, measured
        # beside a build: 3.4 ms and 3.0 ms with the json module, 0.37 and 0.98 with orjson).
        data, headers = (None, None) if body is None else (
            orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), _JSON)
        try:
            async with self._session.request(method, url, data=data,
                                             headers=headers) as response:
                return response.status, await response.read(), response.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(
                f"{method} {url}: {exc!r}",
                server=self.base_url,
                unreachable=isinstance(exc, aiohttp.ClientConnectorError),
            ) from exc

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[Any, Mapping[str, str]]:
        status, raw, headers = await self._send(method, path, body)
        url = self.base_url + path
        if status >= 400:
            message = _error_message(raw)
            kind: type[InferenceError]
            if status == 503 and "paused" in message.lower():
                kind = ServerPaused
            elif status >= 500 or status == 429:
                kind = ServerError
            elif status == 400 and _OVERFLOW.search(message):
                kind = ContextOverflow
            else:
                kind = BadRequest
            raise kind(f"HTTP {status}: {message}", server=self.base_url, status=status)
        try:
            return _loads(raw), headers
        except ValueError as exc:
            raise ServerError(f"{method} {url}: invalid JSON", server=self.base_url) from exc


_JSON = {"Content-Type": "application/json"}


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # What orjson refuses and the json module reads: NaN and ±Infinity, which some servers
        # write for a logprob.
        return json.loads(raw)


def _error_message(raw: bytes) -> str:
    # vLLM: {"error": {"message": ...}}; before ~0.10: {"object": "error", "message": ...};
    # FastAPI's own errors: {"detail": ...}.
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace")[:1000]
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        for key in ("message", "detail"):
            if key in data:
                return str(data[key])
    return str(data)[:1000]


class InferenceUnavailable(RuntimeError):
    """Inference kept failing past the retry budget: the episode ends as an infra failure."""


class TextMismatch(RuntimeError):
    """The server's `text` is not the detokenization of the ids it sampled."""
