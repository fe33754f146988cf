"""An ASGI middleware for vLLM's server that stamps each completion with the policy version.

vLLM does not say which weights produced a response. Loaded with
`vllm serve ... --middleware rollstream.vllm_middleware.PolicyVersionMiddleware` (this file and
`rollstream.contracts.wire` need only the standard library, so they can be mounted into the vLLM
image), every /v1/completions response carries `X-Rollstream-Policy-Version`, as the embedded policy
server's do, and `POST /rollstream/policy_version {"version": N | null}` sets it (GET reads it).

For vLLM releases without weight labels (0.12). vLLM 0.33 labels responses itself
(`choices[].weight_versions`), and the controller uses that instead: this middleware's stamp is
per process, so it would be wrong with several API-server processes.

Why it is exact: the inference controller (rollstream/controller/apply.py) reloads full
weights on 0.12 as `/pause?wait_for_inflight_requests=true` (running requests finish on the old
weights, new ones are held) → set version null → reload → set version N (or back to the previous one
when the reload failed) → `/resume` (held requests run on the new weights). The header is
written when a response starts, which for a non-streamed completion is after its last token;
a response that starts inside the window carries no version, and RUN samples that turn again
rather than guess.
One middleware instance holds the version: run vLLM with one API server process (the default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from rollstream.contracts.wire import POLICY_VERSION_HEADER, VERSION_PATH

HEADER = POLICY_VERSION_HEADER.lower().encode()  # ASGI header names are lowercase bytes
STAMPED_PATHS = ("/v1/completions", "/v1/chat/completions")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class PolicyVersionMiddleware:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        # The version the server starts with (the base checkpoint's), 0 unless told otherwise.
        initial = os.environ.get("ROLLSTREAM_POLICY_VERSION", "0")
        self.version: int | None = int(initial) if initial.strip() else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["path"] == VERSION_PATH:
            await self._version_endpoint(scope, receive, send)
        elif scope["path"] in STAMPED_PATHS:

            async def stamped(message: Message) -> None:
                if message["type"] == "http.response.start" and self.version is not None:
                    headers = [*message.get("headers", []), (HEADER, str(self.version).encode())]
                    message = {**message, "headers": headers}
                await send(message)

            await self.app(scope, receive, stamped)
        else:
            await self.app(scope, receive, send)

    async def _version_endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 200
        if scope["method"] == "POST":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            try:
                version = json.loads(body)["version"]
                if version is not None and (isinstance(version, bool)
                                            or not isinstance(version, int)):
                    raise TypeError(version)
                self.version = version
            except (ValueError, KeyError, TypeError):
                status = 400
        elif scope["method"] != "GET":
            status = 405
        payload = {"version": self.version} if status == 200 else {
            "error": {"message": 'expected {"version": <int or null>}', "code": status}}
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
