"""`rollstream bridge`: hand complete groups of scored trajectories to a trainer, in batches."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

from rollstream import config, health
from rollstream.cli import common
from rollstream.graph import PRINTER


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
    parser.add_argument("--group", default=None,
                        help="consumer group (default <prefix>.batch-printer; never the trainer's "
                             "<prefix>.bridge, or the two would split <prefix>.scored)")
    config.add_arguments(parser, "kafka")
    parser.set_defaults(func=run_bridge)

    train = sub.add_parser(
        "train", help="the reference trainer: GRPO on scored groups, publishing policy versions",
        description="Consume <prefix>.scored through the trainer bridge, train the embedded "
                    "policy with GRPO (PPO-clip), save a checkpoint per step and publish its "
                    "PolicyVersion to <prefix>.policy in the transaction that commits the batch. "
                    "Restarts resume from the newest committed version.")
    train.add_argument("--checkpoint-dir", type=Path, required=True,
                       help="where policy-v<N>.safetensors are written (servers must read it)")
    train.add_argument("--init-checkpoint", type=Path, default=None,
                       help="weights of version 0 when <prefix>.policy is empty (default: seed)")
    train.add_argument("--hf-model", type=Path, default=None,
                       help="train a Hugging Face causal LM from this local directory (GPU when "
                            "present; needs the `hf` extra) instead of the embedded policy")
    train.add_argument("--groups-per-batch", type=int, default=4)
    train.add_argument("--max-staleness", type=int, default=None,
                       help="drop samples more than this many versions behind (default: keep)")
    train.add_argument("--dr-grpo", action="store_true",
                       help="advantages without std normalization (Dr. GRPO)")
    train.add_argument("--group-timeout", type=float, default=300.0,
                       help="seconds to wait for a group's missing samples")
    train.add_argument("--incomplete", choices=("drop", "partial"), default="drop",
                       help="what to do with a group that timed out")
    train.add_argument("--keep-zero-variance", action="store_true",
                       help="train on groups whose rewards are all equal (no signal: dropped)")
    train.add_argument("--lr", type=float, default=3e-3)
    train.add_argument("--clip-eps", type=float, default=0.2)
    train.add_argument("--max-steps", type=int, default=None)
    train.add_argument("--idle-timeout", type=float, default=None,
                       help="stop after this many seconds without new events")
    config.add_arguments(train, "kafka", "service")
    train.set_defaults(func=run_train)


def batch_summary(batch) -> dict:
    rewards = [s.reward for s in batch.samples if s.reward is not None]
    return {
        "groups": len(batch.groups),
        "samples": len(batch.samples),
        "tasks": [g.task_id for g in batch.groups],
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "failure_classes": sorted({s.scored["failure_class"] for s in batch.samples}),
    }


def run_train(args: argparse.Namespace) -> int:
    import torch

    from trainer_bridge.groups import GroupPolicy
    from trainer_bridge.train_loop import train
    from trainer_bridge.trainer import GRPOConfig

    if args.hf_model is None:
        # The embedded policy's ops are too small to gain from more threads, and threads that
        # meet at every op crawl on a busy machine (a step: 6 s on one, 11-65 s on two, load 20).
        torch.set_num_threads(1)
    settings = common.start_service(args)
    health.component("bridge", "loading the model")  # the bridge takes it over once it joins
    policy = GroupPolicy(normalize_std=not args.dr_grpo, max_staleness=args.max_staleness,
                         group_timeout_s=args.group_timeout, incomplete=args.incomplete,
                         drop_zero_variance=not args.keep_zero_variance)
    train(settings, args.checkpoint_dir, groups_per_batch=args.groups_per_batch,
          group_policy=policy, config=GRPOConfig(lr=args.lr, clip_eps=args.clip_eps),
          init_checkpoint=args.init_checkpoint, hf_model=args.hf_model,
          max_steps=args.max_steps,
          idle_timeout_s=args.idle_timeout)
    return 0


def run_bridge(args: argparse.Namespace) -> int:
    from rollstream.transaction import Rewind
    from trainer_bridge.bridge import TrainerBridge

    settings = common.start_service(args)
    group = args.group or settings.topics.group(PRINTER)
    printed = 0
    while args.max_batches is None or printed < args.max_batches:
        left = None if args.max_batches is None else args.max_batches - printed
        try:
            with TrainerBridge(settings, groups_per_batch=args.groups_per_batch,
                               group=group) as bridge:
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
