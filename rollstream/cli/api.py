"""`rollstream api`: ProRL Agent's and Polar's rollout APIs over HTTP, on the jobs' topics."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rollstream import config
from rollstream.cli import common

if TYPE_CHECKING:
    from rollstream.envs.base import Environment


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "api", help="the HTTP API: ProRL Agent's /process and Polar's task API, per job",
        description="Serve ProRL Agent's legacy server API (/start, /stop, /status, "
                    "/add_llm_server, /clear_llm_server, /process, /cancel) and Polar's task "
                    "API (/rollout/task/submit, GET and DELETE /rollout/task/ID, /events, "
                    "result callbacks) over a job's topics: each call is a task on "
                    "<job prefix>.tasks, its result read from <job prefix>.scored. Callers "
                    "send a bearer token of their job (`rollstream jobs token create JOB`); "
                    "the root paths serve the token's job, /jobs/JOB/... a named one. State "
                    "is the log's: run as many processes as needed, restart any. --prefix is "
                    "the cluster's (its jobs topic). /metrics, /health and /ready are on "
                    "--metrics-port. See docs/api.md.")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument("--api-port", type=int, default=8006,
                        help="port of the API (default 8006, ProRL Agent's; the probes and "
                             "/metrics are on --metrics-port)")
    parser.add_argument("--job", metavar="NAME", default=None,
                        help="serve this job only: every other job's token is refused (403)")
    parser.add_argument("--tls-cert", metavar="FILE", default=None,
                        help="serve HTTPS with this certificate (PEM chain; with --tls-key)")
    parser.add_argument("--tls-key", metavar="FILE", default=None,
                        help="the certificate's private key (PEM)")
    parser.add_argument("--process-timeout", type=float, default=3600.0, metavar="S",
                        help="how long /process holds a call open for its trajectory; past it "
                             "504, and the same job_id again picks the rollout up (default "
                             "3600)")
    parser.add_argument("--callback-attempts", type=int, default=12, metavar="N",
                        help="tries of a result callback, backing off 0.5 s to 60 s between "
                             "them, before polling is left to have it (default 12)")
    parser.add_argument("--deadline-grace", type=float, default=30.0, metavar="S",
                        help="a Polar task is over this long after its deadline "
                             "(timeout_seconds), its unscored sessions TIMEOUT: results scored "
                             "in time may still be committing (default 30)")
    parser.add_argument("--fixed-llm-servers", action="store_true",
                        help="/add_llm_server and /clear_llm_server change nothing (default: "
                             "they set the job's own inference servers, its policy_urls)")
    config.add_arguments(parser, "kafka", "service", "bounds")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from producers.publish import checked_task  # the checks `rollstream publish` makes
    from rollstream.api.router import ApiServer, tls_context

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("rollstream api: --tls-cert and --tls-key go together")
    if args.process_timeout <= 0 or args.callback_attempts < 1 or args.deadline_grace < 0:
        raise SystemExit("rollstream api: --process-timeout must be above 0, "
                         "--callback-attempts at least 1, --deadline-grace 0 or more")
    tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    settings = common.start_service(args, parts=("api",))
    envs: dict[str, Environment] = {}  # each environment looked up once
    server = ApiServer(
        settings, lambda task: checked_task(task, envs, settings), host=args.host,
        port=args.api_port, job=args.job, timeout_s=args.process_timeout,
        fixed_llm_servers=args.fixed_llm_servers, callback_attempts=args.callback_attempts,
        deadline_grace_s=args.deadline_grace, tls=tls)
    return common.run_async(server.serve(), on_signal=server.stop)
