"""The topic graph: each topic's purpose and configuration, and `rollstream topics create|list`.

Configs are set explicitly per topic instead of relying on broker defaults, so the same
`topics create` gives the same topics on the bundled broker, a container or a production cluster.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from rollstream.config import Topics

MIB = 1024 * 1024
DAY_MS = 24 * 3600 * 1000
# Largest event on the trajectory path. A 32k-token trajectory (int32 ids + float32 logprobs) is
# about 256 KiB plus its text; long multi-turn episodes with big tool outputs need far more.
# Producers and consumers on these topics must allow it too (librdkafka's message.max.bytes).
MAX_MESSAGE_BYTES = 16 * MIB


@dataclass(frozen=True)
class TopicSpec:
    """One topic: `attr` is its name's property on rollstream.config.Topics."""

    attr: str
    doc: str
    config: dict[str, str] = field(default_factory=dict)
    # None: the `partitions` argument of create_topics; a number: always that many.
    partitions: int | None = None

    def name(self, topics: Topics) -> str:
        return str(getattr(topics, self.attr))


def _config(*, retention_ms: int, compression: str, max_bytes: int, **extra: str) -> dict[str, str]:
    return {
        "retention.ms": str(retention_ms),
        "compression.type": compression,
        "max.message.bytes": str(max_bytes),
        "min.insync.replicas": "1",
        **extra,
    }


TOPIC_SPECS: tuple[TopicSpec, ...] = (
    TopicSpec(
        "tasks",
        "tasks to roll out, keyed by task id (producers -> INIT)",
        # Problem statements are text: a few KiB, rarely more.
        _config(retention_ms=7 * DAY_MS, compression="lz4", max_bytes=4 * MIB),
    ),
    TopicSpec(
        "episodes",
        "one event per sample of a task's group, keyed by episode id (INIT -> RUN)",
        _config(retention_ms=7 * DAY_MS, compression="lz4", max_bytes=4 * MIB),
    ),
    TopicSpec(
        "episode_state",
        "per-turn checkpoints of running episodes, keyed by episode id; compacted to the latest "
        "(RUN's resume state; co-partitioned with episodes)",
        _config(
            retention_ms=7 * DAY_MS,
            compression="zstd",
            max_bytes=MAX_MESSAGE_BYTES,  # holds the token ids of every turn so far
            **{
                "cleanup.policy": "compact",
                # Compaction works only on closed segments: roll hourly so old turns go away.
                "segment.ms": str(3600 * 1000),
                "min.cleanable.dirty.ratio": "0.1",
                # How long a tombstone (a finished episode's delete) stays readable.
                "delete.retention.ms": str(DAY_MS),
            },
        ),
    ),
    TopicSpec(
        "trajectories",
        "finished episodes: every turn's token ids, logprobs and observations (RUN -> EVAL)",
        _config(retention_ms=7 * DAY_MS, compression="zstd", max_bytes=MAX_MESSAGE_BYTES),
    ),
    TopicSpec(
        "scored",
        "trajectories with their reward and outcome class (EVAL -> trainer bridge)",
        _config(retention_ms=7 * DAY_MS, compression="zstd", max_bytes=MAX_MESSAGE_BYTES),
    ),
    TopicSpec(
        "policy",
        "policy versions published by the trainer, in order (trainer -> inference controller)",
        # Kept forever: tiny, and the whole history says which weights produced which rollouts.
        _config(
            retention_ms=-1,
            compression="lz4",
            max_bytes=1 * MIB,
            **{"retention.bytes": "-1"},
        ),
        partitions=1,  # one partition: a total order of versions
    ),
    TopicSpec(
        "seen",
        "ids INIT and EVAL have handled, keyed by <stage>/<id>, on their input's partition; "
        "compacted (their deduplication memory, rollstream.dedup)",
        _config(retention_ms=7 * DAY_MS, compression="lz4", max_bytes=1 * MIB,
                **{"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.1"}),
    ),
    TopicSpec(
        "dlq",
        "events a stage could not decode or validate, with reason and source coordinates",
        # Wraps the original event, which may itself be as large as MAX_MESSAGE_BYTES; kept longer
        # because someone has to look at it.
        _config(retention_ms=30 * DAY_MS, compression="lz4", max_bytes=MAX_MESSAGE_BYTES + MIB),
    ),
)


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


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topics(
    bootstrap: str,
    prefix: str = "rollstream",
    partitions: int = 8,
    replication_factor: int = 1,
    timeout: float = 60,
) -> list[str]:
    """Create the topic graph under prefix; topics that exist already are left as they are.

    Returns the names created. Raises RuntimeError if episodes and episode-state end up with
    different partition counts (RUN reads them co-partitioned).
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    topics = Topics(prefix)
    admin = _admin(bootstrap)
    new = [
        NewTopic(
            spec.name(topics),
            num_partitions=spec.partitions or partitions,
            replication_factor=replication_factor,
            # Replicated: a write waits for two copies, so one broker can die losing nothing.
            config={**spec.config, "min.insync.replicas": "2" if replication_factor >= 3 else "1"},
        )
        for spec in TOPIC_SPECS
    ]
    futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    created: list[str] = []
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        else:
            created.append(name)
    _check_copartitioned(admin, topics, timeout)
    return sorted(created)


def _check_copartitioned(admin: Any, topics: Topics, timeout: float) -> None:
    meta = admin.list_topics(timeout=timeout).topics
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


def delete_topics(bootstrap: str, prefix: str, timeout: float = 60) -> list[str]:
    """Delete the topic graph under prefix (those that exist); returns the names deleted."""
    topics = Topics(prefix)
    admin = _admin(bootstrap)
    existing = set(admin.list_topics(timeout=timeout).topics)
    names = [spec.name(topics) for spec in TOPIC_SPECS if spec.name(topics) in existing]
    if not names:
        return []
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        future.result()
    return names


def describe_topics(bootstrap: str, prefix: str = "rollstream", timeout: float = 30) -> list[dict]:
    """The graph's topics as they are on the broker: name, partitions, and the configs we set."""
    from confluent_kafka.admin import ConfigResource

    topics = Topics(prefix)
    admin = _admin(bootstrap)
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


def _settings(args: argparse.Namespace) -> tuple[Any, str]:
    from rollstream.config import load_resolved

    settings = load_resolved(args)
    return settings, settings.bootstrap_servers


def _create(args: argparse.Namespace) -> int:
    settings, bootstrap = _settings(args)
    created = create_topics(
        bootstrap, settings.prefix, settings.partitions, args.replication_factor
    )
    topics = Topics(settings.prefix)
    for spec in TOPIC_SPECS:
        name = spec.name(topics)
        print(f"{'created' if name in created else 'exists '}  {name}")
    print(f"{len(created)} created, {len(TOPIC_SPECS) - len(created)} already there ({bootstrap})")
    return 0


def _list(args: argparse.Namespace) -> int:
    settings, bootstrap = _settings(args)
    rows = describe_topics(bootstrap, settings.prefix)
    if not rows:
        print(f"no {settings.prefix}.* topics on {bootstrap}; run `rollstream topics create`")
        return 1
    width = max(len(r["name"]) for r in rows)
    for row in rows:
        conf = " ".join(f"{k}={v}" for k, v in row["config"].items())
        print(f"{row['name']:<{width}}  partitions={row['partitions']:<3} {conf}")
    missing = len(TOPIC_SPECS) - len(rows)
    if missing:
        print(f"{missing} topic(s) of the graph missing; run `rollstream topics create`")
    return 0


def register_cli(sub: Any) -> None:
    """Add `topics create|list` to the `rollstream` command's subparsers."""
    from rollstream.config import add_arguments

    parser = sub.add_parser(
        "topics",
        help="create or list the pipeline's Kafka topics",
        description="The topics under one prefix: "
        + "; ".join(f"{s.attr.replace('_', '-')}: {s.doc}" for s in TOPIC_SPECS),
    )
    commands = parser.add_subparsers(dest="topics_command", metavar="ACTION", required=True)

    p = commands.add_parser(
        "create",
        help="create the topics with their configs (idempotent: existing ones are kept)",
        description="Create <prefix>.tasks, .episodes, .episode-state, .trajectories, .scored, "
        ".policy and .dlq. The broker is KAFKA_BOOTSTRAP_SERVERS, else --bootstrap-servers, "
        "else the bundled local broker (started if needed).",
    )
    add_arguments(p)
    p.add_argument(
        "--replication-factor", type=int, default=1, help="replicas per partition (default 1)"
    )
    p.set_defaults(func=_create)

    p = commands.add_parser("list", help="show the topics, partition counts and configs")
    add_arguments(p)
    p.set_defaults(func=_list)
