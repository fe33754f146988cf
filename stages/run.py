"""RUN: play an episode, turn by turn, against inference servers, checkpointing every turn.

The conversation lives as token ids: each turn appends the tokens of the new user message (the
chat-template delta) and the ids the server sampled, verbatim, so the trainer sees exactly what
was sampled. Where the chat template is not append-only (it re-renders earlier turns once a new
message follows), the turn starts a new sample (Turn.new_sample) holding the whole re-rendered
context; history is never silently re-tokenized. The template is the embedded policy's, or a
real model's from a local tokenizer directory (`--tokenizer-path`).

Inference goes through rollstream.inference.routing.Router: an episode stays on one server (prefix
cache), new episodes go to the least-loaded healthy server, and when every server is at its cap RUN
takes no new episodes (`capacity`, which the runtime checks before consuming). A failed call
(timeout, refused, 5xx) is retried with backoff within RETRY_DELAYS_S, on another server when its
own is down; past the budget the episode ends as INFRA_ERROR, never as a reward. A server inside a
weight update (paused, or answering without a version) is waited for instead, for up to
UPDATE_WINDOW_S, without spending that budget.

After every turn the unfinished trajectory is written to <p>.episode-state (keyed by episode
id, co-partitioned with <p>.episodes); a RUN process that takes over a partition reads those
checkpoints back and resumes episodes where they stopped instead of replaying them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from rollstream import kafka, metrics
from rollstream.bounds import check_episode
from rollstream.codec import codec, pack_ids, pack_logprobs, unpack_ids
from rollstream.config import Settings
from rollstream.envs.harness import HarnessEnv
from rollstream.envs.registry import UnknownEnv, get_env
from rollstream.events import EPISODE, TRAJECTORY
from rollstream.inference.chat import ChatTemplate, EmbeddedChatTemplate
from rollstream.inference.client import (
    Completion,
    ContextOverflow,
    InferenceUnavailable,
    ServerError,
    ServerUpdating,
    TextMismatch,
)
from rollstream.inference.detokenize import served_text
from rollstream.inference.routing import Router
from rollstream.runtime import EventContext, InvalidEvent, Output, Stage

if TYPE_CHECKING:
    from rollstream.gateway.server import Gateway

log = logging.getLogger("rollstream.run")

RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)  # the retry budget for a failing inference call
# How long a turn waits out a weight update (a paused server's 503, a response without a
# version) before that, too, counts as an infra failure; polled every UPDATE_POLL_S.
UPDATE_WINDOW_S = 900.0
UPDATE_POLL_S = 0.5


def now_ms() -> int:
    return int(time.time() * 1000)


SYSTEM_PROMPT_KEY = "system_prompt"  # in Task.metadata: the task's system message


def conversation(task: dict, turns: list[dict],
                 observation_role: str = "user") -> list[dict[str, str]]:
    """The episode as chat messages: the task's system prompt (Task.metadata["system_prompt"])
    if any, the task prompt, then each completion and observation. An environment whose
    observations are tool results (`observation_role = "tool"`) has them rendered as `tool`
    messages wherever the turn made a tool call; other observations stay `user` messages."""
    messages = []
    system = (task.get("metadata") or {}).get(SYSTEM_PROMPT_KEY)
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": task["prompt"]})
    for turn in turns:
        messages.append({"role": "assistant", "content": turn["completion_text"]})
        if turn["observation"] is not None:
            role = observation_role if turn.get("tool_call") else "user"
            messages.append({"role": role, "content": turn["observation"]})
    return messages


def sample_ids(turns: list[dict]) -> list[int]:
    """The token ids of the current sample: from the last turn that started one."""
    start = max((i for i, t in enumerate(turns) if t.get("new_sample")), default=0)
    ids: list[int] = []
    for turn in turns[start:]:
        ids.extend(unpack_ids(turn["prompt_ids"]).tolist())
        ids.extend(unpack_ids(turn["completion_ids"]).tolist())
    return ids


class RunStage(Stage):
    name = "run"
    input_record = EPISODE

    def __init__(self, settings: Settings, template: ChatTemplate | None = None) -> None:
        super().__init__(settings)
        self.template: ChatTemplate = template or self._template(settings)
        self.router: Router | None = None
        # Checkpoints of unfinished episodes, by input partition, then episode id.
        self.checkpoints: dict[int, dict[str, dict]] = {}
        self.gateway: Gateway | None = None  # started by the first harness episode

    @staticmethod
    def _template(settings: Settings) -> ChatTemplate:
        if not settings.tokenizer_path:
            if settings.chat_template or settings.chat_template_kwargs:
                raise ValueError("--chat-template and --chat-template-kwargs need "
                                 "--tokenizer-path (the embedded policy has one template)")
            return EmbeddedChatTemplate()
        from rollstream.inference.hf_template import HFChatTemplate  # tokenizers only when used

        try:
            kwargs = json.loads(settings.chat_template_kwargs or "{}")
        except ValueError as exc:
            raise ValueError(f"chat_template_kwargs is not JSON: {exc}") from exc
        if not isinstance(kwargs, dict):
            raise ValueError("chat_template_kwargs must be a JSON object, e.g. "
                             '{"enable_thinking": false}')
        return HFChatTemplate(settings.tokenizer_path, kwargs,
                              chat_template=settings.chat_template or None)

    def input_topic(self) -> str:
        return self.topics.episodes

    async def start(self) -> None:
        self.router = Router(self.settings.policy_urls,
                             max_episodes=self.settings.server_max_in_flight,
                             timeout_s=self.settings.request_timeout_s,
                             health_interval_s=self.settings.health_interval_s)
        await self.router.start()

    async def close(self) -> None:
        if self.router is not None:
            await self.router.close()
        if self.gateway is not None:
            await self.gateway.close()

    def _gateway(self) -> Gateway:
        if self.gateway is None:
            from rollstream.gateway.server import Gateway  # it reuses this module's turn code

            self.gateway = Gateway(self, port=self.settings.gateway_port)
        return self.gateway

    def capacity(self) -> int | None:
        return self.router.capacity() if self.router is not None else 0

    # -- checkpoints -------------------------------------------------------------------------

    def on_assign(self, partitions: list[int]) -> None:
        tps = [TopicPartition(self.topics.episode_state, p, OFFSET_BEGINNING) for p in partitions]
        for p in partitions:
            self.checkpoints[p] = {}
        c = codec()
        for msg in kafka.read_partitions(self.settings, tps):
            episode = msg.key().decode()
            if msg.value() is None:
                self.checkpoints[msg.partition()].pop(episode, None)
            else:
                self.checkpoints[msg.partition()][episode] = c.decode_as(TRAJECTORY, msg.value())

    def on_revoke(self, partitions: list[int]) -> None:
        for p in partitions:
            self.checkpoints.pop(p, None)

    def checkpoint(self, ctx: EventContext, trajectory: dict | None, episode_id: str) -> None:
        ctx.emit(Output(self.topics.episode_state, episode_id,
                        None if trajectory is None else TRAJECTORY, trajectory,
                        partition=ctx.partition))

    # -- the episode -------------------------------------------------------------------------

    async def handle(self, episode: dict, ctx: EventContext) -> list[Output]:
        check_episode(episode, self.settings)  # bounds at the door, also for episodes sent here
        task = episode["task"]
        episode_id = episode["episode_id"]
        try:
            env = get_env(task["env"])
        except UnknownEnv as exc:
            raise InvalidEvent(str(exc)) from exc
        trajectory = self.checkpoints.get(ctx.partition, {}).pop(episode_id, None)
        assert self.router is not None
        # Take a server before the first await, so capacity() counts this episode at once; a
        # resumed episode goes back to its server while that one is usable.
        turns = trajectory["turns"] if trajectory is not None else []
        self.router.pin(episode_id, prefer=turns[-1]["server"] if turns else None)
        try:
            if trajectory is None:
                trajectory = {
                    "episode_id": episode_id,
                    "task": task,
                    "sample_index": episode["sample_index"],
                    "turns": [],
                    "termination": "RUNNING",
                    "termination_detail": "",
                    "env_state": json.dumps(await env.reset(task)),
                    "started_at_ms": now_ms(),
                    "finished_at_ms": 0,
                }
            else:
                log.info("resuming %s at turn %d", episode_id, len(turns))
            try:
                if isinstance(env, HarnessEnv):  # the harness plays, through the gateway
                    await self._gateway().play(env, trajectory, ctx)
                else:
                    await self._play(env, trajectory, ctx)
            finally:
                # Also on cancellation (partition revoked): the next owner re-creates what it
                # needs.
                await env.close(task, json.loads(trajectory["env_state"]))
        finally:
            self.router.release(episode_id)
        trajectory["finished_at_ms"] = now_ms()
        self.checkpoint(ctx, None, episode_id)  # done: drop the checkpoint
        return [Output(self.topics.trajectories, episode_id, TRAJECTORY, trajectory)]

    async def _play(self, env, trajectory: dict, ctx: EventContext) -> None:
        task = trajectory["task"]
        turns = trajectory["turns"]
        sample = sample_ids(turns)
        state = json.loads(trajectory["env_state"])
        while True:
            if len(turns) >= task["max_turns"]:
                trajectory["termination"] = "MAX_TURNS"
                return
            prompt_ids, new_sample = self.template.next_prompt(
                sample, conversation(task, turns, env.observation_role))
            if new_sample:  # never at the first turn: there is no history to re-render
                log.info("%s: template re-renders history at turn %d; new sample",
                         trajectory["episode_id"], len(turns))
                sample = []
            started = now_ms()
            try:
                completion = await self.complete(sample + prompt_ids, trajectory, len(turns))
            except ContextOverflow as exc:
                trajectory["termination"] = "TRUNCATED"
                trajectory["termination_detail"] = str(exc)
                return
            except (InferenceUnavailable, TextMismatch) as exc:
                trajectory["termination"] = "INFRA_ERROR"
                trajectory["termination_detail"] = str(exc)
                return
            env_started = time.perf_counter()
            step = await env.step(task, state, completion.text)
            state = step.state
            turns.append(self.turn_record(len(turns), prompt_ids, new_sample, completion, started,
                                    step, (time.perf_counter() - env_started) * 1000))
            sample += prompt_ids + completion.token_ids
            trajectory["env_state"] = json.dumps(state)
            if step.done:
                trajectory["termination"] = "DONE"
                return
            self.checkpoint(ctx, trajectory, trajectory["episode_id"])

    @staticmethod
    def turn_record(index: int, prompt_ids: list[int], new_sample: bool, completion: Completion,
              started_ms: int, step, env_ms: float) -> dict:
        assert completion.policy_version is not None  # the router always stamps one
        return {
            "index": index,
            "prompt_ids": pack_ids(prompt_ids),
            "completion_ids": pack_ids(completion.token_ids),
            "logprobs": pack_logprobs(completion.logprobs),
            "policy_version": completion.policy_version,
            "finish_reason": completion.finish_reason,
            "completion_text": completion.text,
            "tool_call": step.tool_call,
            "observation": step.observation,
            "server": completion.server,
            "started_at_ms": started_ms,
            "inference_ms": completion.latency_ms,
            "env_ms": env_ms,
            "new_sample": new_sample,
        }

    async def complete(self, prompt_ids: list[int], trajectory: dict, turn: int) -> Completion:
        sampling = dict(trajectory["task"]["sampling"])
        if sampling.get("seed") is not None:
            # Distinct but reproducible per sample and turn.
            sampling["seed"] = sampling["seed"] + 1000 * trajectory["sample_index"] + turn
        completion = await self._sample(prompt_ids, sampling, trajectory["episode_id"])
        # The assistant message is built from `text`, the sample from the ids: they must agree
        # (a proxy that leaves the stop token in `text` would add a second one, silently).
        sampled = completion.token_ids
        if completion.finish_reason == "stop" and sampled:
            sampled = sampled[:-1]  # the stop token, which `text` leaves out
        # An output ending inside a multi-byte character: the server never writes that tail.
        expected = served_text(self.template.decode, sampled)
        if completion.text != expected:
            raise TextMismatch(
                f"{completion.server}: the completion's text is not the detokenization of "
                f"its token ids (text {completion.text[-80:]!r}, ids decode to "
                f"{expected[-80:]!r}); check skip_special_tokens / "
                f"spaces_between_special_tokens on any proxy in between")
        return completion

    async def _sample(self, prompt_ids: list[int], sampling: dict,
                      episode_id: str) -> Completion:
        assert self.router is not None
        last: Exception | None = None
        delays = iter(RETRY_DELAYS_S)
        window_ends = time.monotonic() + UPDATE_WINDOW_S
        while True:
            try:
                return await self.router.complete(episode_id, prompt_ids, sampling,
                                                  self.template.stop_token_ids)
            except ServerUpdating as exc:
                # A weight update is not a failure: wait it out without spending the budget.
                last = exc
                if time.monotonic() >= window_ends:
                    break
                await asyncio.sleep(UPDATE_POLL_S)
            except ServerError as exc:
                last = exc
                delay = next(delays, None)
                if delay is None:
                    break
                metrics.inference_retry(exc.server)
                await asyncio.sleep(delay)
        raise InferenceUnavailable(f"inference failed {len(RETRY_DELAYS_S) + 1} times: {last}")
