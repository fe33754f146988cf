"""The recording gateway: OpenAI's chat completions API served by RUN, one per RUN process.

A harness episode gets an API key (random, unguessable) that names the episode; the harness is
pointed at the gateway with OPENAI_BASE_URL / OPENAI_API_KEY and runs its own loop. Each call:

1. the messages (tools and tool calls included) are rendered with RUN's chat template and
   continued token-exactly from the episode's previous call, or split as a new sample
   (rollstream.gateway.messages);
2. the prompt is sampled, recorded as a Turn and checkpointed to episode-state by the very
   turn RUN's own loop takes (rollstream.turns: router, retry budget, budgets, failures), the
   tool calls parsed with the swe environment's parsers;
3. the answer goes back as an OpenAI chat completion, or as server-sent events when the
   request asks for `stream`.

Calls of one episode are served one at a time, in arrival order (a turn extends the previous
one). `POST /rollstream/v1/exec` runs a command in the episode's sandbox for harnesses whose
tools must not run on RUN's host (rollstream.gateway.clients).

Failures: a call past the episode's turn or token budget, or one the server finds too long,
ends the episode as MAX_TURNS / TRUNCATED; inference failing past RUN's retry budget, or the
sandbox failing, ends it as infra. The harness is told with an OpenAI-style error and stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rollstream.contracts.events import Termination, Trajectory
from rollstream.envs.base import StepResult
from rollstream.gateway.messages import BadChatRequest, PromptBuilder, assistant_message, normalize
from rollstream.inference.client import InferenceError
from rollstream.runtime import EventContext
from rollstream.sandbox import SandboxError
from rollstream.turns import EpisodeEnded, Playing, Turns

if TYPE_CHECKING:
    from rollstream.envs.harness import HarnessEnv

log = logging.getLogger("rollstream.gateway")

EXEC_PATH = "/rollstream/v1/exec"


class CallRefused(Exception):
    """A call the gateway answers with an OpenAI-style error instead of a completion."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.code, self.kind = status, code, kind

    def response(self) -> web.Response:
        return web.json_response({"error": {"message": str(self), "type": self.kind,
                                            "param": None, "code": self.code}},
                                 status=self.status)


async def _json_object(request: web.Request) -> dict:
    """The request's body as a JSON object, or the 400 that says what is wrong with it."""
    try:
        body = await request.json()
    except ValueError as exc:
        raise CallRefused(400, f"request body is not JSON: {exc}", "invalid_json") from exc
    if not isinstance(body, dict):
        raise CallRefused(400, "request body must be a JSON object", "invalid_json")
    return body


@dataclass(kw_only=True)
class GatewayEpisode(Playing):
    """One harness episode as the gateway serves it: its key, and the harness's environment."""

    key: str
    env: HarnessEnv
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def end(self, termination: Termination, detail: str) -> None:
        """Stop the episode (the first reason wins); the harness is stopped by its runner."""
        if not self.ended.is_set():
            super().end(termination, detail)
            self.ended.set()


class Gateway:
    def __init__(self, turns: Turns, host: str = "127.0.0.1", port: int = 0) -> None:
        self.turns = turns
        self.prompts = PromptBuilder(turns.template)
        self.host, self.port = host, port
        self.episodes: dict[str, GatewayEpisode] = {}
        self._runner: web.AppRunner | None = None
        self._starting = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post(EXEC_PATH, self._exec)
        return app

    async def start(self) -> None:
        """Listen (on first use: a RUN process without harness episodes opens no port)."""
        async with self._starting:
            if self._runner is not None:
                return
            runner = web.AppRunner(self.app(), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            self.port = runner.addresses[0][1]
            self._runner = runner
            log.info("gateway listening on %s", self.base_url)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def open(self, trajectory: Trajectory, ctx: EventContext, env: HarnessEnv, state: dict,
             max_total_tokens: int | None) -> GatewayEpisode:
        episode = GatewayEpisode(trajectory=trajectory, ctx=ctx, state=state,
                                 max_total_tokens=max_total_tokens,
                                 key=secrets.token_urlsafe(24), env=env)
        self.episodes[episode.key] = episode
        return episode

    def close_episode(self, episode: GatewayEpisode) -> None:
        self.episodes.pop(episode.key, None)

    # -- a harness episode -------------------------------------------------------------------

    async def play(self, env: HarnessEnv, trajectory: Trajectory, ctx: EventContext) -> None:
        """Run the episode's harness against this gateway until it exits, then record how it
        ended and the workspace's diff. An episode resumed from a checkpoint is restarted
        cleanly: its harness died with the process that ran it, and a harness's own state
        cannot be rebuilt from the recorded calls, so the calls are dropped, the sandbox made
        anew, and `restarts` counted in the state; the episode is still scored once."""
        from rollstream.envs.harness import HarnessEndpoints, HarnessExit, HarnessSpec

        await self.start()
        task = trajectory["task"]
        state = json.loads(trajectory["env_state"])
        if trajectory["turns"]:
            log.info("%s: restarting its harness (%d calls recorded before)",
                     trajectory["episode_id"], len(trajectory["turns"]))
            await env.close(task, state)
            restarts = state.get("restarts", 0) + 1
            state = await env.reset(task)
            state["restarts"] = restarts
            trajectory["turns"] = []
            trajectory["env_state"] = json.dumps(state)
        spec = HarnessSpec.from_task(task)
        episode = self.open(trajectory, ctx, env, state, spec.max_total_tokens)
        try:
            if state.get("failure") is None:
                endpoints = HarnessEndpoints(self.base_url, episode.key, EXEC_PATH)
                outcome = await env.run_harness(task, endpoints, episode.ended)
            else:
                outcome = HarnessExit(None, "no workspace", "")
            stopped = episode.ended.is_set()
            episode.ended.set()  # refuse calls from here on
            async with episode.lock:  # and let one in flight finish its record
                await env.finish(task, state, outcome)
        finally:
            self.close_episode(episode)
        if not stopped:
            if outcome.returncode == 0:
                trajectory["termination"] = "DONE"
            elif outcome.returncode is not None:  # the harness crashed: the agent's failure
                trajectory["termination"] = "AGENT_ERROR"
            else:
                trajectory["termination"] = "TRUNCATED"
            trajectory["termination_detail"] = outcome.reason
            if outcome.returncode:
                trajectory["termination_detail"] += "\n" + outcome.output_tail
        trajectory["env_state"] = json.dumps(state)

    # -- requests ----------------------------------------------------------------------------

    def _episode(self, request: web.Request) -> GatewayEpisode:
        auth = request.headers.get("Authorization", "")
        key = auth.removeprefix("Bearer ").strip()
        episode = self.episodes.get(key)
        if episode is None:
            raise CallRefused(401, "unknown API key: it names no running episode",
                              "invalid_api_key", "authentication_error")
        return episode

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": "rollstream", "object": "model", "created": 0, "owned_by": "rollstream"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            episode = self._episode(request)
            body = await _json_object(request)
            try:
                messages = normalize(body.get("messages"))
            except BadChatRequest as exc:
                raise CallRefused(400, str(exc), "invalid_messages") from exc
            tools = body.get("tools")
            if tools is not None and not isinstance(tools, list):
                raise CallRefused(400, "'tools' must be a list", "invalid_tools")
            async with episode.lock:
                result = await self._call(episode, messages, tools)
        except CallRefused as exc:
            return exc.response()
        model = str(body.get("model") or "rollstream")
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await _stream(request, result, model, include_usage)
        return web.json_response({**result, "object": "chat.completion", "model": model})

    async def _call(self, episode: GatewayEpisode, messages: list[dict],
                    tools: list | None) -> dict[str, Any]:
        trajectory = episode.trajectory
        turns = trajectory["turns"]
        if episode.ended.is_set():
            raise CallRefused(409, f"the episode has ended ({trajectory['termination']})",
                              "episode_ended")
        try:
            sampled = await self.turns.sample(
                episode, lambda sample: self.prompts.prompt(sample, messages, tools),
                observation=_observation(messages) if turns else None)
        except EpisodeEnded as exc:
            raise _refusal(trajectory, len(turns)) from exc
        except InferenceError as exc:  # a request the server refuses: a bug, not the agent's
            episode.end("INFRA_ERROR", str(exc))
            raise CallRefused(502, f"inference failed: {exc}", "inference_failed",
                              "server_error") from exc
        completion = sampled.completion
        message, recorded = assistant_message(completion.text, len(turns))
        step = StepResult(observation=None, done=False, tool_call=recorded, state=episode.state)
        self.turns.record(episode, sampled, step, 0.0)
        finish = completion.finish_reason
        if message.get("tool_calls") and finish == "stop":
            finish = "tool_calls"
        prompt_tokens = len(episode.sample) - len(completion.token_ids)
        return {
            "id": f"chatcmpl-{trajectory['episode_id']}-{len(turns) - 1}",
            "created": int(time.time()),
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens,
                      "completion_tokens": len(completion.token_ids),
                      "total_tokens": prompt_tokens + len(completion.token_ids)},
        }

    async def _exec(self, request: web.Request) -> web.Response:
        try:
            episode = self._episode(request)
            body = await _json_object(request)
            command, timeout = body.get("command"), body.get("timeout")
            if not isinstance(command, str):
                raise CallRefused(400, "'command' must be a string", "invalid_command")
            if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
                raise CallRefused(400, "'timeout' must be a positive number", "invalid_timeout")
            if episode.ended.is_set():
                raise CallRefused(409, "the episode has ended", "episode_ended")
            try:
                result = await episode.env.execute(episode.trajectory["task"], episode.state,
                                                   command, timeout)
            except SandboxError as exc:
                episode.env.fail(episode.state, "infra", f"sandbox: {exc}")
                episode.end("DONE", "sandbox failed")  # evaluate reports the state's failure
                raise CallRefused(503, f"sandbox failed: {exc}", "sandbox_failed",
                                  "server_error") from exc
        except CallRefused as exc:
            return exc.response()
        return web.json_response({"output": result.text, "returncode": result.exit_code,
                                  "timed_out": result.timed_out})


def _refusal(trajectory: Trajectory, calls: int) -> CallRefused:
    """The OpenAI-style error that tells the harness how its episode ended."""
    termination, detail = trajectory["termination"], trajectory["termination_detail"]
    if termination == "MAX_TURNS":
        return CallRefused(400, f"the episode's budget of {calls} calls is spent", "max_turns")
    if termination == "TRUNCATED":
        return CallRefused(400, f"maximum context length exceeded: {detail}",
                           "context_length_exceeded")
    return CallRefused(503, detail, "inference_unavailable", "server_error")


def _observation(messages: list[dict]) -> str:
    """The messages after the last assistant message: what the harness answered to it."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    return "\n".join(m["content"] for m in messages[last + 1:])


def _chunk(result: dict[str, Any], model: str, delta: dict[str, Any],
           finish: str | None) -> bytes:
    chunk = {"id": result["id"], "object": "chat.completion.chunk", "created": result["created"],
             "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                          "logprobs": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _stream(request: web.Request, result: dict[str, Any], model: str,
                  include_usage: bool) -> web.StreamResponse:
    """The completion as OpenAI's server-sent events: role and content, the tool calls (whole,
    one delta each), the finish reason, usage when asked, then [DONE]."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    choice = result["choices"][0]
    message = choice["message"]
    write: Callable[[bytes], Any] = response.write
    await write(_chunk(result, model, {"role": "assistant", "content": message["content"] or ""},
                       None))
    for i, call in enumerate(message.get("tool_calls", [])):
        await write(_chunk(result, model, {"tool_calls": [{"index": i, **call}]}, None))
    await write(_chunk(result, model, {}, choice["finish_reason"]))
    if include_usage:
        usage = {"id": result["id"], "object": "chat.completion.chunk",
                 "created": result["created"], "model": model, "choices": [],
                 "usage": result["usage"]}
        await write(b"data: " + json.dumps(usage).encode() + b"\n\n")
    await write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
