"""Helpers for RUN tests that play episodes directly through RunStage.handle (no broker):
guess_number episodes, and a driver that plays many at once like the runtime would."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from producers.publish import validate_task
from rollstream.config import Settings, load
from rollstream.contracts.codec import unpack_ids
from rollstream.inference.chat import ChatTemplate
from rollstream.runtime import EventContext
from stages.run import RunStage


def guess_episodes(n: int, max_turns: int = 3, max_tokens: int = 4) -> list[dict]:
    """n single-sample guess_number episodes; the secret is out of the digits' reach for some,
    so episodes run to max_turns as well as end early."""
    episodes = []
    for i in range(n):
        task = validate_task({
            "task_id": f"g{i}", "env": "guess_number", "prompt": f"Guess 0-9 ({i}).",
            "data": {"secret": i % 10, "low": 0, "high": 9}, "max_turns": max_turns,
            "group_size": 1, "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                          "max_tokens": max_tokens, "seed": i}})
        episodes.append({"episode_id": f"g{i}#0", "task": task, "sample_index": 0,
                         "created_at_ms": 0})
    return episodes


def contexts(trajectory: dict) -> list[list[int]]:
    """The ids each turn was sampled from: its sample's ids so far, then its prompt."""
    out: list[list[int]] = []
    sample: list[int] = []
    for turn in trajectory["turns"]:
        if turn["new_sample"]:
            sample = []
        sample += unpack_ids(turn["prompt_ids"]).tolist()
        out.append(list(sample))
        sample += unpack_ids(turn["completion_ids"]).tolist()
    return out


def run_settings(urls: Sequence[str], **overrides: object) -> Settings:
    """RUN's settings for in-process tests: resolved as a process's are (the environment's
    sandbox root and backend, which the sandbox fixtures set, included)."""
    values = {"health_interval_s": 0.2, "request_timeout_s": 5.0, **overrides}
    return load(policy_url=",".join(urls), **values)


async def play(
    settings: Settings,
    episodes: list[dict],
    concurrency: int = 64,
    template: ChatTemplate | None = None,
    after_each: Callable[[RunStage, int], Awaitable[None]] | None = None,
) -> tuple[list[dict], RunStage]:
    """Play every episode on one RunStage, `concurrency` at a time; trajectories in input
    order. An episode RUN sends back for another attempt (an infra failure) is played again at
    once, as RUN would take it from its input. `after_each(stage, finished_count)` runs after
    each episode finishes."""
    stage = RunStage(settings, template)
    await stage.start()
    limit = asyncio.Semaphore(concurrency)
    finished = 0

    async def one(episode: dict) -> dict:
        nonlocal finished
        async with limit:
            outputs = await stage.handle(episode, EventContext(0, 0, lambda out: None))
            while again := [o.value for o in outputs if o.topic == stage.topics.episodes]:
                outputs = await stage.handle(again[0], EventContext(0, 0, lambda out: None))
        finished += 1
        if after_each is not None:
            await after_each(stage, finished)
        [trajectory] = [o.value for o in outputs if o.topic == stage.topics.trajectories]
        return trajectory

    try:
        return list(await asyncio.gather(*(one(e) for e in episodes))), stage
    finally:
        await stage.close()
