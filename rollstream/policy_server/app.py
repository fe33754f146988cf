"""HTTP server for the embedded policy, speaking vLLM's OpenAI-compatible contract where the two
overlap, so RUN talks to it exactly as to a vLLM server.

Endpoints: POST /v1/completions, POST /tokenize, POST /detokenize, GET /health, GET /v1/models,
GET /metrics (Prometheus, vLLM metric names), and weight reload: POST /v1/load_weights
{"path", "version"?} (Rollstream extension) or vLLM dev mode's
POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}.
GET /rollstream/policy_version reports the loaded version, as rollstream.vllm_middleware does
for vLLM.

Compatibility notes (vLLM 0.12+ behaviour, mirrored here):
- `token_ids` holds every sampled id including the stop token (EOS or a `stop_token_ids` entry)
  that ended the completion, and `logprobs` has an entry for it; only `text` leaves it out
  (unless `include_stop_str_in_output`). `stop_reason` is the matched `stop_token_ids` entry and
  null when EOS or max_tokens ended it.
- Without `return_token_ids`, `token_ids`/`prompt_token_ids` are null (vLLM serializes every field).
- Errors are `{"error": {"message", "type", "param", "code"}}` with the HTTP status in `code`; a
  prompt that does not fit max_model_len (alone, or with max_tokens) is a 400 worded like vLLM's.
- Logprobs are of the distribution actually sampled from (see policy_server.model), not raw.

Rollstream extension: every completions response carries the header X-Rollstream-Policy-Version,
the version of the weights that produced all of its tokens. A reload stops admitting requests,
lets the running ones finish on the old weights, swaps, then resumes (vLLM's `/pause?mode=wait`,
reload, `/resume`), so no request ever mixes weights; requests arriving meanwhile wait in the queue.

Continuous batching: one engine task owns the decode batch; requests queue up, join it between
steps and leave when finished, and each step (prefill of joiners + one token for every row) runs
in a worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rollstream.inference.chat import EmbeddedChatTemplate
from rollstream.inference.client import POLICY_VERSION_HEADER
from rollstream.inference.tokenizer import ByteTokenizer
from rollstream.policy_server.model import (
    DecodeBatch,
    SamplingParams,
    Sequence,
    TinyLM,
    build_model,
    check_context,
    load,
)
from rollstream.vllm_middleware import VERSION_PATH

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "rollstream-tiny"
_LOGPROB_FLOOR = -9999.0  # vLLM's JSON stand-in for -inf
# Request fields this server accepts only at their neutral value (a client that pins them
# explicitly, as Rollstream's does, still works; anything else would be silently wrong).
_NEUTRAL = {
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


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
                413: "RequestEntityTooLarge", 503: "ServiceUnavailableError"}


def error_response(message: str, status: int = 400, param: str | None = None) -> web.Response:
    err_type = _ERROR_TYPES.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


class Engine:
    """Owns the model and the decode batch; the only mutator of both is its loop task."""

    def __init__(self, model: TinyLM, version: int, max_batch: int, seed: int) -> None:
        self.batch = DecodeBatch(model, seed=seed)
        self.policy_version = version
        self.max_batch = max_batch
        self.waiting: deque[Sequence] = deque()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._futures: dict[Sequence, asyncio.Future[int]] = {}
        self._wake = asyncio.Event()
        self._swap: tuple[TinyLM, int, asyncio.Future[None]] | None = None
        self._reload_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def model(self) -> TinyLM:
        return self.batch.model

    @property
    def max_model_len(self) -> int:
        return self.model.config.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="policy-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def generate(self, seq: Sequence) -> int:
        """Queue `seq`, wait until it finishes; returns the policy version that generated it."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future
        self.waiting.append(seq)
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            seq.aborted = True  # the client went away: free its batch row at the next step
            raise

    async def load_weights(self, path: str, version: int | None) -> int:
        model, file_version = await asyncio.to_thread(load, path)
        version = file_version if version is None else version
        async with self._reload_lock:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._swap = (model, version, done)
            self._wake.set()
            await done
        return version

    async def _run(self) -> None:
        while True:
            if self._swap is not None and not self.batch:
                model, version, done = self._swap
                self._swap = None
                self.batch.model, self.policy_version = model, version
                log.info("policy version %d loaded", version)
                if not done.done():
                    done.set_result(None)
            admit: list[Sequence] = []
            # While a reload waits, admit nothing: the running batch drains on the old weights.
            free = self.max_batch - len(self.batch)
            while self._swap is None and self.waiting and len(admit) < free:
                seq = self.waiting.popleft()
                if seq.aborted:
                    self._futures.pop(seq, None)
                else:
                    admit.append(seq)
            if not admit and not self.batch:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                finished, refused = await asyncio.to_thread(self._step, admit)
            except Exception as exc:  # a bug must fail its requests, not hang them
                log.exception("decode step failed")
                for seq in [*self.batch.seqs, *admit]:
                    self._finish(seq, exc)
                self.batch.clear()
                continue
            for seq, exc in refused:
                self._finish(seq, exc)
            joined = [s for s in admit if all(s is not r for r, _ in refused)]
            self.prompt_tokens_total += sum(len(s.prompt_ids) for s in joined)
            self.generation_tokens_total += len(self.batch) + len(finished)
            for seq in finished:
                self._finish(seq, None)

    def _step(self, admit: list[Sequence]
              ) -> tuple[list[Sequence], list[tuple[Sequence, Exception]]]:
        """Admit, then decode one token for every row: (finished, refused with why). A
        request that cannot join the batch fails alone; the others join without it."""
        refused: list[tuple[Sequence, Exception]] = []
        if admit:
            try:
                self.batch.add(admit)  # all or nothing: the batch is unchanged if it raises
            except Exception:
                for seq in admit:
                    try:
                        self.batch.add([seq])
                    except Exception as exc:
                        log.warning("request refused at admission: %s", exc)
                        refused.append((seq, exc))
        return self.batch.step(), refused

    def _finish(self, seq: Sequence, exc: Exception | None) -> None:
        future = self._futures.pop(seq, None)
        if future is None or future.done():
            return
        if exc is None:
            future.set_result(self.policy_version)
        else:
            future.set_exception(exc)


class PolicyServer:
    def __init__(self, engine: Engine, model_name: str, root: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.root = root
        self.tokenizer = ByteTokenizer()
        self.template = EmbeddedChatTemplate(self.tokenizer)
        self.created = int(time.time())

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self.completions),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/health", self.health),
            web.get("/v1/models", self.models),
            web.get("/metrics", self.metrics),
            web.post("/v1/load_weights", self.load_weights),
            web.post("/collective_rpc", self.collective_rpc),
            web.get(VERSION_PATH, self.policy_version),
        ]

    # --- completions -------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise HTTPError(f"The model `{model}` does not exist.", 404, "model")
        for name, neutral in _NEUTRAL.items():
            if body.get(name) not in (None, neutral):
                raise HTTPError(
                    f"{name}={body[name]!r} is not supported by this server.", param=name
                )
        if body.get("stop"):
            raise HTTPError("stop strings are not supported; use stop_token_ids.", param="stop")
        prompt_ids = self._prompt_ids(body.get("prompt"))
        if "max_tokens" in body and body["max_tokens"] is None:  # vLLM: fill the context
            max_tokens = max(self.max_model_len - len(prompt_ids), 1)
        else:
            max_tokens = _field(body, "max_tokens", int, 16)  # vLLM's completions default
        logprobs = _field(body, "logprobs", int, None)
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=_field(body, "temperature", float, 1.0),
                top_p=_field(body, "top_p", float, 1.0),
                top_k=_field(body, "top_k", int, -1),
                seed=_field(body, "seed", int, None),
                stop_token_ids=tuple(_int_list(body, "stop_token_ids")),
                ignore_eos=_field(body, "ignore_eos", bool, False),
                logprobs=logprobs or 0,
            )
            check_context(len(prompt_ids), params.max_tokens, self.max_model_len)
        except ValueError as exc:  # ContextLengthError included: a 400, as in vLLM
            raise HTTPError(str(exc)) from exc
        seq = Sequence(prompt_ids, params)
        version = await self.engine.generate(seq)
        choice: dict[str, Any] = {
            "index": 0,
            "text": self._text(seq, body),
            "logprobs": self._logprobs(seq, body) if logprobs is not None else None,
            "finish_reason": seq.finish_reason,
            "stop_reason": seq.stop_reason,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
        }
        if _field(body, "return_token_ids", bool, False):
            choice["token_ids"] = seq.token_ids
            choice["prompt_token_ids"] = prompt_ids
        n_out = len(seq.token_ids)
        response = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + n_out,
                "completion_tokens": n_out,
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
        }
        return web.json_response(response, headers={POLICY_VERSION_HEADER: str(version)})

    def _prompt_ids(self, prompt: Any) -> list[int]:
        # vLLM also takes a batch (list of prompts); one prompt per request here.
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
            ids = prompt
        else:
            raise HTTPError("prompt must be a string or a list of token ids (one prompt).")
        if not ids:
            raise HTTPError("Prompt cannot be empty", param="prompt")
        bad = [t for t in ids if not 0 <= t < self.engine.vocab_size]
        if bad:
            raise HTTPError(f"Token id {bad[0]} is out of vocabulary", param="prompt")
        return ids

    def _text(self, seq: Sequence, body: dict[str, Any]) -> str:
        ids = seq.token_ids
        keep_stop = _field(body, "include_stop_str_in_output", bool, False)
        if seq.finish_reason == "stop" and not keep_stop:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, _field(body, "skip_special_tokens", bool, True))

    def _logprobs(self, seq: Sequence, body: dict[str, Any]) -> dict[str, Any]:
        as_ids = _field(body, "return_tokens_as_token_ids", bool, False)

        def name(token_id: int) -> str:
            return f"token_id:{token_id}" if as_ids else self.tokenizer.token_str(token_id)

        tokens = [name(t) for t in seq.token_ids]
        token_logprobs = [max(lp, _LOGPROB_FLOOR) for lp in seq.logprobs]
        # Like vLLM: the sampled token first, then the top alternatives (logprobs=0: sampled only).
        top: list[dict[str, float]] = []
        for i, (token, lp) in enumerate(zip(tokens, token_logprobs, strict=True)):
            entry = {token: lp}
            for alt, alt_lp in seq.top_logprobs[i] if seq.top_logprobs else ():
                entry.setdefault(name(alt), max(alt_lp, _LOGPROB_FLOOR))
            top.append(entry)
        offsets, offset = [], 0
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {
            "text_offset": offsets,
            "token_logprobs": token_logprobs,
            "tokens": tokens,
            "top_logprobs": top,
        }

    # --- tokenizer endpoints -----------------------------------------------------------------

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if "messages" in body:
            messages = body["messages"]
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
            ):
                raise HTTPError("messages must be a list of {role, content} objects.")
            add_generation_prompt = _field(body, "add_generation_prompt", bool, True)
            ids = self.template.render(messages, add_generation_prompt)
        elif isinstance(body.get("prompt"), str):
            ids = self.tokenizer.encode(body["prompt"])
        else:
            raise HTTPError("tokenize needs `prompt` (a string) or `messages`.")
        token_strs = None
        if _field(body, "return_token_strs", bool, False):
            token_strs = [self.tokenizer.token_str(t) for t in ids]
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.max_model_len,
                "tokens": ids,
                "token_strs": token_strs,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        try:
            text = self.tokenizer.decode(_int_list(body, "tokens"))
        except ValueError as exc:
            raise HTTPError(str(exc), param="tokens") from exc
        return web.json_response({"prompt": text})

    # --- status ------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.engine.alive else 503)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "rollstream",
            "root": self.root,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_EngineCollector(self.engine, self.model_name))
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    # --- weights -----------------------------------------------------------------------------

    async def load_weights(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        path = body.get("path")
        if not isinstance(path, str):
            raise HTTPError("load_weights needs `path` (a checkpoint file).", param="path")
        version = await self._reload(path, _field(body, "version", int, None))
        return web.json_response(
            {"policy_version": version}, headers={POLICY_VERSION_HEADER: str(version)}
        )

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if body.get("method") != "reload_weights":
            raise HTTPError("only method=reload_weights is supported.", param="method")
        kwargs = body.get("kwargs") or {}
        path = kwargs.get("weights_path")
        if not isinstance(path, str):
            raise HTTPError("reload_weights needs kwargs.weights_path.", param="kwargs")
        version = await self._reload(path, None)  # version from the checkpoint's metadata
        return web.json_response({"results": [None]}, headers={POLICY_VERSION_HEADER: str(version)})

    async def policy_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.engine.policy_version})

    async def _reload(self, path: str, version: int | None) -> int:
        try:
            return await self.engine.load_weights(path, version)
        except (OSError, ValueError, RuntimeError) as exc:  # missing, torn or mismatched file
            raise HTTPError(f"cannot load weights from {path}: {exc}", param="path") from exc


class _EngineCollector:
    """The engine's numbers under vLLM's metric names, written by prometheus_client as vLLM's
    own /metrics is (a counter's family and sample are both `<name>_total`)."""

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self.labels = {"engine": "0", "model_name": model_name}

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        # The GRU has no paged KV cache: "usage" is the share of batch slots (recurrent states)
        # in use, which is what limits admission here just as KV blocks do in vLLM.
        gauges = [
            ("num_requests_running", "Number of requests in model execution batches.",
             len(engine.batch)),
            ("num_requests_waiting", "Number of requests waiting to be processed.",
             len(engine.waiting)),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             len(engine.batch) / engine.max_batch),
        ]
        counters = [
            ("num_preemptions", "Cumulative number of preemption from the engine.", 0),
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
             "tokens.", 0),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 0),
            ("prompt_tokens", "Number of prefill tokens processed.",
             engine.prompt_tokens_total),
            ("generation_tokens", "Number of generation tokens processed.",
             engine.generation_tokens_total),
        ]
        names, values = list(self.labels), list(self.labels.values())
        for name, doc, value in gauges:
            family = GaugeMetricFamily(f"vllm:{name}", doc, labels=names)
            family.add_metric(values, float(value))
            yield family
        for name, doc, value in counters:
            counter = CounterMetricFamily(f"vllm:{name}", doc, labels=names)
            counter.add_metric(values, float(value))
            yield counter
        version = GaugeMetricFamily("rollstream:policy_version",
                                    "Version of the loaded weights (Rollstream).", labels=names)
        version.add_metric(values, float(engine.policy_version))
        yield version


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """A typed request field; absent or null → default."""
    value = body.get(name)
    if value is None:
        return default
    if kind is float and _is_int(value):
        return float(value)
    if (kind is int and not _is_int(value)) or not isinstance(value, kind):
        raise HTTPError(f"{name} must be of type {kind.__name__}.", param=name)
    return value


def _int_list(body: dict[str, Any], name: str) -> list[int]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise HTTPError(f"{name} must be a list of integers.", param=name)
    return value


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":  # vLLM's validate_json_request
        raise HTTPError("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        body = await request.json()
    except ValueError as exc:
        raise HTTPError(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise HTTPError("the request body must be a JSON object.")
    return body


@web.middleware
async def _errors(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    try:
        return await handler(request)
    except HTTPError as exc:
        return error_response(str(exc), exc.status, exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own 404, 405, 413 (body over client_max_size): the same JSON errors.
        return error_response(exc.text or exc.reason, exc.status)
    except Exception as exc:
        log.exception("request failed")
        return error_response(f"{type(exc).__name__}: {exc}", 500)


def create_app(
    model_path: str | Path | None = None,
    *,
    model_name: str = DEFAULT_MODEL_NAME,
    max_batch: int = 64,
    seed: int = 0,
    num_threads: int = 1,
) -> web.Application:
    """The server for a checkpoint, or for the seed weights `build_model(seed)` (version 0) when
    `model_path` is None; nothing is ever downloaded."""
    # One torch thread: the tiny model's matmuls gain nothing from more, and the event loop and
    # JSON work need the other cores.
    torch.set_num_threads(num_threads)
    if model_path is None:
        model, version = build_model(seed), 0
    else:
        model, version = load(model_path)
    root = str(model_path) if model_path is not None else f"seed:{seed}"
    return build_app(Engine(model, version, max_batch, seed), model_name, root)


def build_app(engine: Any, model_name: str, root: str) -> web.Application:
    """The HTTP app around an engine: Engine, or anything with its interface (generate,
    start/stop, alive, max_model_len, vocab_size, the metric counters, load_weights), such as
    the scripted policy's (rollstream.dev.scripted)."""
    app = web.Application(middlewares=[_errors], client_max_size=16 * 1024**2)
    app.router.add_routes(PolicyServer(engine, model_name, root).routes())

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        engine.start()  # needs the running loop
        yield
        await engine.stop()

    app.cleanup_ctx.append(engine_ctx)
    return app


async def serve(
    host: str = "127.0.0.1",
    port: int = 8011,
    *,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    app: web.Application | None = None,
    **app_kwargs: Any,
) -> None:
    """Serve `app` (default: create_app(**app_kwargs)) until `stop` is set (forever without
    one); `ready(url)` is called once listening. Port 0 picks a free port (the url has it)."""
    # handler_cancellation: a client that gives up (timeout) cancels its handler, which frees
    # the request's batch row instead of decoding up to max_tokens for nobody.
    runner = web.AppRunner(app or create_app(**app_kwargs), access_log=None,
                           handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        url = f"http://{host}:{runner.addresses[0][1]}"
        if ready is not None:
            ready(url)
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()


class BackgroundServer:
    """The server on its own event loop in a daemon thread, for tests and one-process demos:
    `with BackgroundServer() as url: ...`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **app_kwargs: Any) -> None:
        self._args = (host, port)
        self._app_kwargs = app_kwargs
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="policy-server", daemon=True)
        self.url = ""

    def start(self, timeout_s: float = 30) -> str:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("policy server did not start")
        if self._error is not None:
            raise RuntimeError("policy server failed to start") from self._error
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(url: str) -> None:
                self.url = url
                self._ready.set()

            await serve(*self._args, ready=ready, stop=self._stop, **self._app_kwargs)

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
        finally:
            self._ready.set()
