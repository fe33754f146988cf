"""The local 3-node cluster: topics replicated three ways, and transactions that carry on when
the partition's leader broker is SIGKILLed (the chaos benchmark kills the active controller
too)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from rollstream.broker import cluster, local
from rollstream.config import load
from rollstream.kafka import read_partitions
from rollstream.topics import create_topics

pytestmark = pytest.mark.slow


@pytest.fixture
def three_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    jars = local.libs_dir() if local.jars_ready() else None  # the project's, if fetched
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv(local.HEAP_ENV, os.environ.get(local.HEAP_ENV, "256m"))
    if jars is not None:  # hard links: no second Maven download
        shutil.copytree(jars, local.libs_dir(), copy_function=os.link)
    try:
        yield cluster.start(3, timeout=240)
    finally:
        cluster.stop(timeout=10)


def _transaction(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex,
                  "enable.idempotence": True})
    p.init_transactions(120)
    p.begin_transaction()
    for value in values:
        p.produce(topic, value, partition=0)
    p.commit_transaction(120)


def test_transactions_survive_the_partition_leader_being_killed(
        three_nodes: str) -> None:
    bootstrap = three_nodes
    assert cluster.running_nodes() == [1, 2, 3]
    settings = load(bootstrap_servers=bootstrap, prefix=f"c{uuid.uuid4().hex[:6]}")
    create_topics(bootstrap, settings.prefix, partitions=2, replication_factor=3)
    topic = settings.topics.tasks
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # create_topics returns once every broker knows the topics (each one answers
    # DescribeConfigs from its own metadata).
    meta = admin.list_topics(topic, timeout=30)
    assert len(meta.topics[topic].partitions) == 2
    assert all(len(p.replicas) == 3 for p in meta.topics[topic].partitions.values())
    [config] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    assert config.result(timeout=30)["min.insync.replicas"].value == "2"

    _transaction(bootstrap, topic, [b"before"])
    leader = cluster.partition_leader(bootstrap, topic, 0)
    assert cluster.kill_node(leader)
    _transaction(bootstrap, topic, [b"after-leader-kill-1", b"after-leader-kill-2"])
    assert cluster.partition_leader(bootstrap, topic, 0) != leader
    values = [m.value() for m in read_partitions(settings, [TopicPartition(topic, 0, 0)])]
    assert values == [b"before", b"after-leader-kill-1", b"after-leader-kill-2"]
    # The killed node comes back and rejoins as a broker of the cluster.
    cluster.start_node(leader)
    cluster.wait_ready(bootstrap, 3, timeout=240)
    assert cluster.running_nodes() == [1, 2, 3]
