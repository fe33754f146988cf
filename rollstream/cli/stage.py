"""`rollstream stage init|run|eval`: run one stage process (add processes to scale it)."""

from __future__ import annotations

import argparse
import json
import logging
import urllib.request

from rollstream import config
from rollstream.cli import common
from rollstream.config import Settings

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
    from rollstream.consume import heap
    from rollstream.runtime import Stage, StageRuntime
    from stages.eval import EvalStage
    from stages.init import InitStage
    from stages.run import RunStage

    settings = common.start_service(args, parts=(f"stage {args.name}",))
    if args.name == "run":
        warn_without_tokenizer(settings)
    classes: dict[str, type[Stage]] = {"init": InitStage, "run": RunStage, "eval": EvalStage}
    stage = classes[args.name](settings)
    heap.settle()
    StageRuntime(stage, settings, drain_timeout_s=args.drain_timeout).run()
    return 0


def warn_without_tokenizer(settings: Settings) -> None:
    """RUN renders each turn's chat template from --tokenizer-path, else the embedded policy's:
    against any other server (vLLM) that is the wrong template, so say so at start, once per
    server that answers as another (a server not up yet is not asked again)."""
    if settings.inference.tokenizer_path:
        return
    for url in settings.inference.policy_urls():
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=3) as answer:
                cards = json.load(answer).get("data", [])
        except (OSError, ValueError, AttributeError):
            continue
        if cards and not any(card.get("owned_by") == "rollstream" for card in cards):
            logging.getLogger("rollstream").warning(
                "%s serves %s, not the embedded policy, and no --tokenizer-path names its "
                "tokenizer: turns are rendered with the embedded policy's chat template, not "
                "the model's; give --tokenizer-path MODEL_DIR (docs/vllm.md)", url,
                cards[0].get("id"))
