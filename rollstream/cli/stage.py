"""`rollstream stage init|run|eval`: run one stage process (add processes to scale it)."""

from __future__ import annotations

import argparse

from rollstream import config
from rollstream.cli import common

# Each stage, what it does, and the settings it takes (besides Kafka's and the process's own).
STAGES = {
    "init": ("expand tasks into their group of episodes", ("admission", "dedup", "bounds")),
    "run": ("play episodes against the inference server(s)", ("inference", "sandbox", "bounds")),
    "eval": ("score finished trajectories", ("dedup", "sandbox")),
}


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "stage", help="run one pipeline stage process",
        description="Run one stage as a member of its consumer group. Start more processes "
                    "with the same prefix to scale a stage, up to its topic's partitions.")
    names = parser.add_subparsers(dest="name", metavar="STAGE", required=True)
    for name, (what, groups) in STAGES.items():
        stage = names.add_parser(name, help=what, description=f"The {name.upper()} stage: {what}.")
        stage.add_argument("--drain-timeout", type=float, default=30.0,
                           help="seconds to let in-flight events finish on SIGTERM (default 30)")
        config.add_arguments(stage, "kafka", "stage", "service", *groups)
        stage.set_defaults(func=run_stage)


def run_stage(args: argparse.Namespace) -> int:
    # Here, not at start-up: RUN pulls in aiohttp and the chat templates.
    from rollstream.runtime import Stage, StageRuntime
    from stages.eval import EvalStage
    from stages.init import InitStage
    from stages.run import RunStage

    settings = common.start_service(args, parts=(f"stage {args.name}",))
    classes: dict[str, type[Stage]] = {"init": InitStage, "run": RunStage, "eval": EvalStage}
    stage = classes[args.name](settings)
    StageRuntime(stage, settings, drain_timeout_s=args.drain_timeout).run()
    return 0
