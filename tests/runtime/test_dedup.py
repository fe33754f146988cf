"""Idempotence by id on the real broker: a re-published task is expanded once and a duplicated
trajectory scored once, within one process and across a restart (rollstream.dedup)."""

from __future__ import annotations

from collections import Counter

from producers.publish import publish, validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dedup import SeenIds
from rollstream.runtime import StageRuntime
from stages.eval import EvalStage
from stages.init import InitStage
from tests.helpers.runtime_helpers import read_all, run_until
from tests.helpers.scored_factory import scored

PARTITIONS = 4


def _task(task_id: str) -> dict:
    return validate_task({"task_id": task_id, "env": "arithmetic", "prompt": "1+1=",
                          "data": {"answer": "2"}, "group_size": 3})


def _keys(settings: Settings, topic: str) -> Counter[bytes]:
    return Counter(m.key() for m in read_all(settings, topic, PARTITIONS))


def _run_until_keys(settings: Settings, stage: object, topic: str, inputs: int,
                    outputs: int) -> Counter:
    """Run the stage until it has handled `inputs` events and `outputs` are committed; the
    committed output keys, counted."""
    runtime = StageRuntime(stage, settings)  # type: ignore[arg-type]
    found: Counter[bytes] = Counter()

    def done() -> bool:
        if runtime.stats["processed"] < inputs:
            return False
        found.clear()
        found.update(_keys(settings, topic))
        return sum(found.values()) >= outputs

    run_until(runtime, done, timeout=90)
    found.clear()
    found.update(_keys(settings, topic))  # and what the final commit added, if anything
    return found


def test_a_republished_task_is_expanded_once_even_after_a_restart(settings: Settings) -> None:
    # Sent twice in one batch, then again (with a new task) to a restarted INIT.
    publish(settings, [_task("a"), _task("b"), _task("a")])
    first = _run_until_keys(settings, InitStage(settings), settings.topics.episodes, 3, 6)
    publish(settings, [_task("a"), _task("c")])
    # The restarted INIT must expand c; a and b stay at one expansion each.
    episodes = _run_until_keys(settings, InitStage(settings), settings.topics.episodes, 2, 9)
    assert set(first.values()) == {1}
    assert episodes == Counter({f"{t}#{i}".encode(): 1 for t in "abc" for i in range(3)})


def test_a_duplicated_trajectory_is_scored_once_even_after_a_restart(settings: Settings) -> None:
    def send(*episodes: tuple[str, int, int]) -> None:
        producer = kafka.producer(settings)
        for task_id, index, attempt in episodes:
            trajectory = scored(task_id, index, 1.0, attempt=attempt)["trajectory"]
            kafka.produce(producer, settings.topics.trajectories,
                          codec().encode("Trajectory", trajectory), key=trajectory["episode_id"])
        producer.flush()

    # (task, sample, attempt): x#1's attempt 0 arrives after its attempt 1, late.
    send(("x", 0, 0), ("x", 1, 1), ("x", 0, 0), ("x", 0, 0), ("x", 1, 0))
    first = _run_until_keys(settings, EvalStage(settings), settings.topics.scored, 5, 2)
    assert first == Counter({b"x#0": 1, b"x#1": 1})
    # After a restart: a newer attempt of x#0 is scored; x#1's attempt 1 (its marker's) is not.
    send(("x", 1, 1), ("y", 0, 0), ("x", 0, 0), ("x", 0, 1))
    scored_keys = _run_until_keys(settings, EvalStage(settings), settings.topics.scored, 4, 4)
    assert scored_keys == Counter({b"x#0": 2, b"x#1": 1, b"y#0": 1})
    attempts = sorted((m.key(), codec().decode_as("ScoredTrajectory", m.value())["trajectory"][
        "attempt"]) for m in read_all(settings, settings.topics.scored, PARTITIONS))
    assert attempts == [(b"x#0", 0), (b"x#0", 1), (b"x#1", 1), (b"y#0", 0)]


def test_the_memory_is_bounded_oldest_forgotten_first(settings: Settings) -> None:
    seen = SeenIds(settings.override(dedup_window=2), "eval")
    seen.restore([0])
    assert seen.claim(0, "a") and seen.claim(0, "b") and not seen.claim(0, "a")
    assert seen.claim(0, "c")  # window 2: "a" (the oldest) is forgotten
    assert seen.claim(0, "a") and not seen.claim(0, "c")
    assert seen.claim(1, "a")  # per partition


def test_a_restore_keeps_committed_markers_and_is_not_held_up_by_an_open_transaction(
        settings: Settings) -> None:
    """A writer killed inside a transaction leaves it open (for 15 s, its timeout): the
    restore reads up to the last stable offset, at once, and keeps the committed marker only."""
    seen_topic = settings.topics.seen
    done = kafka.producer(settings, f"{settings.prefix}-done")
    done.init_transactions(30)
    with kafka.transaction(done):
        kafka.produce(done, seen_topic, b"", "eval/handled", partition=0)
    killed = kafka.producer(settings, f"{settings.prefix}-killed")
    killed.init_transactions(30)
    killed.begin_transaction()
    kafka.produce(killed, seen_topic, b"", "eval/in-flight", partition=0)
    assert killed.flush(30) == 0  # written, never committed: the writer is gone

    seen = SeenIds(settings, "eval")
    seen.restore([0], attempts=1, attempt_s=10.0)  # less than the transaction's timeout
    assert not seen.claim(0, "handled")
    assert seen.claim(0, "in-flight")
