"""RUN, the controller and LoRA against a real vLLM server (its CPU build) serving the tiny local
model, checked against transformers (+ peft) computing the same model independently.

Every test here shares one server (the `real_vllm` fixture) and changes what it serves (weights,
adapters): they live in this one file so that they run one after another (`--dist loadfile`),
and each test first applies the weights it expects.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
import torch

from producers.publish import load_tasks, publish, validate_task
from rollstream.config import Settings
from rollstream.contracts.codec import unpack_ids, unpack_logprobs
from rollstream.contracts.wire import lora_name
from rollstream.controller.apply import apply_policy, current_version
from rollstream.dev.loop import ClosedLoop, LoopConfig
from rollstream.envs import mini_swe_agent
from rollstream.inference.client import InferenceClient
from stages.run import conversation
from tests.helpers.hf import transformers
from tests.helpers.run_helpers import contexts, guess_episodes, play, run_settings
from tests.helpers.sandbox_helpers import needs_bwrap, sandbox_root
from tests.helpers.swe_helpers import HARNESS_BIN, SHIPPED, needs_mini
from tests.helpers.vllm_server import RealVllm

__all__ = ["sandbox_root"]

# The first test also starts the server (and makes the tiny model): in a loaded CI run that
# took more than pytest's default 300 s.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

STOP = "<|im_end|>"


def tokenizer_of(model_dir: Path):
    """transformers' own tokenizer of the model (the reference RUN's ids are checked against)."""
    return transformers().AutoTokenizer.from_pretrained(model_dir)


_versions = itertools.count(1)  # policy versions applied in this session, rising


def event(version: int, uri: Path, kind: str = "full") -> dict:
    return {"version": version, "kind": kind, "uri": str(uri), "step_id": f"s{version}",
            "metrics": {}, "created_at_ms": 0}


async def apply(server: RealVllm, uri: Path, kind: str = "full") -> int:
    version = next(_versions)
    [result] = await apply_policy(event(version, uri, kind), [server.url])
    assert result.ok, result.detail
    return version


@functools.cache
def hf_model(weights: Path, adapter: Path | None = None) -> torch.nn.Module:
    model = transformers().AutoModelForCausalLM.from_pretrained(weights)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def hf_greedy(model: torch.nn.Module, context: Sequence[int], max_tokens: int,
              stop_id: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([list(context)]), max_new_tokens=max_tokens,
                             do_sample=False, eos_token_id=stop_id, pad_token_id=stop_id)
    return out[0, len(context):].tolist()


def greedy_episodes(n: int, max_turns: int, max_tokens: int) -> list[dict]:
    episodes = guess_episodes(n, max_turns=max_turns, max_tokens=max_tokens)
    for e in episodes:
        e["task"]["sampling"].update(temperature=0.0, seed=None)
    return episodes


async def prompt_logprobs(server: RealVllm, ids: list[int]) -> list[float]:
    """vLLM's own logprob of each of `ids` after the ones before it (prefill scoring)."""
    body = {"model": server.name, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0}
    async with aiohttp.ClientSession() as session, session.post(
            server.url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        scored = (await response.json())["choices"][0]["prompt_logprobs"]
    return [entry[str(i)]["logprob"] for i, entry in zip(ids[1:], scored[1:], strict=True)]


def test_run_plays_multi_turn_episodes_token_exact_on_real_vllm(real_vllm: RealVllm) -> None:
    asyncio.run(apply(real_vllm, real_vllm.model.weights[0]))
    settings = run_settings([real_vllm.url], tokenizer_path=str(real_vllm.model.model),
                            request_timeout_s=120.0)
    episodes = guess_episodes(8, max_turns=3, max_tokens=12)
    trajectories, _ = asyncio.run(play(settings, episodes, concurrency=8))
    tokenizer = tokenizer_of(real_vllm.model.model)
    assert [t["termination"] for t in trajectories if t["termination"] == "INFRA_ERROR"] == []
    assert max(len(t["turns"]) for t in trajectories) > 1
    retokenized_differs = 0
    for trajectory in trajectories:
        turns = trajectory["turns"]
        for i, (turn, context) in enumerate(zip(turns, contexts(trajectory), strict=True)):
            completion = unpack_ids(turn["completion_ids"]).tolist()
            # The prompt is transformers' rendering of the conversation so far: the whole of
            # it where a sample starts, else the ids so far decode to that rendering.
            rendered = tokenizer.apply_chat_template(
                conversation(trajectory["task"], turns[:i]), add_generation_prompt=True,
                tokenize=False)
            if i == 0 or turn["new_sample"]:
                assert context == tokenizer.encode(rendered, add_special_tokens=False)
            else:
                assert tokenizer.decode(context) == rendered
            # The ids and logprobs are vLLM's: its own scoring of those ids in that context
            # gives the logprobs the turn carries (a re-tokenized turn has other ids).
            scored = asyncio.run(prompt_logprobs(real_vllm, context + completion))
            assert unpack_logprobs(turn["logprobs"]).tolist() == pytest.approx(
                scored[len(context) - 1:], abs=2e-3)
            retokenized_differs += tokenizer.encode(
                tokenizer.decode(completion), add_special_tokens=False) != completion
    assert retokenized_differs > 0  # re-tokenizing would have changed some turns' ids


def test_weight_update_mid_run_stamps_each_turn_with_the_weights_that_sampled_it(
        real_vllm: RealVllm) -> None:
    weights = real_vllm.model.weights
    settings = run_settings([real_vllm.url], tokenizer_path=str(real_vllm.model.model),
                            request_timeout_s=120.0)
    applied: dict[int, Path] = {}

    async def main() -> list[dict]:
        applied[await apply(real_vllm, weights[0])] = weights[0]

        async def update(stage: object, finished: int) -> None:
            if finished == 3:  # others are in flight
                applied[await apply(real_vllm, weights[1])] = weights[1]

        trajectories, _ = await play(settings, greedy_episodes(12, max_turns=3, max_tokens=8),
                                     concurrency=4, after_each=update)
        async with aiohttp.ClientSession() as session:
            assert await current_version(session, real_vllm.url) == max(applied)
        return trajectories

    trajectories = asyncio.run(main())
    assert [t["termination"] for t in trajectories if t["termination"] == "INFRA_ERROR"] == []
    stop = tokenizer_of(real_vllm.model.model).convert_tokens_to_ids(STOP)
    stamped = set()
    for trajectory in trajectories:
        for turn, context in zip(trajectory["turns"], contexts(trajectory), strict=True):
            version = turn["policy_version"]
            stamped.add(version)
            assert version in applied, version
            expected = hf_greedy(hf_model(applied[version]), context,
                                 trajectory["task"]["sampling"]["max_tokens"], stop)
            assert unpack_ids(turn["completion_ids"]).tolist() == expected, version
    assert stamped == set(applied)  # both weight sets sampled turns


def test_a_policy_version_as_a_lora_adapter_answers_every_turn(real_vllm: RealVllm) -> None:
    settings = run_settings([real_vllm.url], tokenizer_path=str(real_vllm.model.model),
                            request_timeout_s=120.0)
    base, adapter = real_vllm.model.weights[0], real_vllm.model.adapters[0]

    async def main() -> tuple[int, list[dict]]:
        await apply(real_vllm, base)
        version = await apply(real_vllm, adapter, kind="lora")
        try:
            trajectories, _ = await play(settings, greedy_episodes(4, 2, 8), concurrency=4)
        finally:  # later tests must not be routed to it
            async with aiohttp.ClientSession() as session, session.post(
                    real_vllm.url + "/v1/unload_lora_adapter",
                    json={"lora_name": lora_name(version)}) as response:
                assert response.status == 200
        return version, trajectories

    version, trajectories = asyncio.run(main())
    stop = tokenizer_of(real_vllm.model.model).convert_tokens_to_ids(STOP)
    for trajectory in trajectories:
        assert trajectory["termination"] != "INFRA_ERROR", trajectory["termination_detail"]
        for turn, context in zip(trajectory["turns"], contexts(trajectory), strict=True):
            assert turn["policy_version"] == version
            assert unpack_ids(turn["completion_ids"]).tolist() == hf_greedy(
                hf_model(base, adapter), context, 8, stop)


def test_two_jobs_adapters_on_one_server_each_answer_their_own_requests(
        real_vllm: RealVllm) -> None:
    model = real_vllm.model
    names = {"job-a": model.adapters[0], "job-b": model.adapters[1]}
    tokenizer = tokenizer_of(model.model)
    stop = tokenizer.convert_tokens_to_ids(STOP)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Task {i}: add."}],
                                             add_generation_prompt=True, tokenize=True,
                                             return_dict=False) for i in range(4)]

    async def main() -> list[tuple[str, list[int], list[int]]]:
        await apply(real_vllm, model.weights[0])
        async with aiohttp.ClientSession() as session:
            for name, path in names.items():
                async with session.post(real_vllm.url + "/v1/load_lora_adapter", json={
                        "lora_name": name, "lora_path": str(path),
                        "load_inplace": True}) as response:
                    assert response.status == 200, await response.text()
            try:
                async with InferenceClient(real_vllm.url, timeout_s=120.0) as client:
                    jobs = [(name, p) for p in prompts for name in names]  # interleaved
                    done = await asyncio.gather(*(client.complete(
                        p, {"temperature": 0.0, "max_tokens": 10}, [stop], model=name)
                        for name, p in jobs))
            finally:
                for name in names:
                    async with session.post(real_vllm.url + "/v1/unload_lora_adapter",
                                            json={"lora_name": name}) as response:
                        assert response.status == 200
        return [(name, p, c.token_ids) for (name, p), c in zip(jobs, done, strict=True)]

    answered = asyncio.run(main())
    for name, prompt, ids in answered:
        own = hf_greedy(hf_model(model.weights[0], names[name]), prompt, 10, stop)
        other = hf_greedy(hf_model(model.weights[0], names[{"job-a": "job-b",
                                                            "job-b": "job-a"}[name]]),
                          prompt, 10, stop)
        assert own != other  # an answer from the other job's adapter would show
        assert ids == own, name


def test_two_jobs_adapters_loaded_by_the_controller_each_sample_their_jobs_turns(
        real_vllm: RealVllm) -> None:
    """Two jobs share the server: the controller applies each job's PolicyVersion to that job's
    adapter, and RUN's router (one per job) sends each job's turns to its own adapter only."""
    model = real_vllm.model
    jobs = {"job-a": model.adapters[0], "job-b": model.adapters[1]}
    settings = {job: run_settings([real_vllm.url], tokenizer_path=str(model.model),
                                  request_timeout_s=120.0, adapter=job) for job in jobs}

    async def main() -> tuple[dict[str, int], dict[str, list[dict]]]:
        await apply(real_vllm, model.weights[0])
        versions = {job: next(_versions) for job in jobs}
        try:
            for job, path in jobs.items():
                [result] = await apply_policy(event(versions[job], path, "lora"),
                                              [real_vllm.url], adapter=job)
                assert result.ok, result.detail
            runs = await asyncio.gather(*(play(settings[job], greedy_episodes(4, 2, 8),
                                               concurrency=4) for job in jobs))
        finally:  # the adapters hold vLLM's LoRA slots
            async with aiohttp.ClientSession() as session:
                for job in jobs:
                    await session.post(real_vllm.url + "/v1/unload_lora_adapter",
                                       json={"lora_name": lora_name(versions[job], job)})
        return versions, {job: t for job, (t, _) in zip(jobs, runs, strict=True)}

    versions, played = asyncio.run(main())
    stop = tokenizer_of(model.model).convert_tokens_to_ids(STOP)
    for job, trajectories in played.items():
        other = next(j for j in jobs if j != job)
        differs = 0
        for trajectory in trajectories:
            assert trajectory["termination"] != "INFRA_ERROR", trajectory["termination_detail"]
            for turn, context in zip(trajectory["turns"], contexts(trajectory), strict=True):
                assert turn["adapter"] == lora_name(versions[job], job)
                assert turn["policy_version"] == versions[job]
                ids = unpack_ids(turn["completion_ids"]).tolist()
                assert ids == hf_greedy(hf_model(model.weights[0], jobs[job]), context, 8,
                                        stop), job
                differs += ids != hf_greedy(hf_model(model.weights[0], jobs[other]), context,
                                            8, stop)
        assert differs > 0, job  # the other job's adapter would have answered otherwise


def test_closed_loop_trains_the_tiny_model_and_every_version_is_served(
        real_vllm: RealVllm, settings: Settings, tmp_path: Path) -> None:
    # The loop serves the model the trainer starts from as version 0 (weights[0]).
    loop = ClosedLoop(settings, tmp_path, LoopConfig(
        tasks=60, group_size=4, groups_per_batch=2, admission_window=4, max_staleness=2,
        hf_model=real_vllm.model.model))
    try:
        loop.start(policy_url=real_vllm.url)
        publish(settings, loop.tasks())
        for progress in loop.follow(deadline=time.time() + 400):
            stamped = {s["trajectory"]["turns"][0]["policy_version"] for s in progress.scored
                       if s["trajectory"]["turns"]}
            if len(progress.versions) >= 3 and len(stamped - {0}) >= 2:
                break
    finally:
        loop.stop()
    published = [v["version"] for v in progress.versions]
    assert published[:3] == [1, 2, 3]
    assert all(Path(v["uri"], "model.safetensors").is_file() for v in progress.versions)
    turns = [t for s in progress.scored for t in s["trajectory"]["turns"]]
    assert {t["policy_version"] for t in turns} <= {0, *published}
    assert 0 in {t["policy_version"] for t in turns}
    assert [s for s in progress.scored if s["trajectory"]["termination"] == "INFRA_ERROR"] == []
    with urllib.request.urlopen(real_vllm.url + "/weight_info") as response:
        label = json.loads(response.read())["weight_version"]
    assert int(label) in published  # the controller's last update


@needs_bwrap
@needs_mini
def test_mini_swe_agent_plays_through_the_gateway_on_the_real_server(
        real_vllm: RealVllm, sandbox_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The unmodified harness calls RUN's gateway (chat completions), which samples on the real
    # server through the model's template: every call is a turn with vLLM's own ids.
    monkeypatch.setenv("PATH", f"{HARNESS_BIN}:{os.environ['PATH']}")
    version = asyncio.run(apply(real_vllm, real_vllm.model.weights[0]))
    [task] = load_tasks(SHIPPED, "swe-bench")[:1]
    task = validate_task({**mini_swe_agent.harness_task(task, mini_swe_agent.harness(
        wall_clock_s=300)), "max_turns": 3, "sampling": {**task["sampling"], "max_tokens": 24,
                                                         "seed": 0}})
    episode = {"episode_id": f"{task['task_id']}#0", "task": task, "sample_index": 0,
               "created_at_ms": 0}
    settings = run_settings([real_vllm.url], tokenizer_path=str(real_vllm.model.model),
                            request_timeout_s=120.0)
    [trajectory], _ = asyncio.run(play(settings, [episode]))
    assert trajectory["termination"] != "INFRA_ERROR", trajectory["termination_detail"]
    turns = trajectory["turns"]
    assert len(turns) >= 2  # the harness called again after the model's (random) answers
    for turn, context in zip(turns, contexts(trajectory), strict=True):
        assert turn["policy_version"] == version
        completion = unpack_ids(turn["completion_ids"]).tolist()
        scored = asyncio.run(prompt_logprobs(real_vllm, context + completion))
        assert unpack_logprobs(turn["logprobs"]).tolist() == pytest.approx(
            scored[len(context) - 1:], abs=2e-3)
