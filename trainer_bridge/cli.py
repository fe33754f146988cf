"""`rollstream bridge`: hand complete groups of scored trajectories to a trainer, in batches."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

from rollstream import config


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bridge", help="consume scored trajectories as batches of complete groups",
        description="Read <prefix>.scored, assemble each task's group, and print one JSON line "
                    "per batch (the built-in consumer; trainers use trainer_bridge.TrainerBridge). "
                    "Offsets are committed after each batch is handled.")
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--max-batches", type=int, default=None, help="stop after N batches")
    parser.add_argument("--idle-timeout", type=float, default=None,
                        help="stop after this many seconds without new events")
    config.add_arguments(parser)
    parser.set_defaults(func=run_bridge)


def batch_summary(batch) -> dict:
    rewards = [s.scored["reward"] for s in batch.samples if s.scored["reward"] is not None]
    return {
        "groups": len(batch.groups),
        "samples": len(batch.samples),
        "tasks": [g.task_id for g in batch.groups],
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "failure_classes": sorted({s.scored["failure_class"] for s in batch.samples}),
    }


def run_bridge(args: argparse.Namespace) -> int:
    from rollstream.broker.local import resolve_bootstrap
    from trainer_bridge.bridge import TrainerBridge

    settings = config.load(args)
    settings = dataclasses.replace(
        settings, bootstrap_servers=resolve_bootstrap(settings.bootstrap_servers))
    with TrainerBridge(settings, groups_per_batch=args.groups_per_batch) as bridge:
        for batch in bridge.batches(args.max_batches, args.idle_timeout):
            print(json.dumps(batch_summary(batch)), flush=True)
            batch.ack()
    return 0
