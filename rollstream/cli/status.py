"""`rollstream status`: the pipeline of one prefix at a glance, once or live."""

from __future__ import annotations

import argparse
import json
import time

from rollstream import config
from rollstream.cli import common
from rollstream.ops.status import STAGE_GROUPS, Inspector, render
from rollstream.telemetry import health, metrics

# What status reads: each stage group's input, dead letters and policy versions.
SHOWN_TOPICS = (*dict.fromkeys(attr for _, _, attr in STAGE_GROUPS), "dlq", "policy")


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "status", help="stage groups, lag, rates, dead letters, policy version, servers",
        description="Show the pipeline of one prefix: per stage group its members and "
                    "partitions, lag (events waiting past its committed offsets; '~' marks an "
                    "estimate when very many wait), events/s over the interval, in-flight "
                    "events (with --metrics-url); dead letters; the newest policy version; "
                    "inference servers' health and load (--policy-url). With --job and the "
                    "fleet's --metrics-url: the job's episodes, turns, sampled tokens, dead "
                    "letters, server and sandbox time and staleness. With --watch and "
                    "--metrics-port it also serves lag, members, committed offsets, dead "
                    "letters and the policy version as Prometheus gauges.")
    parser.add_argument("--json", action="store_true", help="print one JSON object per refresh")
    parser.add_argument("--watch", action="store_true", help="refresh until interrupted")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between looks (the events/s window)")
    parser.add_argument("--metrics-url", action="append", default=[],
                        help="a process's /metrics URL, for in-flight counts (repeatable)")
    common.add_job_argument(parser, "show the pipeline")
    config.add_arguments(parser, "kafka", "command", "service", "inference")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings, _ = common.for_job(common.settings(args), args.job)
    # Topics missing are a configuration error (exit 78, naming the topic), as for every
    # one-shot command, not a failure further in.
    settings = common.checked(settings, *SHOWN_TOPICS)
    # Only a watching status runs long enough to serve metrics and probes (its port logged).
    if args.watch:
        common.log_to_stderr()
    metrics.serve(settings.service.metrics_port if args.watch else metrics.OFF)
    ready = health.component("status", "first look at the pipeline")
    inspector = Inspector(settings, args.metrics_url, job=args.job)
    try:
        metrics.pipeline_status(inspector.snapshot())  # the first look: rates need two
        ready.ready()
        if args.json:
            while True:
                time.sleep(args.interval)
                snapshot = inspector.snapshot()
                metrics.pipeline_status(snapshot)
                print(json.dumps(snapshot), flush=True)
                if not args.watch:
                    return 0
        from rich.live import Live

        time.sleep(args.interval)
        if not args.watch:
            from rich.console import Console

            Console().print(render(inspector.snapshot()))
            return 0
        with Live(render(inspector.snapshot()), auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                snapshot = inspector.snapshot()
                metrics.pipeline_status(snapshot)
                live.update(render(snapshot), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        inspector.close()
