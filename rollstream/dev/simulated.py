"""A simulated vLLM server: vLLM's HTTP contract with scripted tokens, a GPU-like cost model and
injectable faults, for tests and benchmarks of routing, failures and saturation (no model).

It serves POST /v1/completions (token-id prompts, `return_token_ids`, sampled-token logprobs,
the X-Rollstream-Policy-Version header), GET /health, GET /metrics (`vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`), GET /v1/models, POST /v1/load_weights
and GET /rollstream/policy_version.

Cost model: continuous batching like vLLM's scheduler. At most `max_num_seqs` requests decode
together; each decode step emits one token for every running request and takes
`step_s(running)`, so latency grows with concurrency and throughput saturates: a GPU-bound
server. `busy_time(at_least)` measures the time spent with at least that many requests
running (utilization).

Faults (`fault`, changeable while serving): "error" answers 500, "hang" never answers (the
client's timeout fires), "drop" closes the connection without a response; `stop()` makes the
port refuse connections.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from rollstream.contracts.wire import POLICY_VERSION_HEADER, VERSION_PATH

Script = Callable[[list[int], dict[str, Any]], tuple[list[int], str]]


def guess_digit(prompt_ids: list[int], body: dict[str, Any]) -> tuple[list[int], str]:
    """Default script: one digit chosen from the prompt and seed, then the first stop token
    (byte ids: the embedded tokenizer's)."""
    digit = str((sum(prompt_ids) + int(body.get("seed") or 0)) % 10)
    stops = body.get("stop_token_ids") or []
    return [ord(digit), *stops[:1]], digit


@dataclass
class _Request:
    remaining: int
    done: asyncio.Future[None]


@dataclass
class SimulatedServer:
    script: Script = guess_digit
    step_s: Callable[[int], float] = lambda running: 0.0
    max_num_seqs: int = 256
    model: str = "sim-model"
    version: int | None = 0  # stamped on responses; None: like vLLM without the middleware
    adapters: list[str] = field(default_factory=list)  # LoRA adapters /v1/models lists
    fault: str | None = None
    received: list[dict[str, Any]] = field(default_factory=list)  # every completions body
    returned: list[list[int]] = field(default_factory=list)  # every token_ids answered
    keep: bool = True  # keep them (tests read them); off where a run's bodies would fill memory
    url: str = ""

    def __post_init__(self) -> None:
        self._running: list[_Request] = []
        self._waiting: list[_Request] = []
        self._wake = asyncio.Event()
        self._busy: dict[int, float] = {}  # seconds spent with exactly n running
        self._runner: web.AppRunner | None = None
        self._engine: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/load_weights", self._load_weights)
        app.router.add_get(VERSION_PATH, self._version)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"
        self._engine = asyncio.create_task(self._decode_loop())
        return self.url

    async def stop(self) -> None:
        """Stop serving: the port refuses connections from now on (a dead server)."""
        if self._engine is not None:
            self._engine.cancel()
            self._engine = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def busy_time(self, at_least: int) -> float:
        """Seconds spent with at least `at_least` requests decoding."""
        return sum(s for n, s in self._busy.items() if n >= at_least)

    def sequence_seconds(self) -> float:
        """Sequence-seconds decoded so far: over a window, its growth / (max_num_seqs x the
        window's seconds) is how full the decode batch was."""
        return sum(n * s for n, s in self._busy.items())

    # -- the engine ----------------------------------------------------------------------

    async def _decode_loop(self) -> None:
        while True:
            while self._waiting and len(self._running) < self.max_num_seqs:
                self._running.append(self._waiting.pop(0))
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            n = len(self._running)
            started = time.perf_counter()
            await asyncio.sleep(self.step_s(n))
            self._busy[n] = self._busy.get(n, 0.0) + time.perf_counter() - started
            for request in self._running:
                request.remaining -= 1
            for request in [r for r in self._running if r.remaining <= 0]:
                self._running.remove(request)
                if not request.done.done():
                    request.done.set_result(None)

    # -- endpoints -----------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        if self.fault == "hang":
            await asyncio.Event().wait()
        if self.fault == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if self.fault == "error":
            error = {"message": "injected failure", "type": "InternalServerError", "code": 500}
            return web.json_response({"error": error}, status=500)
        # orjson, as RUN's client: every turn echoes the whole context, and the servers of a
        # benchmark share its CPU with what it measures. Read from the stream, not
        # request.json(), which keeps the raw body while the request decodes; and the prompt
        # held as int32 (4 bytes an id, not a list's 8 to 36): thousands of requests of up to
        # 32k ids wait at a benchmark's servers.
        body = orjson.loads(await request.content.read())
        try:
            prompt = np.asarray(body.pop("prompt"), dtype=np.int32)
            if prompt.ndim != 1:
                raise ValueError(f"{prompt.ndim} dimensions")
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            error = {"message": f"prompt must be a list of token ids (this server takes no text):"
                                f" {exc!r}", "type": "BadRequestError", "code": 400}
            return web.json_response({"error": error}, status=400)
        ids, text = self.script(prompt.tolist(), body)
        ids = ids[: int(body["max_tokens"])]
        work = _Request(len(ids), asyncio.get_running_loop().create_future())
        self._waiting.append(work)
        self._wake.set()
        version = self.version  # the weights this request is decoded with
        await work.done
        if self.keep:
            self.received.append({**body, "prompt": prompt.tolist()})
            self.returned.append(ids)
        stops = body.get("stop_token_ids") or []
        finish = "stop" if ids and ids[-1] in stops else "length"
        choice = {
            "index": 0, "text": text, "finish_reason": finish,
            "stop_reason": ids[-1] if finish == "stop" else None,
            "token_ids": ids, "prompt_token_ids": prompt, "prompt_logprobs": None,
            "logprobs": {"text_offset": list(range(len(ids))), "token_logprobs": [-0.5] * len(ids),
                         "tokens": [f"token_id:{i}" for i in ids], "top_logprobs": None},
        }
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                 "total_tokens": len(prompt) + len(ids)}
        payload = {"id": "cmpl-sim", "object": "text_completion", "created": int(time.time()),
                   "model": body.get("model", self.model), "choices": [choice], "usage": usage}
        headers = {} if version is None else {POLICY_VERSION_HEADER: str(version)}
        return web.Response(body=orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
                            headers=headers, content_type="application/json")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        labels = f'{{engine="0",model_name="{self.model}"}}'
        gauges = {
            "vllm:num_requests_running": len(self._running),
            "vllm:num_requests_waiting": len(self._waiting),
            "vllm:kv_cache_usage_perc": len(self._running) / self.max_num_seqs,
        }
        lines = [f"{name}{labels} {float(value)}" for name, value in gauges.items()]
        return web.Response(text="\n".join(lines) + "\n")

    async def _models(self, request: web.Request) -> web.Response:
        cards = [{"id": self.model, "object": "model", "owned_by": "vllm", "parent": None}]
        cards += [{"id": name, "object": "model", "owned_by": "vllm", "parent": self.model}
                  for name in self.adapters]
        return web.json_response({"object": "list", "data": cards})

    async def _load_weights(self, request: web.Request) -> web.Response:
        self.version = int((await request.json())["version"])
        return web.json_response({"policy_version": self.version})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})


class Fleet:
    """Simulated servers on their own event loop in a daemon thread, for tests and benchmarks:
    `with Fleet([SimulatedServer(), ...]) as fleet: fleet.urls ...; fleet.kill(0)`."""

    def __init__(self, servers: list[SimulatedServer]) -> None:
        self.servers = servers
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sim-fleet",
                                        daemon=True)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 30) -> Any:
        """Run `coro` on the fleet's loop and wait for it (the servers are not thread-safe)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def kill(self, index: int) -> None:
        self.call(self.servers[index].stop())

    def __enter__(self) -> Fleet:
        self._thread.start()
        for server in self.servers:
            self.call(server.start())
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            self.call(server.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
