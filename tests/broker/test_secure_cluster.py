"""The pipeline on a secured cluster (`rollstream broker start --secure`: SASL_SSL, SCRAM-SHA-512,
the StandardAuthorizer denying what no ACL allows), run as a principal holding only the
documented prefix ACLs (`rollstream acl grant`); refusals and bad credentials as one line each;
no secret in any output. The other ways in (SCRAM-SHA-256, PLAIN, a client certificate) and the
secured 3-node cluster each publish and read back as such a principal.

Every broker here runs in a home of its own (a temporary folder), started fresh and stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from producers.publish import validate_task
from rollstream import config
from rollstream.broker import cluster, local, secure
from rollstream.broker.secure import Material
from rollstream.cluster.kafka import read_partitions
from rollstream.cluster.kafka_errors import EX_CONFIG, EX_NOPERM
from rollstream.cluster.security import faust_credentials
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.dev.processes import ProcessGroup, free_port
from tests.helpers.secure_helpers import cli, one_line_error, own_home, principal

TASKS, GROUP = 4, 2


def tasks_file(path: Path) -> Path:
    lines = [json.dumps(validate_task({
        "task_id": f"s{i}", "env": "arithmetic", "prompt": f"{i}+2=",
        "data": {"answer": str(i + 2)}, "max_turns": 1, "group_size": GROUP,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4,
                     "seed": i}})) for i in range(TASKS)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)  # its own deadlines (240 s to score, 180 s to count) come first
def test_pipeline_runs_as_a_least_privilege_principal(secured: tuple[str, Material],
                                                      tmp_path: Path) -> None:
    bootstrap, material = secured
    prefix = f"sec{uuid.uuid4().hex[:6]}"
    props, password = principal(bootstrap, material, tmp_path, prefix, "owner")
    kafka = ["--kafka-config", str(props), "--prefix", prefix]
    outputs: list[str] = []

    def ok(*args: str) -> subprocess.CompletedProcess[str]:
        proc = cli(*args, *kafka)
        outputs.extend((proc.stdout, proc.stderr))
        assert proc.returncode == 0, proc.stderr
        return proc

    ok("topics", "create", "--partitions", "2")
    procs = ProcessGroup(tmp_path / "logs")
    try:
        policy = procs.start_policy()
        url = policy.url
        for stage in ("init", "run", "eval"):
            procs.start(stage, "stage", stage, *kafka, "--commit-interval-ms", "100",
                        *(["--policy-url", url] if stage == "run" else []))
        procs.start("controller", "controller", *kafka, "--policy-url", url)
        procs.start("train", "train", *kafka, "--checkpoint-dir", str(tmp_path / "ckpt"),
                    "--groups-per-batch", "2", "--keep-zero-variance")
        policy.ready()
        ok("publish", str(tasks_file(tmp_path / "tasks.jsonl")))
        settings = config.load(None, kafka_config=str(props), prefix=prefix, partitions=2)
        expected = {f"s{i}#{j}" for i in range(TASKS) for j in range(GROUP)}
        # Waited for in this process, as the principal (a command per look cost a process
        # start each); then read with the command.
        scored_topic = [TopicPartition(settings.topics.scored, p, 0) for p in range(2)]
        deadline = time.monotonic() + 240
        while ({m.key().decode() for m in read_partitions(settings, scored_topic)} < expected
               and time.monotonic() < deadline):
            procs.check_alive()
            time.sleep(1)
        keys = [s["key"] for s in json_lines(ok("replay", "--topic", "scored").stdout)]
        assert sorted(keys) == sorted(expected)  # every episode scored once
        status = json.loads(ok("status", "--json", "--interval", "0.5").stdout)
        assert {s["stage"] for s in status["stages"]} >= {"init", "run", "eval"}
        ok("dlq", "list")
        ok("dlq", "redrive", "--all")
        copy = f"{prefix}.scored-copy"
        ok("replay", "--topic", "scored", "--to-topic", copy)
        assert settings.bootstrap_servers == bootstrap
        # stats, on faust's own client with the same properties mapped: its count is exact.
        port = free_port()
        procs.start("stats", "stats", *kafka, "--web-port", str(port),
                    "--datadir", str(tmp_path / "stats"))
        deadline = time.monotonic() + 180
        while (counted := stats_episodes(port)) != len(expected):
            procs.check_alive()
            assert time.monotonic() < deadline, f"stats counted {counted} of {len(expected)}"
            time.sleep(1)
    finally:
        procs.stop_all()
        for log in (tmp_path / "logs").glob("*.log"):
            outputs.append(log.read_text(errors="replace"))
        delete_topics(material.admin_conf(bootstrap), prefix)
    leaked = [text for text in outputs if password in text or material.admin_password() in text]
    assert not leaked, "a password was printed"
    # The stages do print their client properties, with the secret replaced.
    assert any("'sasl.password': '[redacted]'" in text for text in outputs)


def stats_episodes(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as answer:
            return json.loads(answer.read()).get("total", {}).get("episodes")
    except OSError:
        return None


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_another_prefix_is_refused_with_the_resource_named(secured: tuple[str, Material],
                                                          tmp_path: Path) -> None:
    bootstrap, material = secured
    mine, theirs = f"own{uuid.uuid4().hex[:6]}", f"oth{uuid.uuid4().hex[:6]}"
    admin_props = tmp_path / "admin.properties"
    admin_props.write_text("".join(f"{k}={v}\n" for k, v in
                                   material.admin_conf(bootstrap).items()))
    assert cli("topics", "create", "--kafka-config", str(admin_props), "--prefix", theirs,
               "--partitions", "1").returncode == 0
    props, _ = principal(bootstrap, material, tmp_path, mine, "stage")
    try:
        for args in (["publish", str(tasks_file(tmp_path / "t.jsonl"))],
                     ["replay", "--topic", "scored"], ["topics", "create"]):
            proc = cli(*args, "--kafka-config", str(props), "--prefix", theirs)
            line = one_line_error(proc)
            assert proc.returncode == EX_NOPERM and "not authorized" in line, line
            assert theirs in line, line  # the refused resource is named
    finally:
        delete_topics(material.admin_conf(bootstrap), theirs)


def test_wrong_password_and_wrong_ca_are_one_line_within_the_timeout(
        secured: tuple[str, Material], tmp_path: Path) -> None:
    bootstrap, material = secured
    props, password = principal(bootstrap, material, tmp_path, "any", "reader")
    text = props.read_text()
    wrong = tmp_path / "wrong.properties"
    wrong.write_text(text.replace(f"sasl.password={password}", "sasl.password=nope"))
    bad_ca = tmp_path / "badca.properties"
    other_ca = secure.material(tmp_path / "other-tls")  # a CA the broker's certificate is not from
    bad_ca.write_text(text.replace(str(material.ca), str(other_ca.ca)))
    for path, cause in ((wrong, "authentication"), (bad_ca, "TLS")):
        for args in (["publish", str(tasks_file(tmp_path / "t.jsonl"))],
                     ["replay", "--topic", "scored"], ["status", "--json"],
                     ["topics", "create"]):
            t0 = time.monotonic()
            proc = cli(*args, "--kafka-config", str(path), "--prefix", "any", timeout=60)
            assert time.monotonic() - t0 < 45  # --timeout's 30 s and a process start
            line = one_line_error(proc)
            assert cause in line and bootstrap in line and proc.returncode == EX_NOPERM, line
            assert "nope" not in proc.stderr + proc.stdout
    # A stage with a wrong password stops, with the documented exit code (77).
    proc = cli("stage", "init", "--kafka-config", str(wrong), "--prefix", "any", timeout=90)
    assert proc.returncode == EX_NOPERM, proc.stderr[-2000:]
    assert "authentication" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN", "SSL"])
def test_each_way_in_publishes_and_reads_with_prefix_grants_only(
        secured: tuple[str, Material], tmp_path: Path, mechanism: str) -> None:
    bootstrap, material = secured
    prefix = f"m{uuid.uuid4().hex[:6]}"
    create_topics(material.admin_conf(bootstrap), prefix, partitions=1)
    props, _ = principal(bootstrap, material, tmp_path, prefix, "publisher",
                         mechanism=mechanism)
    try:
        kafka = ["--kafka-config", str(props), "--prefix", prefix]
        published = cli("publish", str(tasks_file(tmp_path / "t.jsonl")), *kafka)
        assert published.returncode == 0, published.stderr
        read = cli("replay", "--topic", "tasks", *kafka)
        assert read.returncode == 0, read.stderr
        assert sorted(e["key"] for e in json_lines(read.stdout)) == [f"s{i}" for i in range(TASKS)]
        # The same principal on another prefix: refused, the resource named.
        line = one_line_error(cli("replay", "--topic", "tasks", "--kafka-config", str(props),
                                  "--prefix", f"{prefix}x"))
        assert "not authorized" in line and f"{prefix}x.tasks" in line, line
        # `rollstream stats` (faust's client) gets the same way in.
        assert faust_credentials(config.read_properties(props)) is not None
    finally:
        delete_topics(material.admin_conf(bootstrap), prefix)


@pytest.mark.slow
def test_three_node_secured_cluster(tmp_path: Path) -> None:
    """`broker start --nodes 3 --secure`: topics made by the admin, replicated three ways;
    a least-privilege principal publishes and reads back; `broker stop --secure` stops it."""
    prefix = f"c{uuid.uuid4().hex[:6]}"
    with own_home(tmp_path / "home"), local.secured() as material:
        started = cli("broker", "start", "--nodes", "3", "--secure", "--timeout", "240",
                      timeout=300)
        try:
            assert started.returncode == 0, started.stderr
            bootstrap = started.stdout.strip()
            assert len(bootstrap.split(",")) == 3
            create_topics(material.admin_conf(bootstrap), prefix, partitions=2,
                          replication_factor=3)
            topics = AdminClient(material.admin_conf(bootstrap)).list_topics(timeout=30).topics
            assert all(len(p.replicas) == 3 for p in topics[f"{prefix}.tasks"].partitions.values())
            props, password = principal(bootstrap, material, tmp_path, prefix, "publisher")
            published = cli("publish", str(tasks_file(tmp_path / "t.jsonl")),
                            "--kafka-config", str(props), "--prefix", prefix)
            assert published.returncode == 0, published.stderr
            assert password not in published.stdout + published.stderr
            settings = config.load(kafka_config=str(props), prefix=prefix)
            read = read_partitions(settings, [TopicPartition(f"{prefix}.tasks", p, 0)
                                              for p in range(2)])
            assert sorted(m.key().decode() for m in read) == [f"s{i}" for i in range(TASKS)]
        finally:
            stopped = cli("broker", "stop", "--secure", "--timeout", "5")
        assert stopped.returncode == 0 and "cluster nodes 1, 2, 3 stopped" in stopped.stdout
        assert cluster.running_nodes() == []


def test_stats_gets_the_same_security(tmp_path: Path, secured: tuple[str, Material]) -> None:
    from faust.auth import SASLCredentials

    bootstrap, material = secured
    props, password = principal(bootstrap, material, tmp_path, "any", "reader")
    creds = faust_credentials(config.read_properties(props))
    assert isinstance(creds, SASLCredentials) and creds.password == password
    assert creds.mechanism.value == "SCRAM-SHA-512" and creds.ssl_context is not None
    assert password not in repr(creds)


def test_stats_refuses_unsigned_oauthbearer_in_one_line_before_any_broker(
        tmp_path: Path) -> None:
    props = tmp_path / "oauth.properties"
    # librdkafka's default OAUTHBEARER method: unsigned tokens made from this line.
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
                     "sasl.oauthbearer.config=principal=fleet hush\n")
    proc = cli("stats", "--kafka-config", str(props), "--bootstrap-servers", "127.0.0.1:1",
               timeout=60)
    line = one_line_error(proc)
    assert proc.returncode == EX_CONFIG and "OAUTHBEARER" in line, line
    assert "hush" not in proc.stdout + proc.stderr


def test_plain_users_reach_the_broker_config_and_a_bad_one_is_named(tmp_path: Path) -> None:
    material = secure.material(tmp_path / "tls")
    material.plain_users.write_text("fleet=pw-1\n")
    jaas = material.broker_settings()["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert 'user_fleet="pw-1"' in jaas
    material.plain_users.write_text('fleet=pw-1\nbad"one=x\n')
    with pytest.raises(ValueError, match=r"users \['bad\"one'\]"):
        material.broker_settings()


def test_a_foreign_flag_is_an_error() -> None:
    proc = cli("stage", "eval", "--tokenizer-path", "x", timeout=60)
    assert proc.returncode == 2 and "--tokenizer-path" in proc.stderr


def test_no_broker_configured_names_the_ways(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rollstream.cli", "status"], text=True,
                          capture_output=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "ROLLSTREAM_HOME": str(tmp_path)})
    line = one_line_error(proc)
    for way in ("--bootstrap-servers", "KAFKA_BOOTSTRAP_SERVERS", "--kafka-config", "local"):
        assert way in line
    assert not (tmp_path / "kafka").exists()  # nothing was started
