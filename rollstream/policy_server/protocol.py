"""The request side of vLLM's OpenAI-compatible contract as the embedded server speaks it: typed
request fields, the fields accepted only at their neutral value, and vLLM's error bodies
(`{"error": {"message", "type", "param", "code"}}` with the HTTP status in `code`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rollstream.contracts.inference import SamplingParams

LOGPROB_FLOOR = -9999.0  # vLLM's JSON stand-in for -inf
# Request fields this server accepts only at their neutral value (a client that pins them
# explicitly, as Rollstream's does, still works; anything else would be silently wrong).
NEUTRAL = {
    "n": 1,
    "best_of": 1,
    "echo": False,
    "stream": False,
    "min_p": 0.0,
    "min_tokens": 0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


class HTTPError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
                413: "RequestEntityTooLarge", 503: "ServiceUnavailableError"}


def error_response(message: str, status: int = 400, param: str | None = None) -> web.Response:
    err_type = ERROR_TYPES.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """A typed request field; absent or null → default."""
    value = body.get(name)
    if value is None:
        return default
    if kind is float and is_int(value):
        return float(value)
    if (kind is int and not is_int(value)) or not isinstance(value, kind):
        raise HTTPError(f"{name} must be of type {kind.__name__}.", param=name)
    return value


def int_list(body: dict[str, Any], name: str) -> list[int]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise HTTPError(f"{name} must be a list of integers.", param=name)
    return value


async def json_body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":  # vLLM's validate_json_request
        raise HTTPError("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        body = await request.json()
    except ValueError as exc:
        raise HTTPError(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise HTTPError("the request body must be a JSON object.")
    return body


def sampling_params(body: dict[str, Any], prompt_len: int, max_model_len: int) -> SamplingParams:
    """A completions request's sampling: a field absent or null keeps SamplingParams' default
    (the one place the defaults are set), as vLLM's server does. Raises ValueError (a 400) for
    a value vLLM rejects."""
    if "max_tokens" in body and body["max_tokens"] is None:  # vLLM: fill the context
        max_tokens: int | None = max(max_model_len - prompt_len, 1)
    else:
        max_tokens = field(body, "max_tokens", int, None)
    given = {
        "max_tokens": max_tokens,
        "temperature": field(body, "temperature", float, None),
        "top_p": field(body, "top_p", float, None),
        "top_k": field(body, "top_k", int, None),
        "seed": field(body, "seed", int, None),
        "ignore_eos": field(body, "ignore_eos", bool, None),
        "logprobs": field(body, "logprobs", int, None),
    }
    return SamplingParams(stop_token_ids=tuple(int_list(body, "stop_token_ids")),
                          **{name: value for name, value in given.items() if value is not None})
