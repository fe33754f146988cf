"""Per-job policies on shared inference servers: each job's LoRA adapter names, RUN's router
sending a job's turns to its own newest adapter only, and the controller loading and unloading
a job's adapters only."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client import REGISTRY

import schemas
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec
from rollstream.contracts.wire import check_adapter, lora_name, lora_version, split_lora
from rollstream.controller.apply import apply_policy, current_version
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.inference.routing import AdapterMissing, Router
from rollstream.telemetry.metrics import JOB_LABEL
from tests.helpers.controller_helpers import against, fake_vllm, policy_event
from tests.helpers.run_helpers import guess_episodes, play, run_settings
from tests.helpers.schema_helpers import encode_with, old_trajectory

JOBS = ("job-a", "job-b", "team.vision_2", "")  # "" : the default adapter


def test_a_jobs_adapter_names_never_parse_as_another_jobs() -> None:
    assert lora_name(3) == "rollstream-policy-v3"  # today's names for a job naming none
    assert lora_name(3, "job-a") == "job-a-v3"
    names = {(job, v): lora_name(v, job) for job in JOBS for v in (0, 1, 12)}
    for (job, version), name in names.items():
        for other in JOBS:
            assert lora_version(name, other) == (version if other == job else None), (name, other)
        assert split_lora(name) == (job or "rollstream-policy", version)
    # A base that would read as another base's versioned name is refused outright.
    for bad in ("job-v1", "", "-job", "job a", "job/a", "x" * 101, "jöb"):
        if bad:
            with pytest.raises(ValueError, match="not valid"):
                check_adapter(bad)
    assert lora_version("job-a-v1-v2", "job-a") is None
    assert lora_version("job-a-vx", "job-a") is None and lora_version("job-a", "job-a") is None


def test_the_adapter_setting_is_checked_at_start() -> None:
    assert Settings().override(adapter="job-a").inference.adapter == "job-a"
    with pytest.raises(SystemExit, match="not valid"):
        load(adapter="job-v2")


def sampled_models(server: SimulatedServer) -> set[str]:
    return {body["model"] for body in server.received}


def test_each_jobs_turns_go_to_its_own_newest_adapter_never_anothers() -> None:
    # Both servers hold both jobs' adapters (and the default one); a third holds job b's only.
    adapters = [lora_name(1, "job-a"), lora_name(2, "job-a"), lora_name(7, "job-b"),
                lora_name(9)]
    shared = [SimulatedServer(version=None, adapters=list(adapters)) for _ in range(2)]
    b_only = SimulatedServer(version=None, adapters=[lora_name(8, "job-b")])
    with Fleet([*shared, b_only]) as fleet:
        episodes = guess_episodes(24)
        runs = {job: asyncio.run(play(run_settings(fleet.urls, adapter=job), episodes))
                for job in ("job-a", "job-b", "")}
    stamps = {job: {(t["server"], t["adapter"], t["policy_version"])
                    for tr in trajectories for t in tr["turns"]}
              for job, (trajectories, _) in runs.items()}
    shared_urls = {s.url for s in shared}
    assert {(a, v) for _, a, v in stamps["job-a"]} == {("job-a-v2", 2)}
    assert {u for u, _, _ in stamps["job-a"]} == shared_urls  # b_only is of no use to job a
    assert {(u == b_only.url, a, v) for u, a, v in stamps["job-b"]} <= {
        (False, "job-b-v7", 7), (True, "job-b-v8", 8)}
    # The default job: its own adapter where listed, else the base model, never job b's.
    assert {(u in shared_urls, a, v) for u, a, v in stamps[""]} <= {
        (True, "rollstream-policy-v9", 9), (False, None, -1)}
    assert sampled_models(b_only) <= {"job-b-v8", "sim-model"}
    for trajectories, _ in runs.values():
        assert {t["termination"] for t in trajectories} <= {"DONE", "MAX_TURNS"}


def lacking(job: str) -> dict[tuple[str, str], float]:
    """The router's adapter_lacking series of `job` in this process's registry."""
    return {(s.labels["server"], s.labels["adapter"]): s.value
            for family in REGISTRY.collect() for s in family.samples
            if s.name == "rollstream_router_adapter_lacking" and s.labels[JOB_LABEL] == job}


def test_a_new_jobs_adapter_the_base_model_until_its_first_version_then_only_servers_with_it(
        caplog: pytest.LogCaptureFixture) -> None:
    holder = SimulatedServer(version=None, adapters=[lora_name(4, "job-b")])
    other = SimulatedServer(version=None, adapters=[])

    async def main(fleet: Fleet) -> None:
        router = Router(fleet.urls, max_episodes=4, health_interval_s=60, adapter="job-a",
                        job="team-a")
        await router.start()
        # What `rollstream status --job team-a` shows: no server lists a version yet.
        assert lacking("team-a") == {(holder.url, "job-a-v<N>"): 0, (other.url, "job-a-v<N>"): 0}
        try:
            # No job-a version anywhere (a job created with --adapter, before any training):
            # every server serves it, from the base model, as version 0 with no adapter.
            assert router.capacity() == 8
            for e in ("e1", "e2", "e3"):
                completion = await router.complete(e, [1, 2], {"max_tokens": 4}, [260])
                assert (completion.adapter, completion.policy_version) == (None, 0)
                router.release(e)  # the episode ended
            await router.check()  # said once per server and adapter, not at every check
            holder.adapters.append(lora_name(1, "job-a"))
            await router.check()
            await router.check()
            [a, b] = router.servers.values()
            assert a.usable and not b.usable and b.lacks_adapter
            assert lacking("team-a") == {(other.url, "job-a-v1"): 1}
            assert router.capacity() == 4
            completion = await router.complete("e4", [1, 2], {"max_tokens": 4}, [260])
            assert (completion.adapter, completion.policy_version) == ("job-a-v1", 1)
            # Its adapter gone from every server: waited out like a weight update (the
            # controller loads it again), never the base model again, never an infra loop.
            holder.adapters.remove(lora_name(1, "job-a"))
            await router.check()
            assert router.capacity() == 0 and router.pin("e5") is None
            with pytest.raises(AdapterMissing, match="job-a-v<N>"):
                await router.complete("e5", [1, 2], {"max_tokens": 4}, [260])
        finally:
            await router.close()
        assert lacking("team-a") == {}

    with caplog.at_level("INFO", "rollstream.inference.routing"), Fleet([holder, other]) as fleet:
        asyncio.run(main(fleet))
    said = [r.getMessage() for r in caplog.records if "job-a" in r.getMessage()]
    assert sorted(m for m in said if "lists no job-a-v<N> adapter yet" in m) == sorted(
        f"server {s.url} lists no job-a-v<N> adapter yet: the job samples its base model "
        "(policy version 0) until the controller loads the job's first version"
        for s in (holder, other))
    assert [m for m in said if "lacks" in m] == [
        f"server {other.url} lacks job-a-v1 (the job's newest adapter): not usable for this "
        "job until the controller loads it",
        f"server {holder.url} lacks job-a-v1 (the job's newest adapter): not usable for this "
        "job until the controller loads it"]
    assert sampled_models(holder) | sampled_models(other) == {"sim-model", "job-a-v1"}


def test_a_job_created_with_an_adapter_plays_its_episodes_before_any_training() -> None:
    with Fleet([SimulatedServer(version=None, adapters=[lora_name(3, "job-b")])]) as fleet:
        trajectories, _ = asyncio.run(play(run_settings(fleet.urls, adapter="job-new"),
                                           guess_episodes(12)))
    assert len(trajectories) == 12
    assert {t["termination"] for t in trajectories} <= {"DONE", "MAX_TURNS"}
    assert {(t["adapter"], t["policy_version"]) for tr in trajectories
            for t in tr["turns"]} == {(None, 0)}


def test_controller_loads_and_unloads_one_jobs_adapters_only() -> None:
    calls: list[str] = []
    others = [lora_name(1, "job-b"), lora_name(1), lora_name(1, "job-a-x")]
    adapters = [lora_name(1, "job-a"), lora_name(2, "job-a"), *others]
    app = fake_vllm(calls, adapters)

    async def main(url: str) -> tuple[list, list, list, int | None, int | None]:
        lora = await apply_policy(policy_event(3, "/a/3", kind="lora"), [url], adapter="job-a")
        again = await apply_policy(policy_event(3, "/a/3b", kind="lora"), [url], adapter="job-a")
        full = await apply_policy(policy_event(4, "/ckpt/4"), [url], adapter="job-a")
        async with aiohttp.ClientSession() as session:
            return (lora, again, full, await current_version(session, url, "job-a"),
                    await current_version(session, url, "job-c"))

    lora, again, full, version, missing = against(app, main)
    assert lora[0].ok and again[0].ok and version == 3 and missing is None
    assert set(adapters) == {lora_name(2, "job-a"), lora_name(3, "job-a"), *others}
    bodies = [json.loads(c.split(" ", 2)[2]) for c in calls]
    assert bodies[0] == {"lora_name": "job-a-v3", "lora_path": "/a/3"}
    assert bodies[1] == {"lora_name": "job-a-v1"}  # the only one unloaded
    # The same version again replaces its weights in place.
    assert bodies[2] == {"lora_name": "job-a-v3", "lora_path": "/a/3b", "load_inplace": True}
    # Full weights would replace the base model every job on the server samples from.
    assert not full[0].ok and "shares" in full[0].detail and len(calls) == 3


def test_turns_written_before_the_adapter_field_read_as_sampled_by_no_adapter() -> None:
    old = schemas.read_history("history/trajectory.v1.avsc")
    trajectory = old_trajectory()
    trajectory["turns"][0]["new_sample"] = False
    decoded = codec().decode_as("Trajectory", encode_with(old, old, trajectory))
    assert decoded["turns"][0]["adapter"] is None
    stamped = {**trajectory, "turns": [{**trajectory["turns"][0], "adapter": "job-a-v2"}]}
    again = codec().decode_as("Trajectory", codec().encode("Trajectory", stamped))
    assert again["turns"][0]["adapter"] == "job-a-v2"
