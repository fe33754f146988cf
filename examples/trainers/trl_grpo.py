"""TRL's GRPOTrainer trained by Rollstream, on the CPU: the trainer's prompts go out as tasks
(copy_letter: "Say a" is answered well by "a"), INIT, RUN (the embedded policy server) and EVAL
sample and score `--group-size` completions of each, and each step trains on one batch of those
groups; each step's weights are a committed PolicyVersion on `<prefix>.policy`.

    python examples/trainers/trl_grpo.py --steps 3

Starts what it needs: the bundled Kafka broker (or uses --bootstrap-servers), a fresh job's
topics (or --prefix's), the pipeline as processes, and the tiny local Qwen2 as the model (or
--model DIR, a Hugging Face model directory). The versions are written as `save_pretrained`
directories, which vLLM loads (the embedded server samples byte-level tokens of its own model
and cannot load them).
With --vllm, RUN samples from vLLM's CPU build serving the model and `rollstream controller`
applies each version to it; the script then waits for the server to report the last one.
Needs `make trainer-deps` (and `make vllm-deps` for --vllm).
"""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import common

from rollstream.config import Settings

GROUPS_PER_STEP = 2


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to train (default 3)")
    p.add_argument("--group-size", type=int, default=4,
                   help="samples per prompt, TRL's num_generations (default 4)")
    p.add_argument("--model", type=Path, default=None,
                   help="a Hugging Face model directory (default: the tiny local Qwen2)")
    p.add_argument("--vllm", action="store_true",
                   help="sample from vLLM's CPU build serving the model (`make vllm-deps`), "
                        "the controller applying each version TRL publishes to it")
    args = p.parse_args(argv)
    common.use_trainers()

    from rollstream.dev import tiny_model

    settings = common.settings_for(args)
    with common.work_dir(args) as work:
        model = args.model or tiny_model.build(work / "tiny").model
        with common.pipeline(settings, work / "logs", model if args.vllm else None) as url:
            train(args, settings, work, model, url)
    return 0


def train(args: Namespace, settings: Settings, work: Path, model: Path, url: str) -> None:
    """TRL's GRPOTrainer in service mode: its prompts out as tasks, their groups back."""
    from trainer_bridge.adapters import trl_adapter
    from trainer_bridge.bridge import TrainerBridge
    from trainer_bridge.groups import GroupPolicy

    start, version = trl_adapter.start_from(settings, model)  # newest committed weights
    # Service mode hands TRL the group of every prompt it asked for, zero variance or not.
    with TrainerBridge(settings, GROUPS_PER_STEP, GroupPolicy(drop_zero_variance=False)) as bridge:
        rollouts = trl_adapter.TaskRollouts(
            bridge, work / "checkpoints", env="copy_letter",
            data=lambda prompt: {"letter": prompt[-1]}, version=version,
            idle_timeout_s=300)
        prompts = [f"Say {c}" for c in "abcdefgh"]
        trainer = trl_adapter.grpo_trainer(
            rollouts, model, start, prompts, max_steps=args.steps,
            groups_per_batch=GROUPS_PER_STEP, num_generations=args.group_size,
            use_cpu=True)
        trainer.train()
    published = [e["version"] for e in rollouts.published]
    print(f"trained {args.steps} steps; published versions {published} on "
          f"{settings.topics.policy}; committed there: {common.committed_versions(settings)}",
          flush=True)
    if args.vllm and published:
        print(f"{url} serves version {common.served_version(url, published[-1])}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
