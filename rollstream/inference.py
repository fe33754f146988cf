"""Async client for vLLM-compatible inference servers (vLLM itself, or the embedded policy).

RUN sends token ids and gets token ids back (POST /v1/completions with a token-id prompt), so a
multi-turn conversation is never re-tokenized. Every sampling parameter is sent explicitly:
vLLM fills omitted ones from the model's generation_config.json (and max_tokens defaults to 16),
which would silently change the policy being sampled.

Errors are typed for the caller's decision: `ContextOverflow` (the conversation no longer fits:
end the episode as truncated), `ServerError` (retryable: 5xx, 429, refused, timeout),
`BadRequest` (any other 4xx: a bug, not retryable), plain `InferenceError` for a response that
does not follow the contract.
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

# Rollstream extension header: the policy version that produced a completion; real vLLM lacks it.
POLICY_VERSION_HEADER = "X-Rollstream-Policy-Version"
# Defaults of the Avro SamplingParams record, used for keys a caller leaves out.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_tokens": 64,
    "seed": None,
}
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


@dataclass
class Completion:
    token_ids: list[int]  # every sampled id, including the stop token that ended the turn
    logprobs: list[float]  # one per token id, as the server reported it
    finish_reason: str  # "stop" or "length"
    text: str
    server: str
    policy_version: int | None  # None when the server does not report it (real vLLM)
    latency_ms: float


def request_body(
    prompt_ids: Sequence[int],
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
        "prompt": [int(t) for t in prompt_ids],
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
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
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

    async def complete(
        self,
        prompt_ids: Sequence[int],
        sampling: Mapping[str, Any],
        stop_token_ids: Sequence[int],
    ) -> Completion:
        body = request_body(prompt_ids, sampling, stop_token_ids, await self.model_name())
        start = time.perf_counter()
        data, headers = await self._request("POST", "/v1/completions", body)
        latency_ms = (time.perf_counter() - start) * 1000
        try:
            choice = data["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
            finish_reason = str(choice["finish_reason"])
            text = str(choice["text"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            # e.g. token_ids null: the server ignored return_token_ids (vLLM older than 0.10.2)
            raise InferenceError(
                f"completion response lacks token_ids/logprobs: {exc!r}", server=self.base_url
            ) from exc
        if len(token_ids) != len(logprobs):
            raise InferenceError(
                f"{len(token_ids)} token ids but {len(logprobs)} logprobs", server=self.base_url
            )
        version = headers.get(POLICY_VERSION_HEADER)
        return Completion(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish_reason,
            text=text,
            server=self.base_url,
            policy_version=int(version) if version is not None and version.isdigit() else None,
            latency_ms=latency_ms,
        )

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[Any, Mapping[str, str]]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout,
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
        url = self.base_url + path
        try:
            async with self._session.request(method, url, json=body) as response:
                raw = await response.read()
                status, headers = response.status, response.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(f"{method} {url}: {exc!r}", server=self.base_url) from exc
        if status >= 400:
            message = _error_message(raw)
            kind: type[InferenceError]
            if status >= 500 or status == 429:
                kind = ServerError
            elif status == 400 and _OVERFLOW.search(message):
                kind = ContextOverflow
            else:
                kind = BadRequest
            raise kind(f"HTTP {status}: {message}", server=self.base_url, status=status)
        try:
            return json.loads(raw), headers
        except ValueError as exc:
            raise ServerError(f"{method} {url}: invalid JSON", server=self.base_url) from exc


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
