"""The broker the suite runs on, and the topic graph: real Kafka, no mocks."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from rollstream.broker import class_archive, local
from rollstream.cluster.topics import MAX_MESSAGE_BYTES, TOPIC_SPECS, create_topics, delete_topics
from rollstream.config import Topics


def _consume(
    bootstrap: str, topic: str, count: int, timeout: float = 30, conf: dict[str, str] | None = None
) -> list[Message]:
    """Read count messages from the start of topic with a fresh consumer group."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **(conf or {}),
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
    finally:
        consumer.close()
    return got


def _local_broker_in_use(bootstrap: str) -> bool:
    st = local.status()
    return bool(st["running"]) and st["bootstrap"] == bootstrap


def test_local_broker_start_reuses_running_broker(bootstrap: str) -> None:
    if not _local_broker_in_use(bootstrap):
        pytest.skip("the session runs on another broker than the bundled one")
    before = local.status()
    assert local.start() == bootstrap
    after = local.status()
    assert after["pid"] == before["pid"]
    assert after["running"] is True
    assert after["kafka_version"], "jar versions are known once resolved"
    assert Path(after["log"]).is_file()
    assert local.is_running()


def test_resolve_bootstrap_order(bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env-host:9092")
    assert local.resolve_bootstrap("flag-host:9092") == "flag-host:9092"  # an explicit flag wins
    assert local.resolve_bootstrap("") == "env-host:9092"
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS")
    if _local_broker_in_use(bootstrap):
        assert local.resolve_bootstrap("") == bootstrap  # the running bundled broker


def test_create_topics_is_idempotent_and_configures_topics(bootstrap: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    names = sorted(spec.name(topics) for spec in TOPIC_SPECS)
    try:
        assert create_topics(bootstrap, prefix, partitions=3) == names
        assert create_topics(bootstrap, prefix, partitions=3) == []

        admin = AdminClient({"bootstrap.servers": bootstrap})
        meta = admin.list_topics(timeout=10).topics
        assert len(meta[topics.episodes].partitions) == 3
        assert len(meta[topics.episode_state].partitions) == 3  # co-partitioned with episodes
        assert len(meta[topics.policy].partitions) == 1

        resources = {
            name: ConfigResource("topic", name)
            for name in (topics.episode_state, topics.trajectories, topics.tasks, topics.policy)
        }
        futures = admin.describe_configs(list(resources.values()))
        conf = {name: futures[res].result() for name, res in resources.items()}
        assert conf[topics.episode_state]["cleanup.policy"].value == "compact"
        assert conf[topics.trajectories]["cleanup.policy"].value == "delete"
        assert conf[topics.trajectories]["compression.type"].value == "zstd"
        assert conf[topics.tasks]["compression.type"].value == "zstd"  # one codec everywhere
        assert int(conf[topics.trajectories]["max.message.bytes"].value) == MAX_MESSAGE_BYTES
        assert conf[topics.policy]["retention.ms"].value == "-1"
    finally:
        delete_topics(bootstrap, prefix)


def test_deleting_a_prefix_takes_its_stats_changelogs_and_only_its_own(bootstrap: str) -> None:
    """The graph goes with the topics faust made for `rollstream stats` under the prefix;
    another prefix that starts alike keeps its own; the whole namespace takes the rest."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    extra = [f"{prefix}.stats-totals-changelog", f"{prefix}.stats-__assignor-__leader",
             f"{prefix}.scored-replay", f"{prefix}x.stats-totals-changelog"]
    create_topics(bootstrap, prefix, partitions=1)
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in extra]).values():
        future.result()
    graph = {spec.name(Topics(prefix)) for spec in TOPIC_SPECS}
    # Deletion goes by the topics listed: a busy broker lists one just created a moment later.
    deadline = time.monotonic() + 60
    while not graph | set(extra) <= set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, "the topics just created were never listed"
        time.sleep(0.2)

    deleted = delete_topics(bootstrap, prefix)

    assert set(deleted) == graph | set(extra[:2])
    # (A name just deleted may still be listed a moment: it is deleted again, harmlessly.)
    assert f"{prefix}.scored-replay" in delete_topics(bootstrap, prefix, whole_namespace=True)
    assert delete_topics(bootstrap, f"{prefix}x") == [f"{prefix}x.stats-totals-changelog"]


def test_produce_consume_round_trip(bootstrap: str, topics: Topics) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    producer.produce(topics.tasks, key=b"task-1", value=b"hello", headers=[("kind", b"Task")])
    assert producer.flush(30) == 0

    [msg] = _consume(bootstrap, topics.tasks, 1)
    assert (msg.key(), msg.value()) == (b"task-1", b"hello")
    assert msg.headers() == [("kind", b"Task")]


def test_large_trajectory_fits(bootstrap: str, topics: Topics) -> None:
    # Above every 1 MB default on the way (broker, topic, librdkafka), below the topic's cap.
    value = os.urandom(6 * 1024 * 1024)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": MAX_MESSAGE_BYTES + 65536}
    )
    producer.produce(topics.trajectories, key=b"ep-1", value=value)
    assert producer.flush(60) == 0

    [msg] = _consume(bootstrap, topics.trajectories, 1, timeout=60)
    assert msg.value() == value


def test_transactions_consume_transform_produce(bootstrap: str, topics: Topics) -> None:
    """The exactly-once path every stage uses: needs the transaction state topic set up right."""
    seed = Producer({"bootstrap.servers": bootstrap})
    seed.produce(topics.tasks, key=b"task-1", value=b"task")
    assert seed.flush(30) == 0

    group = f"stage-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex[:8]}"}
    )
    try:
        producer.init_transactions(60)
        consumer.subscribe([topics.tasks])
        msg = None
        deadline = time.monotonic() + 30
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
        assert msg is not None and msg.error() is None

        # An aborted transaction: its event must never be seen by read_committed consumers.
        producer.begin_transaction()
        producer.produce(topics.episodes, key=b"task-1#0", value=b"aborted")
        producer.abort_transaction(30)

        producer.begin_transaction()
        producer.produce(topics.episodes, key=b"task-1#0", value=b"committed")
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)

        committed = consumer.committed([TopicPartition(topics.tasks, msg.partition())], 30)
        assert committed[0].offset == msg.offset() + 1  # the input offset went with the output
    finally:
        consumer.close()

    [out] = _consume(bootstrap, topics.episodes, 1, conf={"isolation.level": "read_committed"})
    assert out.value() == b"committed"


def test_unknown_topic_is_not_auto_created(bootstrap: str) -> None:
    name = f"t{uuid.uuid4().hex[:8]}.typo"
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 1000})
    errors: list[KafkaError] = []
    producer.produce(name, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert name not in meta.topics


def test_the_class_data_archive_maps_into_every_broker_jvm() -> None:
    """The archive `broker fetch --class-archive` makes (set-up makes it; made here if not)
    is valid for the class path every broker, StorageTool and cluster node runs with: with
    -Xshare:on a JVM that cannot map it exits with an error instead of running without it."""
    if not local.class_archive().is_file():
        class_archive.build()
    proc = subprocess.run(
        [local._java(), "-Xshare:on", *local.jvm_options(), "-cp", local._classpath(),
         "kafka.Kafka", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert local.kafka_version() in proc.stdout


def test_the_session_broker_runs_on_the_class_data_archive(bootstrap: str) -> None:
    """The bundled broker started with the archive there maps it: the file is in its memory."""
    if not _local_broker_in_use(bootstrap):
        pytest.skip("the session runs on another broker than the bundled one")
    pid = local.status()["pid"]
    archive = local.class_archive()
    if not archive.is_file() or archive.stat().st_mtime > Path(f"/proc/{pid}").stat().st_mtime:
        pytest.skip("the archive was made after this broker started (`make deps` makes it "
                    "first); the test above checks it maps")
    assert str(archive) in Path(f"/proc/{pid}/maps").read_text()


def test_the_session_broker_runs_on_the_client_compiler_alone(bootstrap: str) -> None:
    """The JVM itself, asked through its attach API, reports the compiler level the bundled
    broker runs at: the client compiler only."""
    if not _local_broker_in_use(bootstrap):
        pytest.skip("the session runs on another broker than the bundled one")
    if os.environ.get(local.JAVA_OPTS_ENV):
        pytest.skip(f"{local.JAVA_OPTS_ENV} gives the session's broker options of its own")
    jcmd = shutil.which("jcmd")
    if jcmd is None:
        pytest.skip("no jcmd (a JRE without the JDK's tools) to ask the broker's JVM")
    flags = subprocess.run([jcmd, str(local.status()["pid"]), "VM.flags"], capture_output=True,
                           text=True, timeout=60).stdout.split()
    assert "-XX:TieredStopAtLevel=1" in flags, flags


def test_the_secured_broker_fetches_its_jars_on_a_fresh_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`broker start --secure` on a new ROLLSTREAM_HOME: the jars go to the plain home's libs/,
    which the secured broker shares (it raised FileNotFoundError moving
    secure/kafka/libs.partial there). Maven's cache serves them."""
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path))
    with local.secured():
        libs = local.resolve_jars()
    assert libs == tmp_path / "kafka" / "libs"
    assert any(libs.glob("kafka_*.jar")) and local.jars_ready()
    assert not (tmp_path / "kafka" / "libs.partial").exists()
