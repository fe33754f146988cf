"""`rollstream demo`: the whole RL loop on the embedded defaults (rollstream.dev.demo)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollstream import config
from rollstream.dev import demo
from rollstream.dev.loop import LoopConfig


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo", help="run the whole RL loop on the embedded defaults, then summarize and plot",
        description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=LoopConfig.tasks,
                        help="copy_letter tasks to publish")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=280.0,
                        help="stop the loop after this many seconds")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the plot, logs and checkpoints "
                             "(default: .rollstream/demo/<run>)")
    parser.add_argument("--keep-topics", action="store_true",
                        help="keep this run's topics (to replay them) instead of deleting them")
    config.add_arguments(parser, "kafka")
    parser.set_defaults(func=demo.run_demo)
