"""`rollstream fleet init|run|eval`: one stage of every RUNNING job, in one process (the shared
fleet; start more processes to scale it, as with `rollstream stage`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rollstream import config
from rollstream.cli import common
from rollstream.cli.stage import STAGES
from rollstream.consume import heap


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "fleet", help="one stage of every running job, in one process",
        description="Follow the cluster's jobs (<prefix>.jobs, `rollstream jobs`) and run one "
                    "stage for every RUNNING job, each under its job's prefix as its own "
                    "consumer group: a job created or resumed is picked up without a restart, "
                    "one paused or cancelled is drained and stopped. RUN's jobs share the "
                    "fleet's inference servers by weight (fair share). See docs/jobs.md.")
    names = parser.add_subparsers(dest="name", metavar="STAGE", required=True)
    for name, (what, groups) in STAGES.items():
        stage = names.add_parser(name, help=f"{what}, for every running job",
                                 description=f"The {name.upper()} stage of every running job: "
                                             f"{what}. --prefix is the cluster's.")
        stage.add_argument("--drain-timeout", type=float, default=30.0,
                           help="seconds to let a stopping job's in-flight events finish "
                                "(default 30)")
        stage.add_argument("--fleet", default=None, metavar="NAME",
                           help="serve the jobs that name this dedicated fleet as their group "
                                "(default: the jobs that name none)")
        if name == "eval":
            stage.add_argument("--sandboxes", type=_count, default=0, metavar="N",
                               help="scorings (each with at most one sandbox) at once across "
                                    "jobs, shared by weight; 0: no bound beyond each job's "
                                    "--max-in-flight")
        config.add_arguments(stage, "kafka", "stage", "service", *groups)
        stage.set_defaults(func=run_fleet)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return int(text)


def run_fleet(args: argparse.Namespace) -> int:
    # Here, not at start-up: RUN pulls in aiohttp and the chat templates.
    from rollstream.inference.routing import Router
    from rollstream.runtime import Stage
    from rollstream.service.fleet import Fleet
    from rollstream.service.quotas import JobQuotas
    from stages.eval import EvalStage
    from stages.init import InitStage
    from stages.run import RunStage

    settings = common.start_service(args)
    router = Router.of(settings.inference)

    def make_stage(job_settings: config.Settings, quotas: JobQuotas,
                   share: Callable[[], int]) -> Stage:
        if args.name == "init":
            return InitStage(job_settings, quotas=quotas)
        if args.name == "eval":
            return EvalStage(job_settings, share=share if args.sandboxes else None,
                             quotas=quotas)
        if quotas.job["policy_urls"]:  # servers of its own: its own router, their room
            return RunStage(job_settings, quotas=quotas)
        if quotas.job["adapter"]:
            # Its adapter on the shared servers: a router that names only that adapter (and
            # counts a server without it as unusable), within the fair share of their slots.
            return RunStage(job_settings, share=share, quotas=quotas)
        return RunStage(job_settings, router=router, share=share, quotas=quotas)

    slots = (lambda: args.sandboxes) if args.name == "eval" else router.slots
    fleet = Fleet(settings, make_stage, fleet=args.fleet, drain_timeout_s=args.drain_timeout,
                  slots=slots)

    async def serve() -> None:
        if args.name == "run":
            await router.start()
        try:
            await fleet.serve()
        finally:
            await router.close()

    fleet.stopping.on_signals()
    heap.settle()
    return common.run_async(serve())
