"""The `rollstream` command: one subcommand per feature, each registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes register_cli(subparsers); it adds its parser(s) and sets `func`.
# Heavy imports (torch, aiohttp) stay inside the commands so `rollstream --help` is instant.
FEATURE_MODULES = [
    "rollstream.broker.cli",
    "rollstream.topics",
    "stages.cli",
    "trainer_bridge.cli",
    "rollstream.policy.cli",
    "rollstream.policy.scripted",
    "rollstream.controller",
    "producers.cli",
    "rollstream.envs.cli",
    "rollstream.gateway.cli",
    "rollstream.sandbox.cli",
    "rollstream.demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollstream",
        description="Rollout-as-a-service for multi-turn LLM agent RL on Apache Kafka.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in FEATURE_MODULES:
        importlib.import_module(name).register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
