"""`rollstream envs`: list the environments a task's `env` field can name."""

from __future__ import annotations

import argparse

from rollstream.envs.registry import list_envs


def envs_command(args: argparse.Namespace) -> int:
    envs = list_envs()
    width = max(len(name) for name, _ in envs)
    for name, description in envs:
        print(f"{name:<{width}}  {description}")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("envs", help="list environment plug-ins (built-in and installed)")
    parser.set_defaults(func=envs_command)
