"""The `rollstream` command: one subcommand per feature, each registered by its own module in
this package (`python -m rollstream.cli` runs it too)."""

from __future__ import annotations

import argparse

from rollstream.cli import (
    broker,
    controller,
    demo,
    dlq,
    envs,
    harness_tasks,
    plan,
    publish,
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
    topics,
    schemas,
    stage,
    train,
    serve_policy,
    serve_scripted,
    controller,
    publish,
    envs,
    harness_tasks,
    sandbox,
    demo,
    status,
    dlq,
    stats,
    plan,
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
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
