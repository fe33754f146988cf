"""RUN: play an episode, turn by turn, against an inference server, checkpointing every turn.

The conversation lives as token ids: each turn appends the tokens of the new user message (the
chat-template delta) and the ids the server sampled, verbatim, so the trainer sees exactly what
was sampled. After every turn the unfinished trajectory is written to <p>.episode-state (keyed by
episode id, co-partitioned with <p>.episodes); a RUN process that takes over a partition reads
those checkpoints back and resumes episodes where they stopped instead of replaying them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from rollstream import kafka
from rollstream.codec import codec, pack_ids, pack_logprobs, unpack_ids
from rollstream.envs.registry import UnknownEnv, get_env
from rollstream.inference import Completion, ContextOverflow, InferenceClient, ServerError
from rollstream.policy.chat import EmbeddedChatTemplate
from rollstream.runtime import EventContext, InvalidEvent, Output, Stage

log = logging.getLogger("rollstream.run")

RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)  # the retry budget for a failing inference call


def now_ms() -> int:
    return int(time.time() * 1000)


class InferenceUnavailable(RuntimeError):
    """Inference kept failing past the retry budget: the episode ends as an infra failure."""


class RunStage(Stage):
    name = "run"
    input_record = "Episode"

    def __init__(self, settings, template: EmbeddedChatTemplate | None = None) -> None:
        super().__init__(settings)
        self.template = template or EmbeddedChatTemplate()
        self.client: InferenceClient | None = None
        # Checkpoints of unfinished episodes, by input partition, then episode id.
        self.checkpoints: dict[int, dict[str, dict]] = {}
        self.resumed = 0

    def input_topic(self) -> str:
        return self.topics.episodes

    async def start(self) -> None:
        url = self.settings.policy_url.split(",")[0].strip()
        self.client = InferenceClient(url, timeout_s=self.settings.request_timeout_s)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

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
                self.checkpoints[msg.partition()][episode] = c.decode_as("Trajectory", msg.value())

    def on_revoke(self, partitions: list[int]) -> None:
        for p in partitions:
            self.checkpoints.pop(p, None)

    def _checkpoint(self, ctx: EventContext, trajectory: dict | None, episode_id: str) -> None:
        ctx.emit(Output(self.topics.episode_state, episode_id,
                        None if trajectory is None else "Trajectory", trajectory,
                        partition=ctx.partition))

    # -- the episode -------------------------------------------------------------------------

    async def handle(self, episode: dict, ctx: EventContext) -> list[Output]:
        task = episode["task"]
        try:
            env = get_env(task["env"])
        except UnknownEnv as exc:
            raise InvalidEvent(str(exc)) from exc
        trajectory = self.checkpoints.get(ctx.partition, {}).pop(episode["episode_id"], None)
        if trajectory is None:
            trajectory = {
                "episode_id": episode["episode_id"],
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
            self.resumed += 1
            log.info("resuming %s at turn %d", episode["episode_id"], len(trajectory["turns"]))
        try:
            await self._play(env, trajectory, ctx)
        finally:
            # Also on cancellation (partition revoked): the next owner re-creates what it needs.
            await env.close(task, json.loads(trajectory["env_state"]))
        trajectory["finished_at_ms"] = now_ms()
        self._checkpoint(ctx, None, episode["episode_id"])  # done: drop the checkpoint
        return [Output(self.topics.trajectories, episode["episode_id"], "Trajectory", trajectory)]

    async def _play(self, env, trajectory: dict, ctx: EventContext) -> None:
        task = trajectory["task"]
        turns = trajectory["turns"]
        context: list[int] = []
        for t in turns:
            context.extend(unpack_ids(t["prompt_ids"]).tolist())
            context.extend(unpack_ids(t["completion_ids"]).tolist())
        state = json.loads(trajectory["env_state"])
        while True:
            if len(turns) >= task["max_turns"]:
                trajectory["termination"] = "MAX_TURNS"
                return
            prompt_ids = self._next_prompt(task, turns)
            started = now_ms()
            try:
                completion = await self._complete(context + prompt_ids, task, trajectory,
                                                  len(turns))
            except ContextOverflow as exc:
                trajectory["termination"] = "TRUNCATED"
                trajectory["termination_detail"] = str(exc)
                return
            except InferenceUnavailable as exc:
                trajectory["termination"] = "INFRA_ERROR"
                trajectory["termination_detail"] = str(exc)
                return
            env_started = time.perf_counter()
            step = await env.step(task, state, completion.text)
            state = step.state
            turns.append(self._turn(len(turns), prompt_ids, completion, started, step,
                                    (time.perf_counter() - env_started) * 1000))
            context.extend(prompt_ids)
            context.extend(completion.token_ids)
            trajectory["env_state"] = json.dumps(state)
            if step.done:
                trajectory["termination"] = "DONE"
                return
            self._checkpoint(ctx, trajectory, trajectory["episode_id"])

    def _next_prompt(self, task: dict, turns: list[dict]) -> list[int]:
        if not turns:
            return self.template.first_prompt(task["prompt"])
        delta = self.template.observation_delta(turns[-1]["observation"] or "")
        if turns[-1]["finish_reason"] == "length":
            # Cut off before its stop token: close the turn so the template stays well-formed
            # (the closing token is part of the prompt, never trained on as sampled).
            return [self.template.stop_token_ids[0], *delta]
        return delta

    @staticmethod
    def _turn(index: int, prompt_ids: list[int], completion: Completion, started_ms: int,
              step, env_ms: float) -> dict:
        return {
            "index": index,
            "prompt_ids": pack_ids(prompt_ids),
            "completion_ids": pack_ids(completion.token_ids),
            "logprobs": pack_logprobs(completion.logprobs),
            "policy_version": completion.policy_version or 0,
            "finish_reason": completion.finish_reason,
            "completion_text": completion.text,
            "tool_call": step.tool_call,
            "observation": step.observation,
            "server": completion.server,
            "started_at_ms": started_ms,
            "inference_ms": completion.latency_ms,
            "env_ms": env_ms,
        }

    async def _complete(self, prompt_ids: list[int], task: dict, trajectory: dict,
                        turn: int) -> Completion:
        sampling = dict(task["sampling"])
        if sampling.get("seed") is not None:
            # Distinct but reproducible per sample and turn.
            sampling["seed"] = sampling["seed"] + 1000 * trajectory["sample_index"] + turn
        assert self.client is not None
        last: Exception | None = None
        for delay in (*RETRY_DELAYS_S, None):
            try:
                return await self.client.complete(prompt_ids, sampling,
                                                  self.template.stop_token_ids)
            except ServerError as exc:
                last = exc
                if delay is None:
                    break
                await asyncio.sleep(delay)
        raise InferenceUnavailable(f"inference failed {len(RETRY_DELAYS_S) + 1} times: {last}")
