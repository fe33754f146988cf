"""Tinker fed by Rollstream: copy_letter tasks are sampled and scored (INIT, RUN with the embedded
policy server, EVAL), and each bridge batch becomes Tinker `Datum`s (the sequence, its targets,
the sampling server's logprobs and the group advantages) for Tinker's importance-sampling loss.

    python examples/trainers/tinker_train.py --steps 2

Tinker trains on its own service: with TINKER_API_KEY set (and --base-model one of its models),
each batch goes to `forward_backward(..., "importance_sampling")` and `optim_step` of a LoRA
training client before it is acknowledged. Without a key it is a dry run: the data is built
with the real `tinker` types and checked, each batch acknowledged, nothing sent. Starts what it
needs: the bundled Kafka broker (or uses --bootstrap-servers), a fresh job's topics, the
pipeline as processes. Needs `make trainer-deps`.
"""

from __future__ import annotations

import os
import sys

import common


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2, help="batches to train on (default 2)")
    p.add_argument("--base-model", default="Qwen/Qwen3-4B-Instruct-2507",
                   help="the Tinker model to train, with TINKER_API_KEY set")
    args = p.parse_args(argv)
    common.use_trainers()

    import tinker

    from producers.publish import publish, validate_task
    from rollstream.envs.copy_letter import demo_tasks
    from trainer_bridge.adapters.tinker_adapter import data
    from trainer_bridge.bridge import TrainerBridge
    from trainer_bridge.groups import GroupPolicy

    client = None
    if os.environ.get("TINKER_API_KEY"):
        client = tinker.ServiceClient().create_lora_training_client(base_model=args.base_model)
    else:
        print("TINKER_API_KEY is not set: a dry run (Tinker data built and checked, nothing "
              "sent)", flush=True)
    settings = common.settings_for(args)
    with common.work_dir(args) as work, common.pipeline(settings, work / "logs"):
        publish(settings, [validate_task(t) for t in demo_tasks(args.steps, 8)])
        # Every group, its rewards alike or not, so that each task makes one step here (the
        # random tiny policy often scores a whole group 0); a real run drops those.
        with TrainerBridge(settings, 1, GroupPolicy(drop_zero_variance=False)) as bridge:
            for step, batch in enumerate(bridge.batches(args.steps, idle_timeout_s=120), 1):
                datums = data(batch.trainable)
                assert all(isinstance(d, tinker.Datum) for d in datums)
                if client is not None:
                    client.forward_backward(datums, "importance_sampling").result()
                    client.optim_step(adam_params=tinker.AdamParams(learning_rate=1e-4)).result()
                batch.ack()  # committed once Tinker has taken it
                tokens = sum(d.model_input.length for d in datums)
                print(f"step {step}: {len(datums)} Tinker datums, {tokens} input tokens",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
