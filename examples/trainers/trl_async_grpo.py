"""TRL's AsyncGRPOTrainer trained by Rollstream, on the CPU: copy_letter tasks are sampled and
scored (INIT, RUN with the embedded policy server, EVAL), the Rollstream rollout worker puts
their groups on TRL's rollout buffer, and at each weight sync the batches TRL trained on are
committed with a PolicyVersion whose weights `SavedWeights` wrote.

    python examples/trainers/trl_async_grpo.py --steps 3

`token_budget=0` makes TRL batch a fixed number of samples per step: its default (None) asks a
vLLM server for its context length and waits 240 s for one. On a CPU, TRL's two CUDA-only pieces
are replaced (trainer_bridge/adapters/trl_cpu.py). Starts what it needs: the bundled Kafka broker
(or uses --bootstrap-servers), a fresh job's topics, the pipeline as processes, and the tiny
local Qwen2 as the model. Needs `make trainer-deps`.
"""

from __future__ import annotations

import sys

import common

GROUP = 4
GROUPS_PER_STEP = 2


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to train (default 3)")
    args = p.parse_args(argv)
    common.use_trainers()

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from producers.publish import publish, validate_task
    from rollstream.dev import tiny_model
    from rollstream.envs.copy_letter import demo_tasks
    from trainer_bridge.adapters import trl_adapter, trl_cpu
    from trainer_bridge.bridge import TrainerBridge
    from trainer_bridge.groups import GroupPolicy

    if not torch.cuda.is_available():
        trl_cpu.use_cpu()
    settings = common.settings_for(args)
    per_step = GROUPS_PER_STEP * GROUP
    with common.work_dir(args) as work, common.pipeline(settings, work / "logs"):
        model = tiny_model.build(work / "tiny").model
        start, version = trl_adapter.start_from(settings, model)
        # One step's groups more than it trains: TRL fetches the next batch while it steps.
        publish(settings, [validate_task(t) for t in
                           demo_tasks((args.steps + 1) * GROUPS_PER_STEP, GROUP)])
        weights = trl_adapter.SavedWeights(work / "weights")
        config = AsyncGRPOConfig(
            output_dir=str(work / "trl"), per_device_train_batch_size=per_step,
            num_generations=GROUP, max_steps=args.steps, learning_rate=1e-3,
            weight_sync_steps=1, token_budget=0, use_cpu=not torch.cuda.is_available(),
            bf16=False, report_to=[], save_strategy="no", logging_steps=1,
            heartbeat_stale_after_s=300)
        # Every group is handed to TRL, its rewards alike or not (the random tiny policy often
        # scores a whole group 0), so the buffer never waits on dropped groups.
        keep_all = GroupPolicy(drop_zero_variance=False)
        with TrainerBridge(settings, GROUPS_PER_STEP, keep_all) as bridge:
            worker = trl_adapter.RolloutWorker(bridge, per_step, weights, version=version)
            AsyncGRPOTrainer(
                model=str(start), reward_funcs=trl_adapter.rollstream_reward, args=config,
                # Only TRL's own worker reads prompts; this one's come from the scored topic.
                train_dataset=Dataset.from_dict({"prompt": ["rollstream"] * per_step}),
                processing_class=AutoTokenizer.from_pretrained(model), rollout_worker=worker,
                weight_transfer=weights).train()
        print(f"trained {args.steps} steps; published versions "
              f"{[e['version'] for e in worker.published]} on {settings.topics.policy}; "
              f"committed there: {common.committed_versions(settings)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
