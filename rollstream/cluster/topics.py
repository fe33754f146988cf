"""`rollstream topics create|list`: the topic graph (rollstream/contracts/graph.py) made on a
broker."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rollstream.cluster.kafka_errors import denied, problem
from rollstream.contracts.graph import GRAPH, STATS, Topic, Topics, partition_count
from rollstream.contracts.wire import MAX_MESSAGE_BYTES

__all__ = ["MAX_MESSAGE_BYTES", "TOPIC_SPECS", "create_topics", "delete_topics", "describe_topics"]

# The graph's topics in order; `topic.name(topics)` is a topic's name under a prefix.
TOPIC_SPECS: tuple[Topic, ...] = GRAPH


# librdkafka's own limit on one record (the producers' message.max.bytes).
PRODUCER_MAX_BYTES = MAX_MESSAGE_BYTES
# What a record costs beyond its key and value bytes, with room to spare (record batch header,
# varints, headers): a record within limit - this is accepted by the broker.
RECORD_OVERHEAD = 4096


def record_limits(topics: Topics) -> dict[str, int]:
    """The largest key + value, in bytes, a producer may send to each topic of the graph: the
    topic's max.message.bytes and the producers' message.max.bytes, less record overhead."""
    return {spec.name(topics): min(int(spec.config["max.message.bytes"]), PRODUCER_MAX_BYTES)
            - RECORD_OVERHEAD for spec in TOPIC_SPECS}


# A broker address, or a whole client configuration (`Settings.kafka()`: SASL, TLS and the rest).
KafkaConf = str | Mapping[str, Any]


def client_conf(kafka: KafkaConf) -> dict[str, Any]:
    return {"bootstrap.servers": kafka} if isinstance(kafka, str) else dict(kafka)


def _admin(kafka: KafkaConf) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_conf(kafka))


def create_topics(
    kafka: KafkaConf,
    prefix: str = "rollstream",
    partitions: int = 8,
    replication_factor: int = 1,
    timeout: float = 60,
    specs: tuple[Topic, ...] = TOPIC_SPECS,
) -> list[str]:
    """Create the topic graph under prefix (`specs`: those of its topics only); topics that
    exist already are left as they are.

    Returns the names created. Raises RuntimeError if episodes and episode-state end up with
    different partition counts (RUN reads them co-partitioned).
    """
    from confluent_kafka.admin import NewTopic

    topics = Topics(prefix)
    new = [
        NewTopic(
            spec.name(topics),
            num_partitions=partition_count(spec, partitions),
            replication_factor=replication_factor,
            # Replicated: a write waits for two copies, so one broker can die losing nothing.
            config={**spec.config, "min.insync.replicas": "2" if replication_factor >= 3 else "1"},
        )
        for spec in specs
    ]
    created, meta = create(kafka, new, timeout)
    _check_copartitioned(meta, topics)
    return created


def create(kafka: KafkaConf, new: list[Any], timeout: float = 60
           ) -> tuple[list[str], dict[str, Any]]:
    """Create the topics `new` (NewTopic), leaving those that exist as they are, and wait until
    every broker knows them all. Returns the names created and the topics' metadata."""
    from confluent_kafka import KafkaError, KafkaException

    admin = _admin(kafka)
    futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    created: list[str] = []
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            err = exc.args[0]
            if denied(err):
                raise problem(err, client_conf(kafka)["bootstrap.servers"], f"topic {name}"
                              ) from None
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        else:
            created.append(name)
    return sorted(created), _wait_visible(kafka, admin, [t.topic for t in new], timeout)


def _wait_visible(kafka: KafkaConf, admin: Any, names: list[str], timeout: float
                  ) -> dict[str, Any]:
    """The topics' metadata once every broker has every topic in names, with a leader for each
    partition.

    CreateTopics returns when the controller has the topics; each broker learns them from the
    metadata log a little later, and what a lagging broker answers meanwhile (a producer's
    metadata, a DescribeConfigs) says there is no such topic. So each broker is asked in turn,
    through a client that knows only that broker (a fresh client asks its bootstrap broker)."""
    deadline = time.monotonic() + timeout
    meta = _visible(admin, names, deadline, timeout)
    if len(meta.brokers) > 1:
        for broker in meta.brokers.values():
            only = {**client_conf(kafka), "bootstrap.servers": f"{broker.host}:{broker.port}"}
            _visible(_admin(only), names, deadline, timeout)
    return meta.topics


def _visible(admin: Any, names: list[str], deadline: float, timeout: float) -> Any:
    """The cluster metadata from `admin` once it shows every topic in names with leaders."""
    while True:
        meta = admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        missing = [
            n for n in names
            if n not in meta.topics or meta.topics[n].error is not None
            or any(p.leader < 0 for p in meta.topics[n].partitions.values())
        ]
        if not missing:
            return meta
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics not visible after {timeout:.0f} s: {missing}")
        time.sleep(0.1)


def _check_copartitioned(meta: dict[str, Any], topics: Topics) -> None:
    counts = {
        name: len(meta[name].partitions)
        for name in (topics.episodes, topics.episode_state)
        if name in meta
    }
    if len(set(counts.values())) > 1:
        raise RuntimeError(
            f"{topics.episodes} and {topics.episode_state} must have the same partition count "
            f"(RUN reads them co-partitioned), found {counts}"
        )


def delete_topics(kafka: KafkaConf, prefix: str, timeout: float = 60, *,
                  whole_namespace: bool = False) -> list[str]:
    """Delete the topic graph under prefix (those that exist) and the topics `rollstream stats`
    made for it (faust's changelogs, named after its app id): a broker keeps every partition it
    holds on disk, loads each one when it starts and looks after it meanwhile (a dev broker
    left with 1,100 of them took 26 s of CPU to start instead of 2). `whole_namespace`: every
    topic named `<prefix>.…`, whoever made it (a test's own prefix). Returns the names
    deleted."""
    from confluent_kafka import KafkaError, KafkaException

    topics = Topics(prefix)
    admin = _admin(kafka)
    existing = set(admin.list_topics(timeout=timeout).topics)
    names = [spec.name(topics) for spec in TOPIC_SPECS if spec.name(topics) in existing]
    under = f"{prefix}." if whole_namespace else f"{topics.group(STATS)}-"
    names += sorted(n for n in existing if n.startswith(under) and n not in names)
    if not names:
        return []
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        try:
            future.result()
        except KafkaException as exc:
            # Listed, yet gone by now: a deletion just before (metadata lags behind it).
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    return names


def describe_topics(kafka: KafkaConf, prefix: str = "rollstream", timeout: float = 30
                    ) -> list[dict]:
    """The graph's topics as they are on the broker: name, partitions, and the configs we set."""
    from confluent_kafka.admin import ConfigResource

    topics = Topics(prefix)
    admin = _admin(kafka)
    meta = admin.list_topics(timeout=timeout).topics
    rows: list[dict] = []
    present = [spec for spec in TOPIC_SPECS if spec.name(topics) in meta]
    resources = [ConfigResource("topic", spec.name(topics)) for spec in present]
    configs = admin.describe_configs(resources, request_timeout=timeout) if resources else {}
    for spec, resource in zip(present, resources, strict=True):
        entries = configs[resource].result()
        name = spec.name(topics)
        rows.append(
            {
                "name": name,
                "partitions": len(meta[name].partitions),
                "config": {k: entries[k].value for k in spec.config if k in entries},
            }
        )
    return rows


# ------------------------------------------------------------------------------------------ CLI
