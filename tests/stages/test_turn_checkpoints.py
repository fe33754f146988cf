"""RUN's per-turn checkpoints: a turn's checkpoint costs that turn, not the trajectory so far, and
an episode rebuilt from its turns by another RUN goes on exactly as the uninterrupted one."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
from confluent_kafka import TopicPartition

from producers.publish import validate_task
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings
from rollstream.contracts.codec import codec, pack_ids
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.runtime import EventContext, StageRuntime
from rollstream.turns import Playing
from stages.run import Saved, read_saved

TURNS = 40
FILLER = 60  # bytes of completion after the guess: a turn of realistic proportions, not 2 tokens


def long_guess(prompt_ids: list[int], body: dict[str, Any]) -> tuple[list[int], str]:
    """A digit from the prompt and seed (never the secret, 50), then filler: byte ids, the
    embedded tokenizer's, and the stop token."""
    text = str((sum(prompt_ids) + int(body.get("seed") or 0)) % 10) + " " + "x" * FILLER
    return [*text.encode(), *(body.get("stop_token_ids") or [])[:1]], text


def episode(max_turns: int = TURNS) -> dict:
    task = validate_task({
        "task_id": "long", "env": "guess_number", "prompt": "Guess 0-99.",
        "data": {"secret": 50, "low": 0, "high": 99}, "max_turns": max_turns, "group_size": 1,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 128,
                     "seed": 3}})
    return {"episode_id": "long#0", "task": task, "sample_index": 0, "created_at_ms": 1}


def read(settings: Settings, topic: str) -> list:
    return list(kafka.read_partitions(settings, [TopicPartition(topic, p, 0) for p in range(4)]))


class Run:
    """A RUN stage runtime serving in a thread of its own."""

    def __init__(self, settings: Settings) -> None:
        from stages.run import RunStage

        self.runtime = StageRuntime(RunStage(settings), settings, drain_timeout_s=0.0)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.runtime.serve()))
        self.thread.start()

    def stop(self) -> None:
        self.runtime.stop()
        self.thread.join(60)
        assert not self.thread.is_alive()


def wait_for(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def play(settings: Settings, max_turns: int = TURNS,
         interrupt_after: int | None = None) -> tuple[dict, list]:
    """Play the episode to its end on a simulated server; with `interrupt_after`, stop RUN
    once the server has answered that many turns and let a second RUN take the episode over
    (which must not start it again). The trajectory, and every record left on
    <p>.episode-state."""
    producer = kafka.producer(settings)
    e = episode(max_turns)
    kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", e),
                  key=e["episode_id"])
    producer.flush()
    # A decode step of 6 ms: a turn takes ~0.4 s, so RUN is stopped inside the episode.
    step_s = 0.006 if interrupt_after is not None else 0.0
    server = SimulatedServer(script=long_guess, step_s=lambda running: step_s)
    with Fleet([server]) as fleet:
        settings = settings.override(policy_url=fleet.urls[0], commit_interval_ms=100)
        run = Run(settings)
        try:
            if interrupt_after is not None:
                wait_for(lambda: len(server.received) >= interrupt_after, 120,
                         f"{interrupt_after} turns")
                run.stop()
                assert not read(settings, settings.topics.trajectories)
                before = len(server.received)
                run = Run(settings)
            [msg] = wait_for(lambda: read(settings, settings.topics.trajectories), 120,
                             "the trajectory")
            if interrupt_after is not None:
                # Resumed, not replayed: the turns checkpointed before the stop are not redone.
                assert len(server.received) - before <= max_turns - interrupt_after + 2
        finally:
            run.stop()
    return codec().decode_as("Trajectory", msg.value()), read(settings,
                                                                 settings.topics.episode_state)


def test_a_turns_checkpoint_costs_that_turn_not_the_trajectory_so_far(
        settings: Settings) -> None:
    trajectory, state = play(settings)
    turns = trajectory["turns"]
    assert len(turns) == TURNS and trajectory["termination"] == "DONE"
    written = [m for m in state if m.value() is not None]
    assert [m.key().decode() for m in written] == [f"long#0/{i}" for i in range(TURNS - 1)]
    # What each turn adds to the trajectory, as encoded on <p>.trajectories.
    c = codec()
    so_far = [len(c.encode("Trajectory", {**trajectory, "turns": turns[:n]}))
              for n in range(TURNS + 1)]
    added = [b - a for a, b in zip(so_far, so_far[1:], strict=False)]
    ratios = [len(m.value()) / added[i] for i, m in enumerate(written)]
    # Flat as the episode grows: within 1.5x of the turn itself from first to last (the
    # environment's state, a list of guesses here, is the only part that grows), where the
    # whole trajectory so far would be 39x the last turn.
    assert max(ratios) <= 1.5, ratios
    assert len(written[-1].value()) < 1.3 * len(written[1].value())
    assert so_far[-2] > 30 * len(written[-1].value())
    # Finished: a tombstone for every turn key, after its turns.
    tombstones = [m.key().decode() for m in state if m.value() is None]
    assert sorted(tombstones) == sorted(f"long#0/{i}" for i in range(TURNS))
    assert read_saved(range(4), [(m.partition(), m.key().decode(),
                                  *(c.decode(m.value()) if m.value() else (None, None)))
                                 for m in state]) == {p: {} for p in range(4)}


def test_a_restored_episode_equals_the_uninterrupted_one_token_for_token(
        settings: Settings) -> None:
    whole, _ = play(settings, max_turns=20)
    # The same episode on fresh topics, RUN stopped after 8 turns and another taking over.
    prefix = f"{settings.topics.prefix}r"
    create_topics(settings.bootstrap_servers, prefix, partitions=4)
    try:
        resumed, _ = play(replace(settings, prefix=prefix), max_turns=20, interrupt_after=8)
    finally:
        delete_topics(settings.bootstrap_servers, prefix)
    kept = ("index", "prompt_ids", "completion_ids", "logprobs", "policy_version",
            "finish_reason", "completion_text", "tool_call", "observation", "new_sample")
    assert [{k: t[k] for k in kept} for t in resumed["turns"]] == [
        {k: t[k] for k in kept} for t in whole["turns"]]
    assert (resumed["env_state"], resumed["termination"]) == (whole["env_state"],
                                                              whole["termination"])


def turn(index: int, observation: str | None = None) -> dict:
    return {"index": index, "prompt_ids": bytes([index]), "observation": observation}


def checkpoint(index: int, previous_observation: str | None = None) -> dict:
    return {"episode_id": "e#0", "turn": turn(index), "env_state": f'{{"at": {index}}}',
            "previous_observation": previous_observation, "started_at_ms": 7}


def test_an_episode_is_rebuilt_from_its_turns_in_the_order_written() -> None:
    records = [(0, "e#0/0", "TurnCheckpoint", checkpoint(0)),
               (0, "e#0/1", "TurnCheckpoint", checkpoint(1, previous_observation="late")),
               (0, "e#0/2", "TurnCheckpoint", checkpoint(2)),
               # Another RUN resumed it from turn 1 and wrote turn 2 again (and only that).
               (0, "e#0/3", "TurnCheckpoint", checkpoint(3)),
               (0, "e#0/2", "TurnCheckpoint", checkpoint(2, previous_observation="again")),
               (1, "f#0/0", "TurnCheckpoint", {**checkpoint(0), "episode_id": "f#0"}),
               (1, "f#0/0", None, None)]  # f#0 finished
    saved = read_saved([0, 1], records)
    assert saved[1] == {}
    turns, state = saved[0]["e#0"].played()
    assert [t["index"] for t in turns] == [0, 1, 2]  # turn 3 went with the turn 2 it followed
    assert saved[0]["e#0"].keys == 4  # but its key was written: it gets a tombstone at the end
    assert [t["observation"] for t in turns] == ["late", "again", None]
    assert (state, saved[0]["e#0"].started_at_ms) == ('{"at": 2}', 7)


def test_a_missing_turn_ends_what_is_rebuilt_and_tombstones_end_the_episode() -> None:
    saved = Saved()
    for i in (0, 1, 3):
        saved.add(checkpoint(i))
    assert [t["index"] for t in saved.played()[0]] == [0, 1]
    assert saved.played()[1] == '{"at": 1}'  # the state after the last turn rebuilt
    tombstones = [(0, f"e#0/{i}", None, None) for i in range(3)]
    left = read_saved([0], [(0, f"e#0/{i}", "TurnCheckpoint", checkpoint(i)) for i in (0, 1, 3)]
                      + tombstones)
    assert [t["index"] for t in left[0]["e#0"].played()[0]] == []  # turn 3's key is left
    assert read_saved([0], [(0, f"e#0/{i}", "TurnCheckpoint", checkpoint(i)) for i in (0, 1)]
                      + tombstones) == {0: {}}


def test_an_earlier_releases_whole_trajectory_checkpoint_is_read_and_ended() -> None:
    legacy = {"episode_id": "e#0", "turns": [turn(0, "higher"), turn(1)],
              "env_state": '{"at": 1}', "started_at_ms": 5}
    saved = read_saved([0], [(0, "e#0", "Trajectory", legacy),
                             (0, "e#0/2", "TurnCheckpoint", checkpoint(2, "lower"))])
    turns, state = saved[0]["e#0"].played()
    assert [t["observation"] for t in turns] == ["higher", "lower", None]
    assert state == '{"at": 2}' and saved[0]["e#0"].legacy
    assert read_saved([0], [(0, "e#0", "Trajectory", legacy), (0, "e#0", None, None)]
                      ) == {0: {}}


def test_a_resumed_episode_holds_its_current_sample_as_int32_ids() -> None:
    """The context RUN keeps for each episode in flight is 4 bytes an id, from the last turn that
    started a new sample (ids past 2^16: a real vocabulary's, not the byte tokenizer's)."""
    def played(index: int, prompt: list[int], new_sample: bool = False) -> dict:
        return {"index": index, "prompt_ids": pack_ids(prompt),
                "completion_ids": pack_ids([151_000 + index, 151_645]), "new_sample": new_sample}

    turns = [played(0, [70_000, 70_001]), played(1, [9]), played(2, [80_000, 5], True),
             played(3, [6])]
    episode = Playing.resume({"turns": turns, "env_state": "{}"},  # type: ignore[typeddict-item]
                             EventContext(0, 0, lambda output: None))
    expected = [80_000, 5, 151_002, 151_645, 6, 151_003, 151_645]
    assert episode.sample.dtype == np.int32 and episode.sample.tolist() == expected
    assert episode.sample.nbytes == 4 * len(expected)
