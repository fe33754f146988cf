"""RUN against the embedded policy server over real HTTP: resume from a checkpoint, token layout."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec, pack_ids, pack_logprobs, unpack_ids
from rollstream.contracts.inference import EmbeddedChatTemplate
from rollstream.dev.processes import ProcessGroup, free_port
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.runtime import StageRuntime
from stages.run import RunStage


@pytest.fixture(scope="module")
def policy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    procs = ProcessGroup(Path(tmp_path_factory.mktemp("policy")))
    yield procs.start_policy().ready()
    procs.stop_all()


def guess_task() -> dict:
    return validate_task({
        "task_id": "resume-1", "env": "guess_number", "prompt": "Guess 0-9.",
        "data": {"secret": 9, "low": 0, "high": 9}, "max_turns": 3, "group_size": 1,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4, "seed": 1}})


def run_until_output(settings: Settings, topic: str, timeout: float = 60.0) -> list:
    runtime = StageRuntime(RunStage(settings), settings)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.serve()))
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            out = list(kafka.read_partitions(settings, [TopicPartition(topic, p, 0)
                                                        for p in range(4)]))
            if out:
                return out
            time.sleep(0.3)
    finally:
        runtime.stop()
        thread.join(60)
    raise AssertionError("RUN produced no trajectory")


def test_run_resumes_an_episode_from_its_checkpoint(settings: Settings, policy_url: str) -> None:
    settings = settings.override(policy_url=policy_url)
    template = EmbeddedChatTemplate()
    task = guess_task()
    first_prompt = template.first_prompt(task["prompt"])
    # A checkpoint as a RUN process that died after turn 0 would have left it.
    turn0 = {
        "index": 0, "prompt_ids": pack_ids(first_prompt),
        "completion_ids": pack_ids([ord("3"), template.stop_token_ids[0]]),
        "logprobs": pack_logprobs([-0.5, -0.25]), "policy_version": 0,
        "finish_reason": "stop", "completion_text": "3", "tool_call": json.dumps({"guess": 3}),
        "observation": "higher", "server": "crashed-run", "started_at_ms": 1,
        "inference_ms": 1.0, "env_ms": 0.0, "new_sample": False, "adapter": None,
    }
    checkpoint = {
        "episode_id": "resume-1#0", "task": task, "sample_index": 0, "turns": [turn0],
        "termination": "RUNNING", "termination_detail": "",
        "env_state": json.dumps({"guesses": [3]}), "started_at_ms": 1, "finished_at_ms": 0,
    }
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.episode_state,
                  codec().encode("Trajectory", checkpoint), key="resume-1#0", partition=2)
    kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", {
        "episode_id": "resume-1#0", "task": task, "sample_index": 0, "created_at_ms": 1,
    }), key="resume-1#0", partition=2)
    producer.flush()

    [msg] = run_until_output(settings, settings.topics.trajectories)
    trajectory = codec().decode_as("Trajectory", msg.value())
    turns = trajectory["turns"]
    assert turns[0] == turn0  # the checkpointed turn is kept as it was, not replayed
    assert len(turns) >= 2 and trajectory["termination"] in ("DONE", "MAX_TURNS")
    # The next turn appends only the observation's template delta; history is never re-tokenized.
    assert unpack_ids(turns[1]["prompt_ids"]).tolist() == template.observation_delta("higher")
    assert turns[1]["server"] == policy_url
    for turn in turns[1:]:
        ids = unpack_ids(turn["completion_ids"])
        assert len(ids) == len(turn["logprobs"]) // 4 and len(ids) <= 4
    # Finished: the checkpoint is replaced by a tombstone.
    state = list(kafka.read_partitions(settings, [TopicPartition(settings.topics.episode_state,
                                                                 2, 0)]))
    assert state[-1].key() == b"resume-1#0" and state[-1].value() is None


def test_failing_server_ends_the_episode_as_infra_not_reward_zero(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    task = guess_task()
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", {
        "episode_id": "resume-1#0", "task": task, "sample_index": 0, "created_at_ms": 1,
    }), key="resume-1#0")
    producer.flush()
    monkeypatch.setattr("rollstream.turns.RETRY_DELAYS_S", (0.05, 0.05))
    # Healthy by /health (so RUN takes the episode), but every completion's connection drops.
    with Fleet([SimulatedServer(fault="drop")]) as fleet:
        settings = settings.override(policy_url=fleet.urls[0],
                                     request_timeout_s=2.0)
        [msg] = run_until_output(settings, settings.topics.trajectories)
    trajectory = codec().decode_as("Trajectory", msg.value())
    assert trajectory["termination"] == "INFRA_ERROR"
    assert "3 times" in trajectory["termination_detail"]
    assert trajectory["turns"] == []
    assert trajectory["attempt"] == 2  # RUN played it twice more (the default), in vain


def test_no_usable_server_means_no_episodes_taken(settings: Settings) -> None:
    """With every server down RUN has no capacity: episodes wait in the topic rather than
    being burnt as infra failures, and run once a server answers again."""
    port = free_port()
    settings = settings.override(policy_url=f"http://127.0.0.1:{port}",
                                 health_interval_s=0.2)
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", {
        "episode_id": "wait-1#0", "task": guess_task(), "sample_index": 0, "created_at_ms": 1,
    }), key="wait-1#0")
    producer.flush()
    runtime = StageRuntime(RunStage(settings), settings)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.serve()))
    thread.start()
    try:
        time.sleep(3)
        assert runtime.stats["processed"] == 0
        with Fleet([SimulatedServer()]) as fleet:
            fleet.call(fleet.servers[0].stop())
            fleet.call(fleet.servers[0].start(port=port))  # the listed server comes up
            deadline = time.monotonic() + 30
            while runtime.stats["processed"] == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        runtime.stop()
        thread.join(60)
    [msg] = list(kafka.read_partitions(settings, [
        TopicPartition(settings.topics.trajectories, p, 0) for p in range(4)]))
    assert codec().decode_as("Trajectory", msg.value())["termination"] in ("DONE", "MAX_TURNS")


def test_servers_at_their_cap_pause_run_instead_of_queueing(settings: Settings) -> None:
    server = SimulatedServer(step_s=lambda running: 0.02)
    producer = kafka.producer(settings)
    for i in range(12):
        episode_id = f"cap-{i}#0"
        kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", {
            "episode_id": episode_id, "task": {**guess_task(), "task_id": f"cap-{i}"},
            "sample_index": 0, "created_at_ms": 1}), key=episode_id)
    producer.flush()
    with Fleet([server]) as fleet:
        settings = settings.override(policy_url=fleet.urls[0],
                                     server_max_in_flight=2)
        stage = RunStage(settings)
        runtime = StageRuntime(stage, settings)
        most_in_flight = 0
        thread = threading.Thread(target=lambda: asyncio.run(runtime.serve()))
        thread.start()
        try:
            deadline = time.monotonic() + 60
            while runtime.stats["processed"] < 12 and time.monotonic() < deadline:
                if stage.router is not None:  # episodes taken and not finished
                    most_in_flight = max(most_in_flight, len(stage.router.pins))
                time.sleep(0.01)
        finally:
            runtime.stop()
            thread.join(60)
    assert runtime.stats["processed"] == 12
    assert most_in_flight == 2 and server.busy_time(at_least=3) == 0
