"""The embedded policy server holds several adapters (each a whole weight set of the tiny model)
behind vLLM's runtime LoRA contract, so jobs sharing it each sample their own weights: over real
HTTP, through the controller and RUN's router, checked against the model computed directly."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings
from rollstream.contracts.codec import codec, unpack_ids
from rollstream.contracts.inference import EmbeddedChatTemplate
from rollstream.contracts.wire import POLICY_VERSION_HEADER
from rollstream.controller.apply import Controller, apply_policy, current_version
from rollstream.dev.background import BackgroundServer
from rollstream.inference.client import BadRequest, Completion, InferenceClient
from rollstream.policy_server.model import TinyLM, build_model, generate, save
from tests.helpers.controller_helpers import policy_event
from tests.helpers.pipeline_helpers import wait
from tests.helpers.run_helpers import contexts, guess_episodes, play, run_settings

STOPS = EmbeddedChatTemplate().stop_token_ids
PROMPT = EmbeddedChatTemplate().first_prompt("Guess a digit.")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[TinyLM, Path]]:
    folder = tmp_path_factory.mktemp("weights")
    out = {}
    for name, seed in (("a", 11), ("b", 12)):
        model = build_model(seed=seed)
        save(model, folder / f"{name}.safetensors", version=40 + seed)
        out[name] = (model, folder / f"{name}.safetensors")
    return out


def seeded(model: TinyLM, prompt: list[int], seed: int, max_tokens: int = 6) -> list[int]:
    [(ids, _, _)] = generate(model, [prompt], max_tokens=max_tokens, seeds=[seed],
                             stop_token_ids=STOPS)
    return ids


async def post(session: aiohttp.ClientSession, url: str, path: str,
               body: dict) -> tuple[int, str]:
    async with session.post(url + path, json=body) as response:
        return response.status, await response.text()


def test_two_adapters_on_one_server_each_sample_with_their_own_weights(weights: dict) -> None:
    (model_a, path_a), (model_b, path_b) = weights["a"], weights["b"]

    async def main(url: str) -> None:
        async with aiohttp.ClientSession() as session, InferenceClient(url) as client:
            for name, path in (("job-a-v3", path_a), ("job-b-v5", path_b)):
                assert (await post(session, url, "/v1/load_lora_adapter",
                                   {"lora_name": name, "lora_path": str(path)}))[0] == 200
            cards = {m["id"]: m for m in await client.models()}
            assert cards["job-a-v3"]["root"] == str(path_a)
            assert cards["job-b-v5"]["parent"] == "rollstream-tiny"
            # Interleaved, concurrent: each request is decoded by its adapter's batch alone.
            asks = [(name, seed) for seed in range(12) for name in ("job-a-v3", "job-b-v5")]
            done = await asyncio.gather(*(client.complete(
                PROMPT, {"max_tokens": 6, "seed": seed}, STOPS, model=name)
                for name, seed in asks))
            differs = 0
            for (name, seed), completion in zip(asks, done, strict=True):
                own, other = (model_a, model_b) if name == "job-a-v3" else (model_b, model_a)
                assert completion.token_ids == seeded(own, PROMPT, seed), name
                assert completion.policy_version == (3 if name == "job-a-v3" else 5)
                differs += seeded(other, PROMPT, seed) != completion.token_ids
            assert differs >= len(asks) // 2  # the other adapter's answer would show
            # The base model is still the server's own weights (seed 0, version 0).
            base = await client.complete(PROMPT, {"max_tokens": 6, "seed": 1}, STOPS)
            assert base.token_ids == seeded(build_model(0), PROMPT, 1)

            status, text = await post(session, url, "/v1/load_lora_adapter",
                                      {"lora_name": "job-a-v3", "lora_path": str(path_b)})
            assert status == 400 and "load_inplace" in text
            async with session.post(url + "/v1/load_lora_adapter", json={
                    "lora_name": "job-a-v3", "lora_path": str(path_b),
                    "load_inplace": True}) as response:
                assert response.status == 200 and response.headers[POLICY_VERSION_HEADER] == "3"
            again = await client.complete(PROMPT, {"max_tokens": 6, "seed": 2}, STOPS,
                                          model="job-a-v3")
            assert again.token_ids == seeded(model_b, PROMPT, 2)

            assert (await post(session, url, "/v1/unload_lora_adapter",
                               {"lora_name": "job-b-v5"}))[0] == 200
            with pytest.raises(BadRequest) as gone:
                await client.complete(PROMPT, {"max_tokens": 6}, STOPS, model="job-b-v5")
            assert gone.value.status == 404
            assert "job-b-v5" not in {m["id"] for m in await client.models()}
            assert (await post(session, url, "/v1/unload_lora_adapter",
                               {"lora_name": "job-b-v5"}))[0] == 404
            status, text = await post(session, url, "/v1/load_lora_adapter",
                                      {"lora_name": "job-c-v1", "lora_path": "/nowhere"})
            assert status == 400 and "cannot load adapter job-c-v1" in text
            status, _ = await post(session, url, "/v1/load_lora_adapter", {"lora_name": "x"})
            assert status == 400

    with BackgroundServer() as url:
        asyncio.run(main(url))


def test_two_jobs_through_the_controller_and_run_each_sample_their_own_policy(
        weights: dict) -> None:
    (model_a, path_a), (model_b, path_b) = weights["a"], weights["b"]
    models = {"job-a": model_a, "job-b": model_b}

    async def main(url: str) -> dict[str, list[dict]]:
        for job, version, path in (("job-a", 3, path_a), ("job-b", 7, path_b)):
            [applied] = await apply_policy(policy_event(version, str(path)), [url], adapter=job)
            assert applied.ok, applied.detail
        async with aiohttp.ClientSession() as session:
            assert await current_version(session, url, "job-a") == 3
            assert await current_version(session, url, "job-b") == 7
            assert await current_version(session, url) == 0  # the base: untouched
        episodes = guess_episodes(16, max_tokens=6)
        runs = await asyncio.gather(*(play(run_settings([url], adapter=job), episodes,
                                           concurrency=8) for job in models))
        return {job: trajectories for job, (trajectories, _) in zip(models, runs, strict=True)}

    with BackgroundServer() as url:
        played = asyncio.run(main(url))
    for job, trajectories in played.items():
        version = 3 if job == "job-a" else 7
        other = models["job-b" if job == "job-a" else "job-a"]
        differs = 0
        for trajectory in trajectories:
            assert trajectory["termination"] in ("DONE", "MAX_TURNS")
            seed = trajectory["task"]["sampling"]["seed"]
            for i, (turn, context) in enumerate(zip(trajectory["turns"], contexts(trajectory),
                                                    strict=True)):
                assert (turn["adapter"], turn["policy_version"]) == (f"{job}-v{version}", version)
                ids = unpack_ids(turn["completion_ids"]).tolist()
                assert ids == seeded(models[job], context, seed + i), (job, i)
                differs += ids != seeded(other, context, seed + i)
        assert differs > 0


def test_reloading_one_adapter_never_mixes_its_weights_within_a_request(weights: dict) -> None:
    (model_a, path_a), (model_b, path_b) = weights["a"], weights["b"]

    async def main(url: str) -> tuple[list, list]:
        async with aiohttp.ClientSession() as session, InferenceClient(url) as client:
            for name, path in (("job-a-v1", path_a), ("job-b-v1", path_b)):
                await post(session, url, "/v1/load_lora_adapter",
                           {"lora_name": name, "lora_path": str(path)})

            async def ask(name: str, seed: int) -> Completion:
                return await client.complete(PROMPT, {"max_tokens": 48, "seed": seed}, [],
                                       model=name)

            before = [asyncio.ensure_future(ask("job-a-v1", s)) for s in range(6)]
            others = [asyncio.ensure_future(ask("job-b-v1", s)) for s in range(6)]
            await asyncio.sleep(0.05)  # running when the reload asks to swap
            reload = asyncio.ensure_future(post(session, url, "/v1/load_lora_adapter", {
                "lora_name": "job-a-v1", "lora_path": str(path_b), "load_inplace": True}))
            await asyncio.sleep(0)
            after = [asyncio.ensure_future(ask("job-a-v1", s)) for s in range(6, 12)]
            assert (await reload)[0] == 200
            after.append(asyncio.ensure_future(ask("job-a-v1", 12)))  # surely the new weights
            return ([(s, c.token_ids) for s, c in enumerate(await asyncio.gather(*before,
                                                                                   *after))],
                    [c.token_ids for c in await asyncio.gather(*others)])

    with BackgroundServer() as url:
        a_side, b_side = asyncio.run(main(url))

    def whole(model: TinyLM, seed: int) -> list[int]:
        [(ids, _, _)] = generate(model, [PROMPT], max_tokens=48, seeds=[seed])
        return ids

    # Each request is all old weights or all new, never a mix (which of the two depends on
    # when it arrived); job b's requests go on throughout.
    mixed = [s for s, ids in a_side if ids not in (whole(model_a, s), whole(model_b, s))]
    assert mixed == []
    assert sum(whole(model_a, s) != whole(model_b, s) for s, _ in a_side) >= 10
    assert a_side[-1][1] == whole(model_b, 12)
    assert b_side == [whole(model_b, s) for s in range(6)]


@pytest.mark.slow
def test_each_jobs_controller_service_keeps_its_own_adapter_current(
        settings: Settings, bootstrap: str, weights: dict) -> None:
    """Two jobs (own prefixes, own policy topics) whose `rollstream controller --adapter` share
    one server: each loads its job's versions only, and puts back its adapter when it is gone."""
    (_, path_a), (_, path_b) = weights["a"], weights["b"]
    other = f"{settings.prefix}-b"
    create_topics(bootstrap, other, partitions=4)

    def publish(job: Settings, version: int, path: Path) -> None:
        producer = kafka.producer(job)
        kafka.produce(producer, job.topics.policy, codec().encode("PolicyVersion", {
            **policy_event(version, str(path)), "created_at_ms": int(time.time() * 1000)}),
            key="policy")
        producer.flush()

    def listed(url: str) -> set[str]:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
            return {m["id"] for m in json.load(response)["data"]}

    with BackgroundServer() as url:
        jobs = [settings.override(prefix=prefix, adapter=adapter, policy_url=url,
                                  health_interval_s=0.5)
                for prefix, adapter in ((settings.prefix, "job-a"), (other, "job-b"))]
        controllers = [Controller(job) for job in jobs]
        threads = [threading.Thread(target=asyncio.run, args=(c.serve(),)) for c in controllers]
        for thread in threads:
            thread.start()
        try:
            publish(jobs[0], 2, path_a)
            publish(jobs[1], 5, path_b)
            wait(lambda: {"job-a-v2", "job-b-v5"} <= listed(url), 60, "both jobs' adapters")
            publish(jobs[0], 3, path_b)
            wait(lambda: "job-a-v3" in listed(url), 60, "job a's next version")
            # Job b's adapter goes (a restarted server would lose it): its controller alone
            # loads it again.
            urllib.request.urlopen(urllib.request.Request(
                url + "/v1/unload_lora_adapter", data=json.dumps(
                    {"lora_name": "job-b-v5"}).encode(),
                headers={"Content-Type": "application/json"}), timeout=10).close()
            wait(lambda: "job-b-v5" in listed(url), 60, "job b's adapter loaded again")
            assert listed(url) == {"rollstream-tiny", "job-a-v2", "job-a-v3", "job-b-v5"}
        finally:
            for controller in controllers:
                controller.stop()
            for thread in threads:
                thread.join(30)
            delete_topics(bootstrap, other)
