"""`rollstream bridge`: hand complete groups of scored trajectories to a trainer, in batches
printed as JSON lines (the built-in consumer; trainers use trainer_bridge.TrainerBridge)."""

from __future__ import annotations

import argparse
import json
import logging
import statistics

from rollstream import config
from rollstream.cli import common
from rollstream.contracts.graph import PRINTER


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bridge", help="consume scored trajectories as batches of complete groups",
        description="Read <prefix>.scored, assemble each task's group, and print one JSON line "
                    "per batch (the built-in consumer; trainers use trainer_bridge.TrainerBridge). "
                    "Offsets are committed after each batch is handled.")
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--max-batches", type=int, default=None, help="stop after N batches")
    parser.add_argument("--idle-timeout", type=float, default=None,
                        help=("stop after this many seconds without new events (joining the group, "
                              "up to a minute, does not count)"))
    parser.add_argument("--keep-zero-variance", action="store_true",
                        help="hand out groups whose rewards are all equal too (a trainer drops "
                             "them: they carry no signal; by default so does this)")
    parser.add_argument("--group", default=None,
                        help="consumer group (default <prefix>.batch-printer; never the trainer's "
                             "<prefix>.bridge, or the two would split <prefix>.scored)")
    config.add_arguments(parser, "kafka")
    parser.set_defaults(func=run_bridge)


def batch_summary(batch) -> dict:
    rewards = [s.reward for s in batch.samples if s.reward is not None]
    return {
        "groups": len(batch.groups),
        "samples": len(batch.samples),
        "tasks": [g.task_id for g in batch.groups],
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "failure_classes": sorted({s.scored["failure_class"] for s in batch.samples}),
    }


def run_bridge(args: argparse.Namespace) -> int:
    from rollstream.cluster.transaction import Rewind
    from trainer_bridge.bridge import TrainerBridge
    from trainer_bridge.groups import GroupPolicy

    settings = common.start_service(args, parts=("bridge",))
    group = args.group or settings.topics.group(PRINTER)
    printed = 0
    while args.max_batches is None or printed < args.max_batches:
        left = None if args.max_batches is None else args.max_batches - printed
        try:
            with TrainerBridge(settings, groups_per_batch=args.groups_per_batch, group=group,
                               policy=GroupPolicy(drop_zero_variance=not args.keep_zero_variance)
                               ) as bridge:
                for batch in bridge.batches(left, args.idle_timeout):
                    print(json.dumps(batch_summary(batch)), flush=True)
                    printed += 1
                    batch.ack()
            break
        except Rewind as exc:
            # A commit the group refused or a consumer that failed (a broker restart): join
            # again; what was not committed comes back (at least once).
            logging.getLogger("trainer_bridge").warning(
                "bridge: %s; joining the group again from the committed offsets", exc)
    return 0
