"""RUN restores a newly assigned partition's checkpoints in its main loop, not in the rebalance
callback: while it reads a large <p>.episode-state back, the episodes of the partitions it
already holds keep taking turns."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from producers.publish import validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev.simulated import Fleet, SimulatedServer, guess_digit
from rollstream.runtime import StageRuntime
from stages.run import RunStage

EPISODES_PER_PARTITION = 4
STATE_RECORDS = 8000  # checkpoints per handed-over partition: a restore of seconds
STEP_S = 0.05  # the simulated server's decode step: a turn of two tokens takes 0.1 s


def long_episode(partition: int, index: int) -> dict:
    # The secret is out of a digit guess's reach: the episode runs to max_turns.
    task = validate_task({
        "task_id": f"p{partition}-e{index}", "env": "guess_number",
        "prompt": f"Guess 0-99 [p{partition}].", "data": {"secret": 50, "low": 0, "high": 99},
        "max_turns": 256, "group_size": 1,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 2,
                     "seed": index}})
    return {"episode_id": f"{task['task_id']}#0", "task": task, "sample_index": 0,
            "created_at_ms": 1}


def checkpoint_of(episode: dict, pad: int) -> dict:
    return {"episode_id": episode["episode_id"], "task": episode["task"], "sample_index": 0,
            "turns": [], "termination": "RUNNING", "termination_detail": "x" * pad,
            "env_state": '{"guesses": []}', "started_at_ms": 1, "finished_at_ms": 0}


class TimedRestores(RunStage):
    """RUN, noting when each of its restores ran."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        # (partitions, started, ended, checkpoints read per partition)
        self.restored: list[tuple[list[int], float, float, dict[int, int]]] = []

    async def restore(self, partitions: list[int]) -> None:
        started = time.monotonic()
        await super().restore(partitions)
        read = {p: len(self.checkpoints[p]) for p in partitions}
        self.restored.append((sorted(partitions), started, time.monotonic(), read))


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_episodes_go_on_while_a_new_partition_is_restored(settings: Settings) -> None:
    requests: list[tuple[float, str]] = []  # (arrival, prompt text) of every completion asked

    def script(prompt_ids: list[int], body: dict) -> tuple[list[int], str]:
        requests.append((time.monotonic(), bytes(i for i in prompt_ids if i < 256).decode(
            errors="ignore")))
        return guess_digit(prompt_ids, body)

    producer = kafka.producer(settings)
    for p in range(4):
        for i in range(EPISODES_PER_PARTITION):
            episode = long_episode(p, i)
            kafka.produce(producer, settings.topics.episodes,
                          codec().encode("Episode", episode), key=episode["episode_id"],
                          partition=p)
    producer.flush()

    # Another member holds half the partitions first; RUN takes them over when it leaves.
    other = kafka.consumer(settings, settings.topics.group("run"))
    other.subscribe([settings.topics.episodes])
    server = SimulatedServer(script=script, step_s=lambda running: STEP_S)
    with Fleet([server]) as fleet:
        run_settings = settings.override(policy_url=fleet.urls[0], health_interval_s=0.2)
        stage = TimedRestores(run_settings)
        runtime = StageRuntime(stage, run_settings)
        thread = threading.Thread(target=lambda: asyncio.run(runtime.serve()))
        try:
            wait(lambda: other.poll(0.1) is None and len(other.assignment()) == 4, 60,
                 "the other member holds every partition")
            thread.start()
            wait(lambda: other.poll(0.1) is None and len(other.assignment()) == 2, 60,
                 "RUN joined and took half the partitions")
            kept = sorted(set(range(4)) - {tp.partition for tp in other.assignment()})
            wait(lambda: any(f"[p{kept[0]}]" in text for _, text in requests), 60,
                 "RUN's episodes take turns")

            # A large checkpoint topic on the partitions RUN is about to take over.
            handed = sorted(tp.partition for tp in other.assignment())
            for p in handed:
                for i in range(STATE_RECORDS):
                    state = checkpoint_of(long_episode(p, 1000 + i), pad=1000)
                    kafka.produce(producer, settings.topics.episode_state,
                                  codec().encode("Trajectory", state),
                                  key=state["episode_id"], partition=p)
            producer.flush()
            other.close()
            wait(lambda: any(r[0] == handed for r in stage.restored), 120,
                 "RUN restored the partitions handed over")
        finally:
            runtime.stop()
            thread.join(60)

    [(_, started, ended, read)] = [r for r in stage.restored if r[0] == handed]
    assert read == {p: STATE_RECORDS for p in handed}
    during = [text for at, text in requests if started < at < ended]
    on_kept = [text for text in during if any(f"[p{p}]" in text for p in kept)]
    # At 0.1 s a turn, each of RUN's running episodes asks for a completion several times a
    # second: a restore that stopped the event loop would leave none in its window.
    assert ended - started > 0.5, f"the restore took {ended - started:.2f} s: not large enough"
    assert len(on_kept) >= 3, (
        f"{len(on_kept)} turns on partitions {kept} during the {ended - started:.1f} s restore "
        f"of {handed}")
