"""TRL's GRPOTrainer trained by Rollstream, on the CPU: the trainer's prompts go out as tasks
(copy_letter: "Say a" is answered well by "a"), INIT, RUN (the embedded policy server) and EVAL
sample and score `--group-size` completions of each, and each step trains on one batch of those
groups; each step's weights are a committed PolicyVersion on `<prefix>.policy`.

    python examples/trainers/trl_grpo.py --steps 3

Starts what it needs: the bundled Kafka broker (or uses --bootstrap-servers), a fresh job's
topics (or --prefix's), the pipeline as processes, and the tiny local Qwen2 as the model (or
--model DIR, a Hugging Face model directory). The versions are written as `save_pretrained`
directories, which vLLM loads (the embedded server samples byte-level tokens of its own model
and cannot: run `rollstream controller` with vLLM servers for them, docs/inference.md).
Needs `make trainer-deps`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import common

GROUPS_PER_STEP = 2


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to train (default 3)")
    p.add_argument("--group-size", type=int, default=4,
                   help="samples per prompt, TRL's num_generations (default 4)")
    p.add_argument("--model", type=Path, default=None,
                   help="a Hugging Face model directory (default: the tiny local Qwen2)")
    args = p.parse_args(argv)
    common.use_trainers()

    from rollstream.dev import tiny_model
    from trainer_bridge.adapters import trl_adapter
    from trainer_bridge.bridge import TrainerBridge
    from trainer_bridge.groups import GroupPolicy

    settings = common.settings_for(args)
    with common.work_dir(args) as work, common.pipeline(settings, work / "logs"):
        model = args.model or tiny_model.build(work / "tiny").model
        start, version = trl_adapter.start_from(settings, model)  # newest committed weights
        # Service mode hands TRL the group of every prompt it asked for, zero variance or not.
        with TrainerBridge(settings, GROUPS_PER_STEP, GroupPolicy(drop_zero_variance=False),
                           transactional=True) as bridge:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
