"""`publish`: validate a whole task file first, then send it all in one transaction."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from producers.publish import TaskFileError, load_tasks, publish, validate_task
from rollstream.cli import main
from rollstream.cluster.kafka import read_partitions
from rollstream.config import Settings
from rollstream.contracts.codec import codec

PARTITIONS = 4  # the `topics` fixture's
# What a just-created topic answers until its partitions have leaders everywhere.
NOT_READY = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._UNKNOWN_PARTITION}


def _task(i: int, **fields: object) -> dict:
    return {"task_id": f"t-{i:03d}", "env": "arithmetic", "prompt": f"What is {i}+1?",
            "data": {"answer": str(i + 1)}, **fields}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _committed(settings: Settings, topic: str) -> list[Message]:
    tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
    return list(read_partitions(settings, tps, timeout_s=30))


def _end_offsets(settings: Settings, topic: str) -> list[int]:
    c = Consumer({**settings.kafka(), "group.id": "test-end-offsets"})
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                        for p in range(PARTITIONS)]
            except KafkaException as exc:
                if exc.args[0].code() not in NOT_READY or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        c.close()


def _cli(settings: Settings, *args: str) -> int:
    return main([*args, "--bootstrap-servers", settings.bootstrap_servers,
                 "--prefix", settings.prefix])


GOOD = [json.dumps(_task(0)), json.dumps(_task(1))]
BAD_LINES = [
    (json.dumps(_task(2, group_size="four")), "field 'group_size': expected int, got \"four\""),
    (json.dumps({"task_id": "t-002", "env": "arithmetic"}), "field 'prompt': missing"),
    ('{"task_id": "t-002", "env": "arithmetic",', "invalid JSON"),
    (json.dumps(_task(2, env="no_such_env")), "field 'env': unknown environment 'no_such_env'"),
    (json.dumps(_task(2, sampling={"temperature": "hot"})),
     "field 'sampling.temperature': expected double"),
    (json.dumps(_task(2, data="not json")), "field 'data'"),
    (json.dumps(_task(2, group_sise=2)), "unknown field 'group_sise'"),
    (json.dumps(_task(0)), "field 'task_id': duplicate 't-000'"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_LINES)
def test_bad_line_names_line_and_field_and_sends_nothing(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, message: str
) -> None:
    # The bad line comes after good ones: they must not be sent either.
    path = _write(tmp_path / "tasks.jsonl", [*GOOD, "", bad, json.dumps(_task(3))])
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    assert str(info.value).startswith(f"{path}:4: ")
    assert message in str(info.value)

    assert _cli(settings, "publish", str(path)) == 2
    assert f"tasks.jsonl:4: {message}" in capsys.readouterr().err
    assert _end_offsets(settings, settings.topics.tasks) == [0] * PARTITIONS


def test_unknown_env_error_lists_known_envs(tmp_path: Path) -> None:
    path = _write(tmp_path / "tasks.jsonl", [json.dumps(_task(0, env="nope"))])
    with pytest.raises(TaskFileError, match="known: .*arithmetic"):
        load_tasks(path)


def test_unknown_format_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path / "tasks.jsonl", GOOD)
    with pytest.raises(TaskFileError, match="unknown task format 'swe_bench'; known: rollstream"):
        load_tasks(path, "swe_bench")


def test_defaults_are_filled_and_data_normalized() -> None:
    task = validate_task({"task_id": "a", "env": "arithmetic", "prompt": "p",
                          "data": '{"answer": "2"}', "sampling": {"temperature": 0.5}})
    assert task["data"] == '{"answer": "2"}'  # a string holding JSON is kept as it is
    assert task["group_size"] == 4 and task["max_turns"] == 4 and task["created_at_ms"] == 0
    assert task["sampling"] == {"temperature": 0.5, "top_p": 1.0, "top_k": -1,
                                "max_tokens": 64, "seed": None}
    assert json.loads(validate_task(_task(5))["data"]) == {"answer": "6"}
    # Defaults are copies: changing one task must not change the schema or the next task.
    task["sampling"]["top_k"] = 7
    assert validate_task({"task_id": "b", "env": "arithmetic", "prompt": "p"})["sampling"][
        "top_k"] == -1


def test_publish_sends_each_task_once_keyed_by_task_id(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 25
    lines = [json.dumps(_task(i)) for i in range(n - 1)]
    lines.append(json.dumps(_task(n - 1, created_at_ms=1234, metadata={"run": "x"})))
    path = _write(tmp_path / "tasks.jsonl", lines)
    before_ms = int(time.time() * 1000)

    assert _cli(settings, "publish", str(path)) == 0
    assert capsys.readouterr().out.strip() == f"sent {n} tasks to {settings.topics.tasks}"

    msgs = _committed(settings, settings.topics.tasks)
    assert len(msgs) == n
    tasks = {m.key().decode(): codec().decode_as("Task", m.value()) for m in msgs}
    assert sorted(tasks) == [f"t-{i:03d}" for i in range(n)]
    assert all(key == t["task_id"] for key, t in tasks.items())
    assert len({m.partition() for m in msgs}) > 1  # keyed, so spread over partitions
    assert json.loads(tasks["t-007"]["data"]) == {"answer": "8"}
    assert tasks["t-007"]["created_at_ms"] >= before_ms  # stamped at publish time
    last = tasks[f"t-{n - 1:03d}"]
    assert last["created_at_ms"] == 1234 and last["metadata"] == {"run": "x"}


def test_dry_run_validates_without_sending(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "tasks.jsonl", GOOD)
    assert _cli(settings, "publish", str(path), "--dry-run") == 0
    assert "2 tasks valid" in capsys.readouterr().out
    assert _end_offsets(settings, settings.topics.tasks) == [0] * PARTITIONS


def test_publish_waits_out_a_coordinator_that_is_not_ready(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a broker just started answered a CI run's first publish: NOT_COORDINATOR from
    init_transactions, raised by the client. The real producer answers it once here (as the
    broker did), then does its work."""
    answered: list[str] = []

    class NotReadyAtFirst(Producer):
        def init_transactions(self, *args: object) -> None:
            if not answered:
                answered.append("NOT_COORDINATOR")
                raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))
            super().init_transactions(*args)

    # What producer() makes.
    monkeypatch.setattr("rollstream.cluster.kafka.Producer", NotReadyAtFirst)
    assert publish(settings, [validate_task(_task(i)) for i in range(3)]) == 3
    assert answered == ["NOT_COORDINATOR"]
    assert len(_committed(settings, settings.topics.tasks)) == 3


def test_publish_is_all_or_nothing(settings: Settings) -> None:
    # The last task is larger than the tasks topic accepts (max.message.bytes 4 MiB): the
    # broker rejects it, so the transaction aborts and none of the others may be visible.
    # (validate_task refuses such a prompt; publish() must still be all-or-nothing without it.)
    huge = base64.b64encode(os.urandom(5 * 1024 * 1024)).decode()
    tasks = [validate_task(_task(i)) for i in range(5)]
    tasks.append({**validate_task(_task(5)), "prompt": huge})
    with pytest.raises(Exception, match="(?i)too large|MSG_SIZE"):
        publish(settings, tasks)
    assert _committed(settings, settings.topics.tasks) == []
    # The producer was not left holding the partitions: a good batch still goes through.
    assert publish(settings, tasks[:5]) == 5
    assert len(_committed(settings, settings.topics.tasks)) == 5


def test_task_data_is_checked_by_its_environment(tmp_path: Path) -> None:
    """What INIT would dead-letter is refused before anything is sent: an arithmetic task
    without its `answer`."""
    path = _write(tmp_path / "tasks.jsonl", [json.dumps(_task(0, data={}))])
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:1: env 'arithmetic': .*answer"):
        load_tasks(path)


def test_republished_ids_that_init_handled_are_named(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from producers.publish import already_handled
    from rollstream.cluster.kafka import transaction, transactional_producer

    path = _write(tmp_path / "tasks.jsonl", GOOD)
    assert _cli(settings, "publish", str(path)) == 0
    assert "already handled" not in capsys.readouterr().err
    # INIT's marker for t-001, as it writes it (key init/<task id>, on the task's partition).
    p = transactional_producer(settings, f"{settings.prefix}.test-seen")
    with transaction(p):
        p.produce(settings.topics.seen, b"", key=b"init/t-001")
    assert already_handled(settings, ["t-000", "t-001"]) == ["t-001"]
    assert _cli(settings, "publish", str(path)) == 0
    err = capsys.readouterr().err
    assert "INIT has already handled 1 of these task ids (t-001)" in err


def test_ctrl_c_while_publishing_says_nothing_was_sent(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import producers.publish as publishing

    sent = []

    def interrupted_after_one(*args: object, **kwargs: object) -> None:
        if sent:  # Ctrl-C while sending the second task, inside the transaction
            raise KeyboardInterrupt
        sent.append(publishing.produce_real(*args, **kwargs))

    monkeypatch.setattr(publishing, "produce_real", publishing.produce, raising=False)
    monkeypatch.setattr(publishing, "produce", interrupted_after_one)
    path = _write(tmp_path / "tasks.jsonl", GOOD)
    assert _cli(settings, "publish", str(path)) == 130
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == ["interrupted: nothing was sent"]
    assert _committed(settings, settings.topics.tasks) == []
