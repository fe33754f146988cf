"""`replay`: re-read a range of a topic, filter it, copy it to another topic or print it as JSON."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource

from producers.publish import validate_task
from producers.replay import replay
from rollstream.cli import main
from rollstream.cluster import kafka
from rollstream.cluster.kafka import process_id, producer, read_partitions, retrying
from rollstream.cluster.topics import MAX_MESSAGE_BYTES
from rollstream.config import Settings
from rollstream.contracts.codec import codec, pack_ids, pack_logprobs

PARTITIONS = 4  # the `topics` fixture's


def _turn(index: int, version: int) -> dict:
    return {
        "index": index, "prompt_ids": pack_ids([1, 2, 3 + index]),
        "completion_ids": pack_ids([100 + index, 7, 2**31 - 1]),
        "logprobs": pack_logprobs([-0.5, -0.25, 0.0]), "policy_version": version,
        "finish_reason": "stop", "started_at_ms": 1, "inference_ms": 2.0,
    }


def _scored(episode_id: str, env: str, failure_class: str, versions: list[int]) -> dict:
    task = validate_task({"task_id": episode_id.split("#")[0], "env": env, "prompt": "p"})
    trajectory = {
        "episode_id": episode_id, "task": task, "sample_index": 0,
        "turns": [_turn(i, v) for i, v in enumerate(versions)],
        "termination": "DONE", "started_at_ms": 1,
    }
    return {"trajectory": trajectory, "reward": 1.0 if failure_class == "ok" else None,
            "failure_class": failure_class, "scored_at_ms": 2}


# episode id -> (env, failure class, policy version of each turn)
SCORED = {
    "a#0": ("arithmetic", "ok", [1]),
    "a#1": ("arithmetic", "infra", [1]),
    "b#0": ("guess_number", "ok", [1, 2]),
    "b#1": ("guess_number", "agent", [2, 2]),
    "c#0": ("guess_number", "ok", [3]),
    "d#0": ("arithmetic", "ok", [2, 3]),
}
GARBAGE = b"not an avro event"


def _send(settings: Settings, topic: str, events: list[tuple[str, bytes]], *,
          partition: int | None = None, timestamps: list[int] | None = None,
          commit: bool = True) -> None:
    """Write events in one transaction (aborted if not `commit`)."""
    p = producer(settings, process_id(settings, "test-writer"))
    p.init_transactions(30)
    p.begin_transaction()
    last: dict[int, TopicPartition] = {}  # each partition's last record written

    def written(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        last[msg.partition()] = TopicPartition(topic, msg.partition(), msg.offset())

    for i, (key, value) in enumerate(events):
        extra = {"partition": partition} if partition is not None else {}
        if timestamps:
            extra["timestamp"] = timestamps[i]
        p.produce(topic, value, key=key, on_delivery=written, **extra)
    p.flush(30)
    sent = list(last.values())
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)
    # The commit returns before its markers are on the partitions (on a busy broker, a while
    # before): until then a committed reader, replay's lookups by time among them, sees nothing.
    reader = kafka.reader(settings, [])
    try:
        for tp in sent:
            deadline = time.monotonic() + 30
            while kafka.watermarks(reader, tp)[1] <= tp.offset:
                assert time.monotonic() < deadline, f"{tp} not stable after 30 s"
                time.sleep(0.1)
    finally:
        reader.close()


@pytest.fixture
def scored(settings: Settings) -> dict[str, bytes]:
    """The SCORED events, plus one undecodable event, on <p>.scored; returns key -> bytes."""
    values = {eid: codec().encode("ScoredTrajectory", _scored(eid, *spec))
              for eid, spec in SCORED.items()}
    _send(settings, settings.topics.scored, [*values.items(), ("junk", GARBAGE)])
    return values


def _all(settings: Settings, topic: str, partitions: int = PARTITIONS) -> list:
    tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
    return list(read_partitions(settings, tps, timeout_s=30))


def _json(settings: Settings, topic: str, **kwargs: object) -> list[dict]:
    out = io.StringIO()
    count = replay(settings, topic, out=out, **kwargs)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert count == len(lines)
    return lines


def _keys(events: list[dict]) -> list[str]:
    return sorted(e["key"] for e in events)


def test_replay_into_new_topic_copies_keys_and_bytes(
    settings: Settings, scored: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"{settings.prefix}.copy"
    assert replay(settings, settings.topics.scored, to_topic=target) == len(SCORED)
    assert "skipped 1 undecodable event" in capsys.readouterr().err

    source = {(m.key(), m.value()): m.partition() for m in _all(settings, settings.topics.scored)}
    copied = _all(settings, target)
    assert {(m.key(), m.value()) for m in copied} == {(k.encode(), v) for k, v in scored.items()}
    # Created like the source, and each event stays in its partition (per-key order kept).
    admin = AdminClient(settings.kafka())
    meta = admin.list_topics(target, timeout=10).topics[target]
    assert len(meta.partitions) == PARTITIONS
    assert all(source[(m.key(), m.value())] == m.partition() for m in copied)
    # The copy carries the source's own configs (large trajectories must still fit).
    resource = ConfigResource("topic", target)
    config = admin.describe_configs([resource])[resource].result(10)
    assert config["max.message.bytes"].value == str(MAX_MESSAGE_BYTES)
    assert config["compression.type"].value == "zstd"
    with pytest.raises(ValueError, match="into itself"):
        replay(settings, target, to_topic=target)


def test_replay_skips_aborted_transactions(settings: Settings, scored: dict[str, bytes]) -> None:
    aborted = codec().encode("ScoredTrajectory", _scored("z#0", "arithmetic", "ok", [1]))
    _send(settings, settings.topics.scored, [("z#0", aborted)], commit=False)
    assert _keys(_json(settings, settings.topics.scored)) == sorted(SCORED)


def test_json_output_decodes_token_ids(settings: Settings, scored: dict[str, bytes]) -> None:
    events = {e["key"]: e for e in _json(settings, settings.topics.scored)}
    event = events["b#0"]
    assert event["type"] == "ScoredTrajectory" and event["topic"] == settings.topics.scored
    turns = event["value"]["trajectory"]["turns"]
    assert [t["completion_ids"] for t in turns] == [[100, 7, 2**31 - 1], [101, 7, 2**31 - 1]]
    assert turns[1]["prompt_ids"] == [1, 2, 4]
    assert turns[0]["logprobs"] == [-0.5, -0.25, 0.0]
    assert event["value"]["failure_class"] == "ok" and event["value"]["reward"] == 1.0


def test_where_filters(settings: Settings, scored: dict[str, bytes]) -> None:
    topic = settings.topics.scored
    assert _keys(_json(settings, topic, where=["trajectory.task.env=guess_number"])) == [
        "b#0", "b#1", "c#0"]
    assert _keys(_json(settings, topic, where=["failure_class=ok",
                                               "trajectory.task.env=arithmetic"])) == ["a#0", "d#0"]
    # Lists fan out unless indexed; non-string values compare as their JSON text.
    assert _keys(_json(settings, topic, where=["trajectory.turns.policy_version=3"])) == [
        "c#0", "d#0"]
    assert _keys(_json(settings, topic, where=["trajectory.turns.0.policy_version=2"])) == [
        "b#1", "d#0"]
    assert _keys(_json(settings, topic, where=["reward=null"])) == ["a#1", "b#1"]
    assert _json(settings, topic, where=["no.such.field=x"]) == []
    with pytest.raises(ValueError, match="path=value"):
        replay(settings, topic, where=["failure_class"])


def test_policy_version_filter(settings: Settings, scored: dict[str, bytes]) -> None:
    topic = settings.topics.scored
    assert _keys(_json(settings, topic, policy_version=2)) == ["b#0", "b#1", "d#0"]
    assert _keys(_json(settings, topic, policy_version=2, where=["failure_class=ok"])) == [
        "b#0", "d#0"]
    assert _json(settings, topic, policy_version=9) == []

    version = {"version": 2, "uri": "/ckpt/2", "created_at_ms": 1}
    other = {**version, "version": 3, "uri": "/ckpt/3"}
    _send(settings, settings.topics.policy, [
        ("2", codec().encode("PolicyVersion", version)),
        ("3", codec().encode("PolicyVersion", other)),
        ("task", codec().encode("Task", validate_task({"task_id": "t", "env": "arithmetic",
                                                        "prompt": "p"}))),
    ])
    events = _json(settings, settings.topics.policy, policy_version=2)
    assert [(e["type"], e["value"]["uri"]) for e in events] == [("PolicyVersion", "/ckpt/2")]


def test_offset_bounds(settings: Settings) -> None:
    topic = settings.topics.scored
    events = [(f"e#{i}", codec().encode("ScoredTrajectory", _scored(f"e#{i}", "arithmetic",
                                                                    "ok", [1])))
              for i in range(6)]
    # A transaction takes an offset for its commit marker: offsets 0-5 data, 6 the marker.
    _send(settings, topic, events, partition=2)
    _send(settings, topic, events[:1], partition=1)
    window = _json(settings, topic, start_offset=2, end_offset=4)
    assert [(e["partition"], e["offset"], e["key"]) for e in window] == [
        (2, 2, "e#2"), (2, 3, "e#3")]
    # Bounds apply to every partition: partition 1 has only offset 0.
    assert sorted((e["partition"], e["offset"]) for e in _json(settings, topic, end_offset=1)) == [
        (1, 0), (2, 0)]
    assert [e["offset"] for e in _json(settings, topic, start_offset=4)] == [4, 5]
    assert _json(settings, topic, start_offset=100) == []
    assert [e["offset"] for e in _json(settings, topic, start_offset=1, limit=3)] == [1, 2, 3]


def test_time_bounds(settings: Settings) -> None:
    topic = settings.topics.scored
    # Recent timestamps: older ones would be removed by the topic's retention.
    base = int(time.time() * 1000) - 60_000
    stamps = [base + i * 1000 for i in range(5)]
    events = [(f"e#{i}", codec().encode("ScoredTrajectory", _scored(f"e#{i}", "arithmetic",
                                                                    "ok", [1])))
              for i in range(5)]
    _send(settings, topic, events, partition=0, timestamps=stamps)
    window = _json(settings, topic, start_time_ms=stamps[1], end_time_ms=stamps[3])
    assert [(e["key"], e["timestamp_ms"]) for e in window] == [("e#1", stamps[1]),
                                                               ("e#2", stamps[2])]
    # Between two events: starts at the next one; past the last: nothing.
    assert _keys(_json(settings, topic, start_time_ms=stamps[3] - 1)) == ["e#3", "e#4"]
    assert _json(settings, topic, start_time_ms=stamps[4] + 1) == []
    # Time and offset bounds together: the narrower one wins.
    assert _keys(_json(settings, topic, start_time_ms=stamps[1], end_offset=2)) == ["e#1"]


def _raising(exc: Exception) -> Callable[[], None]:
    def call() -> None:
        raise exc
    return call


def test_lookups_are_made_again_while_a_leader_moves() -> None:
    # What `offsets_for_times` raised in a CI run when the broker was busy: the client sets no
    # retriable flag on it, so the code itself must be known as transient.
    answers: list[Exception | str] = [
        KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)),
        KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)), "offsets"]

    def lookup() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retrying(lookup) == "offsets" and answers == []
    # Not transient: raised at once.
    denied = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException) as raised:
        retrying(_raising(denied))
    assert raised.value is denied
    # Transient for longer than the caller allows: the last error, after about the deadline.
    start = time.monotonic()
    with pytest.raises(KafkaException, match="NOT_LEADER"):
        retrying(_raising(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))),
                 timeout_s=1.0)
    assert time.monotonic() - start >= 1.0

def test_cli_replay_resolves_topic_suffix(
    settings: Settings, scored: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    assert main(["replay", "--topic", "scored", "--where", "failure_class=infra", *common]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [(e["key"], e["topic"]) for e in lines] == [("a#1", settings.topics.scored)]
    assert "replayed 1 events" in captured.err
    assert "warning" not in captured.err

    # A misspelt path matches nothing: said, with the fields the events have.
    assert main(["replay", "--topic", "scored", "--where", "failure_clas=ok", *common]) == 0
    err = capsys.readouterr().err
    assert (f"no event read from {settings.topics.scored} has the field 'failure_clas' that "
            "--where names (the events' fields: failure_class, ") in err

    assert main(["replay", "--topic", "nope", *common]) == 2
    assert f"no topic 'nope' (nor {settings.prefix}.nope)" in capsys.readouterr().err

    target = f"{settings.prefix}.cli-copy"
    assert main(["replay", "--topic", "scored", "--from-time", "2000-01-01T00:00:00Z",
                 "--to-topic", target, *common]) == 0
    assert sorted(m.key().decode() for m in _all(settings, target)) == sorted(SCORED)
