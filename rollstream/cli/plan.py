"""`rollstream plan`: replicas per stage, partitions, inference servers and KEDA lag thresholds
for a workload (rollstream.deploy.plan)."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from rollstream.deploy.plan import LAG_SOURCES, PlanError, Workload, plan, render


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan", help="how big a cluster a workload needs (replicas, partitions, servers)",
        description="Turn a task rate, turns per episode and tool / scoring times into replicas "
                    "per stage, partitions, inference servers and each stage's KEDA "
                    "lagThreshold (the Helm chart's stages.<s>.autoscaling.lagThreshold), from "
                    "the CPU per turn and per event the benchmarks measured.")
    defaults = Workload(task_rate=1.0)
    helps = {"task_rate": "tasks published per second", "group_size": "episodes per task",
             "turns": "mean turns per episode",
             "decode_s": "mean inference latency of one turn, seconds",
             "tool_s": "mean tool time per turn, seconds",
             "eval_s": "mean scoring time per episode, seconds",
             "max_in_flight": "events one RUN / EVAL process works on at once",
             "commit_interval_ms": "the stages' commit interval",
             "server_max_num_seqs": "sequences one inference server decodes at once",
             "lag_source": "where KEDA reads the lag, the chart's autoscaling.lagSource: "
                           "status or prometheus (Rollstream's count) or kafka (Kafka's, "
                           "which adds a commit marker per partition)"}
    for f in fields(Workload):
        default = getattr(defaults, f.name)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(default),
                            required=f.name == "task_rate", default=default,
                            choices=LAG_SOURCES if f.name == "lag_source" else None,
                            help=helps[f.name] + ("" if f.name == "task_rate"
                                                  else f" (default {default})"))
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload = Workload(**{f.name: getattr(args, f.name) for f in fields(Workload)})
    try:
        result = plan(workload)
    except PlanError as exc:
        raise SystemExit(f"rollstream plan: {exc}") from exc
    print(json.dumps(result.as_dict(), indent=2) if args.json else render(result))
    return 0
