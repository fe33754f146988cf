"""`rollstream topics create|list`: the pipeline's Kafka topics, as the topic graph has them."""

from __future__ import annotations

import argparse

from rollstream import config
from rollstream.cli import common
from rollstream.cluster.topics import TOPIC_SPECS, create_topics, describe_topics
from rollstream.config import Topics


def _create(args: argparse.Namespace) -> int:
    settings = common.settings(args)
    bootstrap = settings.bootstrap_servers
    created = create_topics(
        settings.kafka(), settings.prefix, settings.partitions, args.replication_factor,
        timeout=settings.timeout_s,
    )
    topics = Topics(settings.prefix)
    for spec in TOPIC_SPECS:
        name = spec.name(topics)
        print(f"{'created' if name in created else 'exists '}  {name}")
    print(f"{len(created)} created, {len(TOPIC_SPECS) - len(created)} already there ({bootstrap})")
    return 0


def _list(args: argparse.Namespace) -> int:
    settings = common.settings(args)
    bootstrap = settings.bootstrap_servers
    rows = describe_topics(settings.kafka(), settings.prefix, timeout=settings.timeout_s)
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


def register_cli(sub: argparse._SubParsersAction) -> None:
    """Add `topics create|list` to the `rollstream` command's subparsers."""
    parser = sub.add_parser(
        "topics",
        help="create or list the pipeline's Kafka topics",
        description="The topics under one prefix: "
        + "; ".join(f"{s.suffix}: {s.doc}" for s in TOPIC_SPECS),
    )
    commands = parser.add_subparsers(dest="topics_command", metavar="ACTION", required=True)

    p = commands.add_parser(
        "create",
        help="create the topics with their configs (idempotent: existing ones are kept)",
        description="Create "
        + ", ".join(f"<prefix>.{s.suffix}" for s in TOPIC_SPECS)
        + ". The broker is KAFKA_BOOTSTRAP_SERVERS, else --bootstrap-servers, "
        "else the bundled local broker (started if needed).",
    )
    config.add_arguments(p, "kafka", "command", "topics")
    p.add_argument(
        "--replication-factor", type=int, default=1, help="replicas per partition (default 1)"
    )
    p.set_defaults(func=_create)

    p = commands.add_parser("list", help="show the topics, partition counts and configs")
    config.add_arguments(p, "kafka", "command")
    p.set_defaults(func=_list)
