"""`rollstream train`: the reference trainer, GRPO on scored groups, publishing policy versions."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollstream import config
from rollstream.cli import common


def register_cli(sub: argparse._SubParsersAction) -> None:
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
                       help="drop samples more than this many versions behind (default: the "
                            "job's max_staleness with --job, else keep)")
    train.add_argument("--dr-grpo", action="store_true",
                       help="advantages without std normalization (Dr. GRPO)")
    train.add_argument("--group-timeout", type=float, default=300.0,
                       help="seconds to wait for a group's missing samples")
    train.add_argument("--incomplete", choices=("drop", "partial"), default=None,
                       help="a group that lost a sample for good (it timed out, or its infra "
                            "retries were spent): drop it whole or train on the rest (default: "
                            "the job's group_policy with --job, else drop)")
    train.add_argument("--keep-zero-variance", action="store_true",
                       help="train on groups whose rewards are all equal (no signal: dropped)")
    train.add_argument("--lr", type=float, default=3e-3)
    train.add_argument("--clip-eps", type=float, default=0.2)
    train.add_argument("--max-steps", type=int, default=None)
    train.add_argument("--idle-timeout", type=float, default=None,
                       help=("stop after this many seconds without new events (joining the group, "
                             "up to a minute, does not count)"))
    common.add_job_argument(train, "train on the scored trajectories and publish the policy")
    config.add_arguments(train, "kafka", "service")
    train.set_defaults(func=run_train)




def run_train(args: argparse.Namespace) -> int:
    from rollstream.telemetry import metrics
    from trainer_bridge.groups import GroupPolicy
    from trainer_bridge.train_loop import train
    from trainer_bridge.trainer import GRPOConfig

    settings, job = common.for_job(common.start_service(args, parts=("bridge",)), args.job)
    common.check_rights(settings, "scored", "policy")
    max_staleness = args.max_staleness
    if max_staleness is None and job is not None and job["max_staleness"]:
        max_staleness = job["max_staleness"]
    incomplete = args.incomplete or (job["group_policy"] if job is not None else "drop")
    policy = GroupPolicy(normalize_std=not args.dr_grpo, max_staleness=max_staleness,
                         group_timeout_s=args.group_timeout, incomplete=incomplete,
                         drop_zero_variance=not args.keep_zero_variance)
    # A job's trainer counts what it drops under the job's label, as the fleet its stages.
    context = metrics.job_context(job["name"] if job is not None else "")
    context.run(train, settings, args.checkpoint_dir, groups_per_batch=args.groups_per_batch,
                group_policy=policy, config=GRPOConfig(lr=args.lr, clip_eps=args.clip_eps),
                init_checkpoint=args.init_checkpoint, hf_model=args.hf_model,
                max_steps=args.max_steps, idle_timeout_s=args.idle_timeout)
    return 0


