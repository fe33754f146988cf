"""HTTP server for the embedded policy, speaking vLLM's OpenAI-compatible contract where the two
overlap, so RUN talks to it exactly as to a vLLM server.

Endpoints: POST /v1/completions, POST /tokenize, POST /detokenize, GET /health, GET /v1/models,
GET /metrics (Prometheus, vLLM metric names), and weight reload: POST /v1/load_weights
{"path", "version"?} (Rollstream extension) or vLLM dev mode's
POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}.
GET /rollstream/policy_version reports the loaded version, as rollstream.vllm_middleware does
for vLLM.

Adapters, as vLLM's runtime LoRA endpoints: POST /v1/load_lora_adapter {"lora_name",
"lora_path", "load_inplace"?}, POST /v1/unload_lora_adapter {"lora_name"}; GET /v1/models lists
them after the base model (`parent` naming it, `root` the path), and a completions request
naming one (`model: <lora_name>`) is sampled by its weights alone; its version header is the
adapter's (the N of a `<adapter>-v<N>` name, else its checkpoint's). An adapter of the tiny
model is a whole checkpoint of it (`rollstream.policy_server.model.save`), not a low-rank delta:
the contract is vLLM's, the weights are what this model has (see `engine`).

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
the version of the weights that produced all of its tokens (the engine never mixes weights
within a request: see `engine`).

Here: the routes and responses. The model is `model`, continuous batching and reloads `engine`,
request parsing and vLLM's error bodies `protocol`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rollstream.contracts.inference import ByteTokenizer, EmbeddedChatTemplate
from rollstream.contracts.wire import POLICY_VERSION_HEADER, VERSION_PATH
from rollstream.policy_server.engine import AdapterGone, Engine
from rollstream.policy_server.model import (
    Sequence,
    build_model,
    check_context,
    load,
)
from rollstream.policy_server.protocol import (
    LOGPROB_FLOOR,
    NEUTRAL,
    HTTPError,
    error_response,
    field,
    int_list,
    is_int,
    json_body,
    sampling_params,
)

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "rollstream-tiny"


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
            web.post("/v1/load_lora_adapter", self.load_lora_adapter),
            web.post("/v1/unload_lora_adapter", self.unload_lora_adapter),
            web.get(VERSION_PATH, self.policy_version),
        ]

    # --- completions -------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        model = body.get("model")
        if model is not None and model != self.model_name and (
                not isinstance(model, str) or model not in self.engine.adapters):
            raise HTTPError(f"The model `{model}` does not exist.", 404, "model")
        for name, neutral in NEUTRAL.items():
            if body.get(name) not in (None, neutral):
                raise HTTPError(
                    f"{name}={body[name]!r} is not supported by this server.", param=name
                )
        if body.get("stop"):
            raise HTTPError("stop strings are not supported; use stop_token_ids.", param="stop")
        prompt_ids = self._prompt_ids(body.get("prompt"))
        try:
            params = sampling_params(body, len(prompt_ids), self.max_model_len)
            check_context(len(prompt_ids), params.max_tokens, self.max_model_len)
        except ValueError as exc:  # ContextLengthError included: a 400, as in vLLM
            raise HTTPError(str(exc)) from exc
        seq = Sequence(prompt_ids, params)
        if model in self.engine.adapters:
            seq.adapter = model
        try:
            version = await self.engine.generate(seq)
        except AdapterGone as exc:  # unloaded while the request waited
            raise HTTPError(f"The model `{model}` does not exist.", 404, "model") from exc
        choice: dict[str, Any] = {
            "index": 0,
            "text": self._text(seq, body),
            "logprobs": self._logprobs(seq, body) if body.get("logprobs") is not None else None,
            "finish_reason": seq.finish_reason,
            "stop_reason": seq.stop_reason,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
        }
        if field(body, "return_token_ids", bool, False):
            choice["token_ids"] = seq.token_ids
            choice["prompt_token_ids"] = prompt_ids
        n_out = len(seq.token_ids)
        response = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model or self.model_name,
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
        elif isinstance(prompt, list) and all(is_int(t) for t in prompt):
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
        keep_stop = field(body, "include_stop_str_in_output", bool, False)
        if seq.finish_reason == "stop" and not keep_stop:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, field(body, "skip_special_tokens", bool, True))

    def _logprobs(self, seq: Sequence, body: dict[str, Any]) -> dict[str, Any]:
        as_ids = field(body, "return_tokens_as_token_ids", bool, False)

        def name(token_id: int) -> str:
            return f"token_id:{token_id}" if as_ids else self.tokenizer.token_str(token_id)

        tokens = [name(t) for t in seq.token_ids]
        token_logprobs = [max(lp, LOGPROB_FLOOR) for lp in seq.logprobs]
        # Like vLLM: the sampled token first, then the top alternatives (logprobs=0: sampled only).
        top: list[dict[str, float]] = []
        for i, (token, lp) in enumerate(zip(tokens, token_logprobs, strict=True)):
            entry = {token: lp}
            for alt, alt_lp in seq.top_logprobs[i] if seq.top_logprobs else ():
                entry.setdefault(name(alt), max(alt_lp, LOGPROB_FLOOR))
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
        body = await json_body(request)
        if "messages" in body:
            messages = body["messages"]
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
            ):
                raise HTTPError("messages must be a list of {role, content} objects.")
            add_generation_prompt = field(body, "add_generation_prompt", bool, True)
            ids = self.template.render(messages, add_generation_prompt)
        elif isinstance(body.get("prompt"), str):
            ids = self.tokenizer.encode(body["prompt"])
        else:
            raise HTTPError("tokenize needs `prompt` (a string) or `messages`.")
        token_strs = None
        if field(body, "return_token_strs", bool, False):
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
        body = await json_body(request)
        try:
            text = self.tokenizer.decode(int_list(body, "tokens"))
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
        adapters = [{**card, "id": name, "root": path, "parent": self.model_name}
                    for name, path in self.engine.adapters.items()]
        return web.json_response({"object": "list", "data": [card, *adapters]})

    async def metrics(self, request: web.Request) -> web.Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_EngineCollector(self.engine, self.model_name))
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    # --- weights -----------------------------------------------------------------------------

    async def load_weights(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        path = body.get("path")
        if not isinstance(path, str):
            raise HTTPError("load_weights needs `path` (a checkpoint file).", param="path")
        version = await self._reload(path, field(body, "version", int, None))
        return web.json_response(
            {"policy_version": version}, headers={POLICY_VERSION_HEADER: str(version)}
        )

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if body.get("method") != "reload_weights":
            raise HTTPError("only method=reload_weights is supported.", param="method")
        kwargs = body.get("kwargs") or {}
        path = kwargs.get("weights_path")
        if not isinstance(path, str):
            raise HTTPError("reload_weights needs kwargs.weights_path.", param="kwargs")
        version = await self._reload(path, None)  # version from the checkpoint's metadata
        return web.json_response({"results": [None]}, headers={POLICY_VERSION_HEADER: str(version)})

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise HTTPError("load_lora_adapter needs `lora_name` and `lora_path`.")
        if name == self.model_name:
            raise HTTPError(f"`{name}` is the base model's name.", param="lora_name")
        if name in self.engine.adapters and not field(body, "load_inplace", bool, False):
            raise HTTPError(f"The lora adapter '{name}' has already been loaded. If you want to "
                            f"load the adapter in place, set 'load_inplace' to True.",
                            param="lora_name")
        try:
            version = await self.engine.load_adapter(name, path)
        except (OSError, ValueError, RuntimeError) as exc:  # missing, torn or mismatched file
            raise HTTPError(f"cannot load adapter {name} from {path}: {exc}",
                            param="lora_path") from exc
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.",
                            headers={POLICY_VERSION_HEADER: str(version)})

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or name not in self.engine.adapters:
            raise HTTPError(f"The lora adapter '{name}' cannot be found.", 404, "lora_name")
        await self.engine.unload_adapter(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

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
             engine.running),
            ("num_requests_waiting", "Number of requests waiting to be processed.",
             len(engine.waiting)),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             engine.running / engine.max_batch),
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
