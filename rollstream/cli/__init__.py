"""The `rollstream` command: one subcommand per feature, each registered by its own module in
this package (`python -m rollstream.cli` runs it too)."""

from __future__ import annotations

import argparse
import sys

from rollstream.cli import (
    acl,
    api,
    bridge,
    broker,
    controller,
    demo,
    dlq,
    envs,
    fleet,
    harness_tasks,
    jobs,
    plan,
    publish,
    replay,
    sandbox,
    schemas,
    serve_policy,
    serve_scripted,
    stage,
    stats,
    status,
    topics,
    train,
)

# Each module exposes register_cli(subparsers); it adds its parser(s) and sets `func`. Imported
# explicitly (not by name) so the import-linter contracts in pyproject.toml see these edges.
# Heavy imports (torch, aiohttp) stay inside the commands so `rollstream --help` is instant.
FEATURE_MODULES = [
    broker,
    acl,
    topics,
    jobs,
    schemas,
    stage,
    fleet,
    train,
    serve_policy,
    serve_scripted,
    controller,
    publish,
    replay,
    bridge,
    envs,
    harness_tasks,
    sandbox,
    demo,
    status,
    dlq,
    stats,
    plan,
    api,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollstream",
        description="Rollout-as-a-service for multi-turn LLM agent RL on Apache Kafka.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in FEATURE_MODULES:
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. A Kafka failure ends it with one line naming the cause and an exit code
    (rollstream.cluster.kafka_errors), never a traceback."""
    from confluent_kafka import KafkaException

    from rollstream.broker.local import BrokerError
    from rollstream.cluster.kafka_errors import AccessDenied, KafkaProblem, problem

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KafkaProblem as exc:
        return _fail(str(exc), exc.exit_code)
    except AccessDenied as exc:
        return _fail(exc.message, int(exc.code or 1))
    except KafkaException as exc:
        found = problem(exc.args[0], _bootstrap(args))
        return _fail(str(found), found.exit_code)
    except BrokerError as exc:
        return _fail(str(exc), 1)


def _bootstrap(args: argparse.Namespace) -> str:
    from rollstream import config

    try:
        return config.load(args).bootstrap_servers or "the broker"
    except (SystemExit, OSError, ValueError):
        return "the broker"


def _fail(message: str, code: int) -> int:
    print(f"rollstream: {message}", file=sys.stderr)
    return code
