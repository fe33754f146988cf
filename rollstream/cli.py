"""The `rollstream` command: one subcommand per feature, each registered by its own module."""

from __future__ import annotations

import argparse
import sys

import producers.cli
import producers.harness_tasks
import rollstream.broker.cli
import rollstream.contracts
import rollstream.dev.demo
import rollstream.dev.scripted
import rollstream.dlq
import rollstream.envs.cli
import rollstream.inference.controller
import rollstream.policy.cli
import rollstream.sandbox.cli
import rollstream.stats
import rollstream.status
import rollstream.topics
import stages.cli
import trainer_bridge.cli

# Each module exposes register_cli(subparsers); it adds its parser(s) and sets `func`. Imported
# explicitly (not by name) so the import-linter contracts in pyproject.toml see these edges.
# Heavy imports (torch, aiohttp) stay inside the commands so `rollstream --help` is instant.
FEATURE_MODULES = [
    rollstream.broker.cli,
    rollstream.topics,
    rollstream.contracts,
    stages.cli,
    trainer_bridge.cli,
    rollstream.policy.cli,
    rollstream.dev.scripted,
    rollstream.inference.controller,
    producers.cli,
    rollstream.envs.cli,
    producers.harness_tasks,
    rollstream.sandbox.cli,
    rollstream.dev.demo,
    rollstream.status,
    rollstream.dlq,
    rollstream.stats,
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


if __name__ == "__main__":
    sys.exit(main())
