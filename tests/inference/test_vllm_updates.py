"""Weight updates against servers that behave like vLLM 0.12, 0.32 and 0.33
(tests/helpers/vllm_standins.py, from each release's source), and RUN riding out the update
window without an infra failure."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from rollstream.controller.apply import apply_policy, current_version, parse_version
from rollstream.dev.background import BackgroundServer
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.inference.client import request_body
from rollstream.inference.routing import UNKNOWN_VERSION, labelled_version
from rollstream.policy_server.model import build_model, save
from tests.helpers.run_helpers import guess_episodes, play, run_settings
from tests.helpers.vllm_standins import VllmStandIn

FIXTURES = Path(__file__).parents[1] / "fixtures"


def event(version: int, uri: str) -> dict:
    return {"version": version, "kind": "full", "uri": uri, "step_id": f"s{version}",
            "metrics": {}, "created_at_ms": 0}


@contextlib.contextmanager
def standins(*servers: VllmStandIn) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(BackgroundServer(app=s.app())) for s in servers]


def checkpoint(path: Path, version: int) -> Path:
    save(build_model(seed=version), path, version=version)
    return path


def versions(urls: list[str]) -> list[int | None]:
    async def main() -> list[int | None]:
        async with aiohttp.ClientSession() as session:
            return [await current_version(session, u) for u in urls]

    return asyncio.run(main())


def fields(release: str, record: str = "request") -> set[str]:
    text = (FIXTURES / f"vllm_{release}_completion_{record}_fields.txt").read_text()
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def test_request_fields_exist_in_vllm_0_33_and_only_weight_labels_are_new_since_0_12() -> None:
    body = request_body([1, 2, 3], {"seed": 1}, [0], "m")
    assert set(body) <= fields("0.33")
    assert set(body) - fields("0.12") == {"return_weight_versions"}  # 0.12 ignores it


def test_standin_responses_have_only_their_releases_choice_fields(tmp_path: Path) -> None:
    path = checkpoint(tmp_path / "p.safetensors", 0)
    old, new = VllmStandIn("0.12.0", path), VllmStandIn("0.33.0", path)
    with standins(old, new) as urls:

        async def choice(url: str) -> dict:
            body = request_body([1, 2, 3], {"max_tokens": 4, "seed": 1}, [0], "Qwen/Qwen3-4B")
            async with aiohttp.ClientSession() as session, session.post(
                    url + "/v1/completions", json=body) as response:
                return (await response.json())["choices"][0]

        choices = [asyncio.run(choice(u)) for u in urls]
    assert set(choices[0]) <= fields("0.12", "choice")
    assert set(choices[1]) <= fields("0.33", "choice") and "weight_versions" in choices[1]
    assert choices[1]["weight_versions"] == [
        {"version": "default", "start": 0, "end": len(choices[1]["token_ids"])}]


def test_versions_parse_and_labels_give_the_oldest_span() -> None:
    assert parse_version("0.12.0") == (0, 12, 0)
    assert parse_version("0.33.1rc2.dev5+gabc") == (0, 33, 1)
    assert labelled_version([{"version": "3", "start": 0, "end": 9}]) == 3
    assert labelled_version([{"version": "3", "start": 0, "end": 4},
                             {"version": "4", "start": 4, "end": 9}]) == 3
    assert labelled_version([{"version": "default", "start": 0, "end": 2}]) == UNKNOWN_VERSION


def test_reload_mid_run_reaches_0_12_and_0_33_with_no_infra_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.12 reloads only from its launch path, so the checkpoint is written in place there;
    # 0.33 is told the same path. A small retry budget: a window counted as failures would show.
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.05))
    path = checkpoint(tmp_path / "policy.safetensors", 0)
    old, new = (VllmStandIn("0.12.0", path, reload_delay_s=1.0),
                VllmStandIn("0.33.0", path, reload_delay_s=1.0))
    applied: list = []

    with standins(old, new) as urls:

        async def update(stage: object, finished: int) -> None:
            if finished == 6:
                checkpoint(path, 1)
                applied.extend(await apply_policy(event(1, str(path)), urls))

        trajectories, _ = asyncio.run(play(run_settings(urls), guess_episodes(24, max_turns=4),
                                           concurrency=8, after_each=update))
        after = versions(urls)
    assert [r.ok for r in applied] == [True, True], applied
    assert after == [1, 1]
    assert [t["termination"] for t in trajectories if t["termination"] == "INFRA_ERROR"] == []
    turns = [turn for t in trajectories for turn in t["turns"]]
    by_server = {u: {t["policy_version"] for t in turns if t["server"] == u} for u in urls}
    assert by_server[urls[0]] <= {0, 1} and by_server[urls[1]] <= {UNKNOWN_VERSION, 1}
    assert 1 in by_server[urls[0]] and 1 in by_server[urls[1]]
    # 0.12: drain, stamp cleared for the window, reload with no arguments, stamp N, resume.
    assert old.calls == [
        "pause {'wait_for_inflight_requests': 'true', 'clear_cache': 'true'}", "stamp None",
        'collective_rpc {"method": "reload_weights"}', "reset_prefix_cache", "stamp 1",
        "resume"]
    # 0.33: keep mode (requests queue, none rejected), reload from the path, native label.
    assert new.calls == [
        "pause {'mode': 'keep'}",
        f'collective_rpc {json.dumps({"kwargs": {"weights_path": str(path)}, "method": "reload_weights"}, sort_keys=True)}',  # noqa: E501
        "reset_prefix_cache", "weight_version 1", "resume"]
    assert new.rejected == 0


def test_0_32_turns_are_stamped_from_the_weight_label_read_around_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM 0.32: labels but none on responses. Turns get the label read before and after
    # them; a turn that straddles the update is sampled again, never stamped with a guess.
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.05))
    path = checkpoint(tmp_path / "policy.safetensors", 0)
    server = VllmStandIn("0.32.0", path, reload_delay_s=1.0)
    applied: list = []
    with standins(server) as [url]:

        async def update(stage: object, finished: int) -> None:
            if finished == 1:
                applied.extend(await apply_policy(event(0, str(path)), [url]))
            if finished == 6:
                applied.extend(await apply_policy(event(1, str(checkpoint(
                    tmp_path / "v1.safetensors", 1))), [url]))

        trajectories, _ = asyncio.run(play(run_settings([url]), guess_episodes(24, max_turns=4),
                                           concurrency=8, after_each=update))
        [after] = versions([url])
    assert [r.ok for r in applied] == [True, True] and after == 1
    assert [t["termination"] for t in trajectories if t["termination"] == "INFRA_ERROR"] == []
    stamped = [turn["policy_version"] for t in trajectories for turn in t["turns"]]
    assert set(stamped) <= {UNKNOWN_VERSION, 0, 1} and 1 in stamped
    assert server.calls[-5:] == [
        "pause {'mode': 'keep'}",
        f'collective_rpc {json.dumps({"kwargs": {"weights_path": str(tmp_path / "v1.safetensors")}, "method": "reload_weights"}, sort_keys=True)}',  # noqa: E501
        "reset_prefix_cache", "weight_version 1", "resume"]


def test_0_12_refuses_a_checkpoint_outside_its_launch_path_before_pausing(
        tmp_path: Path) -> None:
    server = VllmStandIn("0.12.0", checkpoint(tmp_path / "a.safetensors", 0))
    other = checkpoint(tmp_path / "b.safetensors", 1)
    with standins(server) as [url]:
        [result] = asyncio.run(apply_policy(event(1, str(other)), [url]))
        assert versions([url]) == [0]
    assert not result.ok and "only from the path it was started with" in result.detail
    assert server.calls == []


def test_failed_reloads_resume_and_keep_the_version_of_the_weights_in_use(
        tmp_path: Path) -> None:
    path = checkpoint(tmp_path / "policy.safetensors", 0)
    old, new = VllmStandIn("0.12.0", path), VllmStandIn("0.33.0", path)
    with standins(old, new) as urls:
        path.write_bytes(b"torn")  # the in-place checkpoint cannot be read
        results = asyncio.run(apply_policy(event(1, str(path)), urls))
        after = versions(urls)
        # Both serve again, with the version they report.
        sampled = asyncio.run(play(run_settings(urls), guess_episodes(2, max_turns=1)))[0]
    assert [r.ok for r in results] == [False, False]
    assert all("HTTP 500" in r.detail for r in results)
    assert after == [0, None]  # 0.12's stamp put back; 0.33 keeps its label ("default")
    assert old.calls[-2:] == ["stamp 0", "resume"] and new.calls[-1] == "resume"
    assert not any(c.startswith("weight_version") for c in new.calls)
    assert all(t["termination"] != "INFRA_ERROR" for t in sampled)


def test_run_waits_out_a_paused_0_33_server_without_an_infra_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Someone pauses with mode=wait: vLLM 0.33 answers 503 until /resume, for longer than
    # RUN's whole retry budget.
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.05))
    server = VllmStandIn("0.33.0", checkpoint(tmp_path / "p.safetensors", 0))
    with standins(server) as [url]:

        async def main() -> list[dict]:
            async with aiohttp.ClientSession() as session:
                async with session.post(url + "/pause", params={"mode": "wait"}) as r:
                    assert r.status == 200

                async def resume_after_a_refusal() -> None:
                    # A second after the first 503, ten times the retry budget: a fixed delay from
                    # the start ran out before a loaded machine's RUN sent its first request. A
                    # server that refuses nothing is resumed anyway and fails the assertion below.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(30):
                            while server.rejected == 0:
                                await asyncio.sleep(0.05)
                    await asyncio.sleep(1.0)
                    async with session.post(url + "/resume") as r:
                        assert r.status == 200

                resumer = asyncio.create_task(resume_after_a_refusal())
                trajectories, _ = await play(run_settings([url]), guess_episodes(4, max_turns=2))
                await resumer
                return trajectories

        trajectories = asyncio.run(main())
    assert server.rejected > 0
    assert [t["termination"] for t in trajectories if t["termination"] == "INFRA_ERROR"] == []


def test_run_waits_out_responses_without_a_version_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stamping server answers without a stamp for a while (inside a middleware update
    # window): RUN samples those turns again, past its retry budget, with no infra failure.
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.05))
    server = SimulatedServer(step_s=lambda running: 0.005)
    with Fleet([server]) as fleet:

        async def window(stage: object, finished: int) -> None:
            if finished == 2:
                server.version = None
                asyncio.get_running_loop().call_later(1.0, setattr, server, "version", 1)

        trajectories, _ = asyncio.run(play(run_settings(fleet.urls),
                                           guess_episodes(12, max_turns=3), concurrency=4,
                                           after_each=window))
        unstamped = len(server.received) - sum(len(t["turns"]) for t in trajectories)
    assert [t["termination"] for t in trajectories if t["termination"] == "INFRA_ERROR"] == []
    assert {turn["policy_version"] for t in trajectories for turn in t["turns"]} == {0, 1}
    assert unstamped > 0  # the window was real: those answers were sampled again
