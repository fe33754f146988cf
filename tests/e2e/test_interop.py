"""Acceptance: a short pipeline run (INIT, RUN, EVAL, trainer) read and fed by other Avro
implementations using only the .avsc files and the single-object encoding spec: Apache's Python
library (tests/helpers/avro_reference.py) and the Java example (examples/java, Apache Avro's
BinaryMessageDecoder/Encoder and the Java Kafka client)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from producers.publish import publish, validate_task
from rollstream.cli import main as cli
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec, pack_ids, pack_logprobs
from rollstream.dev.processes import ProcessGroup
from rollstream.envs.registry import get_env
from tests.helpers.avro_reference import Reference

JAVA_DIR = Path(__file__).resolve().parents[2] / "examples" / "java"
BUILD_JAVA = JAVA_DIR.parents[1] / "scripts" / "java-example.sh"
LEGACY = Path(__file__).parents[1] / "fixtures" / "legacy_events.json"
JAVA_TASKS = 2
GROUP = 2
# Topic (a Topics attribute) -> the record every non-null value on it must be.
RECORDS = {"tasks": "Task", "episodes": "Episode", "episode_state": "TurnCheckpoint",
           "trajectories": "Trajectory", "scored": "ScoredTrajectory",
           "policy": "PolicyVersion", "dlq": "DeadLetter"}


def build_java(log: Path) -> str | None:
    """The example's classpath, built by `make deps` (scripts/java-example.sh) and again here
    when a source changed since; None when this machine has no JDK or Maven."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        return None
    target = JAVA_DIR / "target"
    built = target / "classpath.txt"
    sources = [JAVA_DIR / "pom.xml", *JAVA_DIR.glob("src/**/*.java")]
    # Maven takes tens of seconds even with nothing to do: build only what changed.
    if not built.exists() or max(p.stat().st_mtime for p in sources) > built.stat().st_mtime:
        done = subprocess.run([str(BUILD_JAVA), str(log)], timeout=300)
        assert done.returncode == 0, f"the Java example did not build; see {log}"
    return f"{target / 'classes'}:{built.read_text().strip()}"


def java(classpath: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["java", "-cp", classpath, "dev.rollstream.example.Main", *args],
                          capture_output=True, text=True, timeout=120)


def tasks() -> list[dict]:
    out = []
    for i in range(4):
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 6, "seed": i}
        out.append({"task_id": f"a{i}", "env": "arithmetic", "prompt": f"{i}+2=",
                    "data": {"answer": str(i + 2)}, "max_turns": 1, "group_size": GROUP,
                    "sampling": sampling})
        out.append({"task_id": f"g{i}", "env": "guess_number", "prompt": "Guess 0-9.",
                    "data": {"secret": 9 - i, "low": 0, "high": 9}, "max_turns": 3,
                    "group_size": GROUP, "sampling": sampling})
    return [validate_task(t) for t in out]


def reference_inputs() -> dict[str, tuple[str, str, dict]]:
    """A Task, an Episode and a finished Trajectory as another client would write them."""
    task = validate_task({"task_id": "ref-a", "env": "arithmetic", "prompt": "3+4=",
                          "data": {"answer": "7"}, "group_size": GROUP})
    lone = validate_task({"task_id": "ref-e", "env": "arithmetic", "prompt": "1+1=",
                          "data": {"answer": "2"}, "group_size": 1})
    played = validate_task({"task_id": "ref-t", "env": "arithmetic", "prompt": "5+5=",
                            "data": {"answer": "10"}, "group_size": 1})
    turn = {"index": 0, "prompt_ids": pack_ids([53, 43, 53, 61]),
            "completion_ids": pack_ids([49, 48]), "logprobs": pack_logprobs([-0.5, -0.25]),
            "policy_version": 0, "finish_reason": "stop", "completion_text": "10",
            "tool_call": None, "observation": None, "server": "elsewhere", "started_at_ms": 1,
            "inference_ms": 2.0, "env_ms": 0.0, "new_sample": False}
    trajectory = {"episode_id": "ref-t#0", "task": played, "sample_index": 0, "turns": [turn],
                  "termination": "DONE", "termination_detail": "", "env_state": "{}",
                  "started_at_ms": 1, "finished_at_ms": 2, "attempt": 0}
    return {
        "tasks": ("Task", "ref-a", task),
        "episodes": ("Episode", "ref-e#0", {"episode_id": "ref-e#0", "task": lone,
                                            "sample_index": 0, "created_at_ms": 1,
                                            "attempt": 0}),
        "trajectories": ("Trajectory", "ref-t#0", trajectory),
    }


@dataclass
class Run:
    settings: Settings
    expected: set[str]
    java_classpath: str | None
    schemas: Path
    trajectory: dict = field(default_factory=dict)

    def read(self, topic: str) -> list:
        admin = AdminClient(self.settings.kafka())
        parts = admin.list_topics(topic, timeout=30).topics[topic].partitions  # policy has 1
        return list(kafka.read_partitions(self.settings, [
            TopicPartition(topic, p, 0) for p in parts]))


@pytest.fixture(scope="module")
def run(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("interop")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, prefix, partitions=4)
    settings = load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)
    procs = ProcessGroup(tmp / "logs")
    try:
        assert cli(["schemas", "export", str(tmp / "schemas")]) == 0
        common = ["--bootstrap-servers", bootstrap, "--prefix", prefix]
        # The server loads while every input is written; the stages start once it answers.
        policy = procs.start_policy()
        url = policy.url
        ours = tasks()
        expected = {f"{t['task_id']}#{i}" for t in ours for i in range(GROUP)}
        publish(settings, ours)
        ref = Reference()
        producer = kafka.producer(settings)
        inputs = reference_inputs()
        for topic, (record, key, value) in inputs.items():
            kafka.produce(producer, getattr(settings.topics, topic), ref.encode(record, value),
                          key=key)
        expected |= {"ref-a#0", "ref-a#1", "ref-e#0", "ref-t#0"}
        # A valid Task with one byte more: dead-lettered, not played.
        bad = codec().encode("Task", {**inputs["tasks"][2], "task_id": "trailing"}) + b"\x00"
        kafka.produce(producer, settings.topics.tasks, bad, key="trailing")
        producer.flush(30)
        classpath = build_java(tmp / "mvn.log")
        if classpath is not None:
            done = java(classpath, "produce", bootstrap, prefix, str(tmp / "schemas"),
                        str(JAVA_TASKS))
            assert done.returncode == 0, done.stderr
            expected |= {f"java-{t}#{i}" for t in range(JAVA_TASKS) for i in range(GROUP)}

        policy.ready()
        for stage in ("init", "run", "eval"):
            procs.start(stage, "stage", stage, *common, "--commit-interval-ms", "100",
                        *(["--policy-url", url] if stage == "run" else []))
        procs.start("train", "train", *common, "--checkpoint-dir", str(tmp / "ckpt"),
                    "--groups-per-batch", "2", "--keep-zero-variance")

        r = Run(settings, expected, classpath, tmp / "schemas", inputs["trajectories"][2])
        deadline = time.monotonic() + 180
        started = time.monotonic()
        while True:
            procs.check_alive()
            scored = {m.key().decode() for m in r.read(settings.topics.scored)}
            if scored >= expected and r.read(settings.topics.policy):
                print(f"scored and trained in {time.monotonic() - started:.0f} s")
                break
            assert time.monotonic() < deadline, f"not scored: {sorted(expected - scored)}"
            time.sleep(1.0)
        # Old logs: scored events as earlier releases wrote them (legacy and retired writers).
        for event in json.loads(LEGACY.read_text())["events"]:
            if event["record"] == "ScoredTrajectory":
                kafka.produce(producer, settings.topics.scored, base64.b64decode(event["base64"]),
                              key="legacy-1#1")
        producer.flush(30)
        yield r
    finally:
        procs.stop_all()
        delete_topics(bootstrap, prefix)


@pytest.mark.slow
def test_every_record_on_every_topic_decodes_with_apache_avro(run: Run) -> None:
    ref = Reference()
    for topic, record in RECORDS.items():
        messages = run.read(getattr(run.settings.topics, topic))
        # Every value but the deliberately malformed one (it is checked in the DLQ below).
        values = [m for m in messages if m.value() is not None
                  and not (topic == "tasks" and m.key() == b"trailing")]
        assert values, f"nothing on {topic}"
        if any(m.value() is None for m in messages):
            assert topic == "episode_state"  # only RUN's checkpoint tombstones are null
        for m in values:
            name, value = ref.decode(m.value())
            assert name == record, (topic, name)
            assert value == codec().decode_as(record, m.value())  # the same values as ours
            assert dict(m.headers())["rollstream.record"] == f"rollstream.{record}".encode()
    letters = [ref.decode(m.value())[1] for m in run.read(run.settings.topics.dlq)]
    assert any("trailing bytes" in dl["reason"] and dl["stage"] == "init" for dl in letters)


@pytest.mark.slow
def test_events_written_by_apache_avro_are_processed_like_ours(run: Run) -> None:
    scored = {m.key().decode(): codec().decode_as("ScoredTrajectory", m.value())
              for m in run.read(run.settings.topics.scored)}
    assert {"ref-a#0", "ref-a#1", "ref-e#0", "ref-t#0"} <= set(scored)
    # The reference library's Trajectory is scored as the environment itself scores it.
    score = asyncio.run(get_env("arithmetic").evaluate(run.trajectory["task"], run.trajectory))
    assert (scored["ref-t#0"]["reward"], scored["ref-t#0"]["failure_class"]) == (
        score.reward, score.failure_class) == (1.0, "ok")
    # Its Task and Episode were played like ours: real turns from the policy server.
    for episode in ("ref-a#0", "ref-e#0"):
        turns = scored[episode]["trajectory"]["turns"]
        assert turns and turns[0]["server"] and scored[episode]["failure_class"] != "infra"


@pytest.mark.slow
def test_the_java_example_decodes_every_scored_record(run: Run) -> None:
    if run.java_classpath is None:
        pytest.skip("needs a JDK and Maven; the Apache Avro Python test above reads the topics")
    total = len(run.read(run.settings.topics.scored))
    done = java(run.java_classpath, "consume", run.settings.bootstrap_servers,
                run.settings.prefix, str(run.schemas), str(total), "60")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == f"DECODED {total} FAILED 0"
    decoded = {line.split()[1] for line in lines if line.startswith("SCORED ")}
    # Every episode, the Java-published tasks' and the old releases' events included.
    assert decoded == run.expected | {"legacy-1#1"}
