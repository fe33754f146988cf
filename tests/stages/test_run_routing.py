"""RUN across several inference servers: affinity, balance, a server killed mid-run, servers
added and removed, token exactness against what each server returned, failures as infra."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from rollstream.contracts.codec import unpack_ids
from rollstream.contracts.inference import EmbeddedChatTemplate
from rollstream.contracts.wire import lora_name
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.envs.base import ENV_KINDS
from rollstream.inference.routing import UNKNOWN_VERSION, Router, VersionUnknown
from rollstream.runtime import EventContext
from stages.eval import EvalStage
from stages.run import PLAYERS, RunStage, conversation, player
from tests.helpers.run_helpers import guess_episodes, play, run_settings


def gpu_like() -> SimulatedServer:
    # Latency grows with the batch, so load differences show and episodes overlap.
    return SimulatedServer(step_s=lambda running: 0.002 + 0.0002 * running)


def turn_servers(trajectory: dict) -> list[str]:
    return [t["server"] for t in trajectory["turns"]]


def test_episodes_stay_on_one_server_and_go_to_the_least_loaded(monkeypatch) -> None:
    # Totals per server are not compared: on a busy machine one simulated server runs slower,
    # keeps its episodes longer and rightly gets fewer new ones. What the router promises is
    # that each new episode goes where the live load is least.
    picks: list[tuple[float, float]] = []  # (chosen server's load, least load), before the pin
    pin = Router.pin

    def recording_pin(router: Router, episode_id: str, prefer: str | None = None):
        new = episode_id not in router.pins
        loads = {s.url: s.score()[0] for s in router.servers.values() if s.usable}
        server = pin(router, episode_id, prefer)
        if new and server is not None:
            picks.append((loads[server.url], min(loads.values())))
        return server

    monkeypatch.setattr(Router, "pin", recording_pin)
    with Fleet([gpu_like() for _ in range(3)]) as fleet:
        trajectories, stage = asyncio.run(play(run_settings(fleet.urls), guess_episodes(200)))
    assert {t["termination"] for t in trajectories} <= {"DONE", "MAX_TURNS"}
    turns = [s for t in trajectories for s in turn_servers(t)]
    on_home = sum(Counter(turn_servers(t)).most_common(1)[0][1] for t in trajectories)
    assert on_home / len(turns) >= 0.99 and sum(len(t["turns"]) > 1 for t in trajectories) > 100
    assert set(turn_servers(t)[0] for t in trajectories) == set(fleet.urls)
    assert len(picks) == 200 and all(chosen == least for chosen, least in picks)
    assert stage.router is not None and stage.router.migrations == 0


def test_equal_servers_take_turns() -> None:
    async def main(fleet: Fleet) -> tuple[list[str], list[str]]:
        router = Router(fleet.urls, max_episodes=64, health_interval_s=60)
        await router.start()
        try:
            held = [router.pin(f"held{i}").url for i in range(30)]
            for i in range(30):
                router.release(f"held{i}")
            one_at_a_time = []
            for i in range(90):
                one_at_a_time.append(router.pin(f"e{i}").url)
                router.release(f"e{i}")
            return held, one_at_a_time
        finally:
            await router.close()

    with Fleet([SimulatedServer() for _ in range(3)]) as fleet:
        held, one_at_a_time = asyncio.run(main(fleet))
    assert Counter(held) == {url: 10 for url in fleet.urls}
    # Idle servers tie on load: the fewest episodes ever assigned goes next, so they alternate.
    assert Counter(one_at_a_time) == {url: 30 for url in fleet.urls}
    assert all(a != b for a, b in zip(one_at_a_time, one_at_a_time[1:], strict=False))


def test_killing_a_server_mid_run_loses_no_episode() -> None:
    killed: list[str] = []
    with Fleet([gpu_like() for _ in range(3)]) as fleet:

        async def kill_one(stage: RunStage, finished: int) -> None:
            if finished == 40:
                killed.append(fleet.urls[0])
                await asyncio.to_thread(fleet.kill, 0)

        trajectories, stage = asyncio.run(
            play(run_settings(fleet.urls), guess_episodes(200), after_each=kill_one))
    assert {t["termination"] for t in trajectories} <= {"DONE", "MAX_TURNS"}
    moved = [t for t in trajectories if len(set(turn_servers(t))) > 1]
    assert moved and all(turn_servers(t)[-1] != killed[0] for t in moved)
    assert stage.router is not None and stage.router.migrations >= len(moved)
    # A moved episode's turns are still one token-exact conversation (full history resent).
    for t in moved:
        assert [turn["index"] for turn in t["turns"]] == list(range(len(t["turns"])))


def test_the_only_server_restarting_mid_run_costs_no_episode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every server down at once (the only one SIGKILLed and started again): the episodes in
    flight wait for it past their retry budget instead of ending as infra failures."""
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.1))
    with Fleet([gpu_like()]) as fleet:
        port = int(fleet.urls[0].rsplit(":", 1)[1])
        downtime_s = 3.0  # far past the retry budget's 0.15 s

        async def restart(stage: RunStage, finished: int) -> None:
            if finished == 20:
                await asyncio.to_thread(fleet.kill, 0)
                await asyncio.sleep(downtime_s)
                await asyncio.to_thread(fleet.call, fleet.servers[0].start(port=port))

        trajectories, stage = asyncio.run(
            play(run_settings(fleet.urls), guess_episodes(100), after_each=restart))
    assert {t["termination"] for t in trajectories} <= {"DONE", "MAX_TURNS"}
    assert len(trajectories) == 100


def test_turn_ids_are_exactly_what_the_servers_returned_plus_observation_deltas() -> None:
    template = EmbeddedChatTemplate()
    with Fleet([gpu_like() for _ in range(3)]) as fleet:
        trajectories, _ = asyncio.run(play(run_settings(fleet.urls), guess_episodes(30)))
        answered = {tuple(body["prompt"]): ids for server in fleet.servers
                    for body, ids in zip(server.received, server.returned, strict=True)}
    multi = [t for t in trajectories if len(t["turns"]) >= 2]
    assert multi
    for trajectory in trajectories:
        context: list[int] = []
        for i, turn in enumerate(trajectory["turns"]):
            prompt = unpack_ids(turn["prompt_ids"]).tolist()
            expected_prompt = (template.first_prompt(trajectory["task"]["prompt"]) if i == 0
                               else template.observation_delta(trajectory["turns"][i - 1]
                                                               ["observation"]))
            assert prompt == expected_prompt
            context += prompt
            # The server was sent exactly this context and its answer is kept id for id.
            assert unpack_ids(turn["completion_ids"]).tolist() == answered[tuple(context)]
            context += answered[tuple(context)]
            assert turn["policy_version"] == 0 and not turn["new_sample"]


def test_servers_added_and_removed_while_running() -> None:
    async def main(fleet: Fleet) -> tuple[Router, list[str], list[str]]:
        listed = [fleet.urls[0]]
        router = Router(lambda: listed, max_episodes=8, health_interval_s=60)
        await router.start()
        try:
            first = [router.pin(f"e{i}").url for i in range(4)]
            listed.append(fleet.urls[1])  # added
            await router.check()
            second = [router.pin(f"n{i}").url for i in range(4)]
            listed.remove(fleet.urls[0])  # removed: its pinned episodes move on their next turn
            await router.check()
            assert router.pin("e0").url == fleet.urls[1] and router.migrations == 1
            assert router.capacity() == 8 - (4 + 1)
            return router, first, second
        finally:
            await router.close()

    with Fleet([SimulatedServer(), SimulatedServer()]) as fleet:
        router, first, second = asyncio.run(main(fleet))
    assert set(first) == {fleet.urls[0]}
    assert Counter(second) == {fleet.urls[1]: 4}  # the new, empty server takes new episodes


def test_full_servers_leave_no_capacity_and_new_episodes_wait() -> None:
    async def main(fleet: Fleet) -> None:
        router = Router(fleet.urls, max_episodes=2, health_interval_s=60)
        await router.start()
        try:
            assert router.capacity() == 4
            pinned = [router.pin(f"e{i}") for i in range(4)]
            assert router.capacity() == 0
            assert Counter(s.url for s in pinned if s) == {u: 2 for u in fleet.urls}
            router.release("e0")
            assert router.capacity() == 1
        finally:
            await router.close()

    with Fleet([SimulatedServer(), SimulatedServer()]) as fleet:
        asyncio.run(main(fleet))


def test_version_stamps_come_from_the_server_or_the_lora_adapter_named() -> None:
    lora = SimulatedServer(version=None, adapters=[lora_name(1), lora_name(2)])
    plain = SimulatedServer(version=None)  # vLLM without the stamping middleware
    stamped = SimulatedServer(version=4)

    async def main(fleet: Fleet) -> list[object]:
        router = Router(fleet.urls, max_episodes=1, health_interval_s=60)
        await router.start()
        out: list[object] = []
        try:
            for episode in ("a", "b", "c"):  # one per server
                c = await router.complete(episode, [1, 2], {"max_tokens": 4}, [260])
                out.append((c.server, c.policy_version))
            stamped.version = None  # inside a weight update: no stamp
            with pytest.raises(VersionUnknown):
                await router.complete("c", [1, 2], {"max_tokens": 4}, [260])
        finally:
            await router.close()
        return out

    with Fleet([lora, plain, stamped]) as fleet:
        results = asyncio.run(main(fleet))
    assert set(results) == {(lora.url, 2), (plain.url, UNKNOWN_VERSION), (stamped.url, 4)}
    assert lora.received[0]["model"] == lora_name(2)  # the newest adapter, by name


@pytest.mark.parametrize("fault", ["error", "hang", "drop", "refused"])
def test_failing_server_ends_the_episode_as_infra_never_reward_zero(
        fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.1, 0.2))
    monkeypatch.setattr("rollstream.turns.OUTAGE_WINDOW_S", 0.5)  # the server stays down
    with Fleet([SimulatedServer()]) as fleet:

        async def main() -> list[dict]:
            settings = run_settings(fleet.urls, request_timeout_s=0.5)
            episodes = guess_episodes(4)
            if fault == "refused":
                await asyncio.to_thread(fleet.kill, 0)
            else:
                fleet.servers[0].fault = fault
            trajectories, _ = await play(settings, episodes)
            return trajectories

        trajectories = asyncio.run(main())
    eval_stage = EvalStage(run_settings([]))
    for trajectory in trajectories:
        assert trajectory["termination"] == "INFRA_ERROR", trajectory["termination_detail"]
        assert "4 times" in trajectory["termination_detail"]
        assert trajectory["attempt"] == 2  # played again twice (the default limit), in vain
        outputs = asyncio.run(eval_stage.handle(trajectory, EventContext(0, 0, print)))
        [scored] = [o for o in outputs if o.topic == eval_stage.topics.scored]
        assert scored.value["failure_class"] == "infra" and scored.value["reward"] is None


def test_conversation_rebuilds_the_chat_from_turns() -> None:
    task = guess_episodes(1)[0]["task"]
    turns = [{"completion_text": "5", "observation": "higher"},
             {"completion_text": "8", "observation": None}]
    assert conversation(task, turns) == [
        {"role": "user", "content": task["prompt"]}, {"role": "assistant", "content": "5"},
        {"role": "user", "content": "higher"}, {"role": "assistant", "content": "8"}]


def test_every_environment_kind_has_one_registered_player() -> None:
    assert sorted(PLAYERS) == sorted(ENV_KINDS)
    with pytest.raises(ValueError, match="'steps' is registered already"):
        player("steps")(PLAYERS["steps"])
    assert len(PLAYERS) == len(ENV_KINDS)


def test_run_settings_list_every_server(tmp_path) -> None:
    extra = tmp_path / "servers.txt"
    extra.write_text("http://b:8000/\n# a comment\n\nhttp://a:8000  # dup\n")
    settings = run_settings(["http://a:8000", "http://c:8000"]).override(policy_url_file=str(extra))
    assert settings.inference.policy_urls() == ["http://a:8000", "http://c:8000", "http://b:8000"]
