"""Bounds at the door: hostile tasks are refused by `publish` (nothing sent, dry run too), by
INIT (dead-lettered with the reason, the tasks behind them expanded) and, for episodes written
straight to `episodes`, by RUN's input check."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from producers.publish import TaskFileError, load_tasks, validate_task
from rollstream.cli import main
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.runtime import EventContext, InvalidEvent, StageRuntime
from stages.init import InitStage
from stages.run import RunStage
from tests.helpers.runtime_helpers import read_all, run_until

MIB = 1024 * 1024


def _task(task_id: str = "t", **fields: object) -> dict:
    return {"task_id": task_id, "env": "arithmetic", "prompt": "What is 1+1?",
            "data": {"answer": "2"}, **fields}


def _sampling(**fields: object) -> dict:
    return {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 64, "seed": None,
            **fields}


# (task fields, the field the error must name): every hostile input the issue lists, and more.
HOSTILE: list[tuple[dict, str]] = [
    ({"group_size": 10**6}, "group_size"),
    ({"group_size": 0}, "group_size"),
    ({"max_turns": 0}, "max_turns"),
    ({"max_turns": 100_000}, "max_turns"),
    ({"sampling": _sampling(top_p=math.inf)}, "sampling.top_p"),
    ({"sampling": _sampling(top_p=0.0)}, "sampling.top_p"),
    ({"sampling": _sampling(top_p=1.5)}, "sampling.top_p"),
    ({"sampling": _sampling(top_p=math.nan)}, "sampling.top_p"),
    ({"sampling": _sampling(temperature=math.nan)}, "sampling.temperature"),
    ({"sampling": _sampling(temperature=-0.5)}, "sampling.temperature"),
    ({"sampling": _sampling(temperature=-math.inf)}, "sampling.temperature"),
    ({"sampling": _sampling(top_k=0)}, "sampling.top_k"),
    ({"sampling": _sampling(top_k=-7)}, "sampling.top_k"),
    ({"sampling": _sampling(max_tokens=-1)}, "sampling.max_tokens"),
    ({"sampling": _sampling(max_tokens=0)}, "sampling.max_tokens"),
    ({"sampling": _sampling(max_tokens=10**6)}, "sampling.max_tokens"),
    ({"max_turns": 200, "sampling": _sampling(max_tokens=32768)}, "max_turns"),  # token budget
    ({"prompt": "x" * (5 * MIB)}, "prompt"),
    ({"task_id": "i" * (9 * MIB)}, "task_id"),
    ({"task_id": "i" * (2 * MIB + MIB // 5)}, "task_id"),
]


@pytest.mark.parametrize(("fields", "field"), HOSTILE,
                         ids=[f"{f}-{i}" for i, (_, f) in enumerate(HOSTILE)])
def test_validate_task_refuses_hostile_tasks_naming_the_field(fields: dict, field: str) -> None:
    item = _task(**{"task_id": "t", **fields})
    with pytest.raises(ValueError, match=f"field '{field}'"):
        validate_task(item)


def test_an_episode_too_big_for_its_topic_is_refused() -> None:
    # Every field within its own limit, but data makes each episode larger than the episodes
    # topic's max.message.bytes (4 MiB).
    data = {"answer": "2", "blob": "d" * (5 * MIB)}
    with pytest.raises(ValueError, match="episodes topic's max.message.bytes of 4194304"):
        validate_task(_task(data=data))


def test_limits_come_from_settings() -> None:
    strict = Settings().override(max_group_size=8, max_prompt_bytes=10)
    assert validate_task(_task(group_size=8, prompt="short"), settings=strict)["group_size"] == 8
    with pytest.raises(ValueError, match=r"field 'group_size'.*\[1, 8\].*max_group_size"):
        validate_task(_task(group_size=9), settings=strict)
    with pytest.raises(ValueError, match="field 'prompt': 11 bytes.*max_prompt_bytes"):
        validate_task(_task(prompt="x" * 11), settings=strict)
    # Within the defaults, the largest sensible values pass.
    task = validate_task(_task(group_size=1024, max_turns=32,
                               sampling=_sampling(temperature=0.0, top_p=1e-9, top_k=1,
                                                  max_tokens=32768, seed=-(2**63))))
    assert task["group_size"] == 1024


def test_load_tasks_names_line_and_field(tmp_path: Path) -> None:
    # JSON lets Python write Infinity and NaN; they must not slip through as numbers.
    lines = [json.dumps(_task("a")), json.dumps(_task("b", sampling=_sampling(top_p=math.inf)))]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert "Infinity" in path.read_text()
    with pytest.raises(TaskFileError, match=rf"{path}:2: field 'sampling.top_p'"):
        load_tasks(path)


def test_publish_refuses_out_of_bounds_tasks_and_sends_nothing(
        settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(_task("a")) + "\n" + json.dumps(_task("b", group_size=9)) + "\n")
    base = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    for extra in (["--dry-run"], []):
        assert main(["publish", str(path), "--max-group-size", "8", *base, *extra]) == 2
        err = capsys.readouterr().err
        assert f"{path}:2: field 'group_size'" in err and "max_group_size" in err
    assert read_all(settings, settings.topics.tasks, 4) == []
    # The same file under the default limit (1024) is fine.
    assert main(["publish", str(path), *base]) == 0
    assert len(read_all(settings, settings.topics.tasks, 4)) == 2


def test_init_dead_letters_hostile_tasks_and_expands_the_rest(settings: Settings) -> None:
    good = validate_task(_task("good", group_size=2))
    hostile = [
        {**good, "task_id": "huge-group", "group_size": 10**6},
        {**good, "task_id": "nan", "sampling": _sampling(temperature=math.nan)},
        {**good, "task_id": "inf", "sampling": _sampling(top_p=math.inf)},
        {**good, "task_id": "neg", "sampling": _sampling(max_tokens=-1)},
        {**good, "task_id": "no-turns", "max_turns": 0},
        {**good, "task_id": "long-prompt", "prompt": "p" * (2 * MIB)},
        {**good, "task_id": "i" * (2 * MIB + MIB // 5)},
    ]
    producer = kafka.producer(settings)
    # One partition, hostile tasks first: the good task behind them must still be expanded.
    for task in [*hostile, good]:
        kafka.produce(producer, settings.topics.tasks, codec().encode("Task", task),
                      key=task["task_id"][:100], partition=0)
    producer.flush()

    runtime = StageRuntime(InitStage(settings), settings)
    committed: list = []

    def all_dead_lettered() -> bool:
        committed[:] = read_all(settings, settings.topics.dlq, 4)
        return len(committed) >= len(hostile)

    run_until(runtime, all_dead_lettered, timeout=90)
    letters = [codec().decode_as("DeadLetter", m.value()) for m in committed]
    reasons = {dl["source_offset"]: dl["reason"] for dl in letters}
    assert sorted(reasons) == list(range(len(hostile)))
    for field, offset in [("group_size", 0), ("sampling.temperature", 1), ("sampling.top_p", 2),
                          ("sampling.max_tokens", 3), ("max_turns", 4), ("prompt", 5),
                          ("task_id", 6)]:
        assert reasons[offset].startswith("invalid: task ") and f"field '{field}'" in reasons[
            offset], reasons[offset]
    assert len(reasons[6]) < 500  # the 2 MiB id is named, not repeated
    episodes = read_all(settings, settings.topics.episodes, 4)
    assert sorted(m.key() for m in episodes) == [b"good#0", b"good#1"]


@pytest.mark.parametrize(("change", "field"), [
    ({"max_turns": 0}, "max_turns"),
    ({"sampling": _sampling(top_p=math.inf)}, "sampling.top_p"),
    ({"sampling": _sampling(temperature=math.nan)}, "sampling.temperature"),
])
def test_run_refuses_episodes_written_straight_to_its_input(change: dict, field: str) -> None:
    task = {**validate_task(_task("t", group_size=2)), **change}
    episode = {"episode_id": "t#0", "task": task, "sample_index": 0, "created_at_ms": 0}
    stage = RunStage(Settings())
    with pytest.raises(InvalidEvent, match=f"episode 't#0': field '{field}'"):
        asyncio.run(stage.handle(episode, EventContext(0, 0, lambda out: None)))


def test_run_refuses_a_sample_index_outside_the_group() -> None:
    task = validate_task(_task("t", group_size=2))
    episode = {"episode_id": "t#5", "task": task, "sample_index": 5, "created_at_ms": 0}
    with pytest.raises(InvalidEvent, match="field 'sample_index'"):
        asyncio.run(RunStage(Settings()).handle(episode, EventContext(0, 0, lambda out: None)))

