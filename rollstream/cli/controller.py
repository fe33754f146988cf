"""`rollstream controller`: apply each policy version on <prefix>.policy to every inference
server."""

from __future__ import annotations

import argparse

from rollstream import config
from rollstream.cli import common


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "controller", help="apply each policy version on <prefix>.policy to every server",
        description="Consume <prefix>.policy and load each new PolicyVersion into every "
                    "inference server in --policy-url / --policy-url-file: LoRA adapters via "
                    "/v1/load_lora_adapter, full weights via the embedded server's "
                    "/v1/load_weights or vLLM's dev-mode pause / reload_weights / resume "
                    "(vLLM 0.33: from the event's path, with native weight labels; vLLM "
                    "0.12: in place, from the path the server was started with). With "
                    "--adapter, only that job's LoRA adapters (<adapter>-v<N>) are loaded and "
                    "unloaded, on servers other jobs share.")
    common.add_job_argument(parser, "apply the policy versions")
    config.add_arguments(parser, "kafka", "service", "inference")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rollstream.controller.apply import Controller  # aiohttp only when it runs

    # With --job: the job's policy topic and its adapter, from the job's record.
    settings, _ = common.for_job(common.start_service(args, parts=("controller",)), args.job)
    controller = Controller(settings)
    return common.run_async(controller.serve(), on_signal=controller.stop)
