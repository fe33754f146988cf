"""verl's agent loop fed by Rollstream: each dataset row becomes one copy_letter task of
`rollout.n` samples, and each of verl's `run()` calls returns one scored sample of it as verl's
`AgentLoopOutput` (reward from EVAL). The loops are made from verl's registry as its
AgentLoopWorker makes them; a group is committed once verl has all of it.

    python examples/trainers/verl_agent_loop.py --rows 2

Starts what it needs: the bundled Kafka broker (or uses --bootstrap-servers), a fresh job's
topics, the pipeline as processes, and the tiny local Qwen2's tokenizer. In a verl training run
the same two lines configure it: the agent loop config names `rollstream`
(`_target_: trainer_bridge.adapters.verl_adapter.RollstreamAgentLoop`), and the worker sets
`RollstreamAgentLoop.source = GroupSource(settings, env=..., data=...)`. Needs
`make trainer-deps`.
"""

from __future__ import annotations

import asyncio
import sys

import common


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2, help="dataset rows (default 2)")
    p.add_argument("--n", type=int, default=4, help="verl's rollout.n (default 4)")
    args = p.parse_args(argv)
    common.use_trainers()

    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import agent_loop as verl

    from rollstream.dev import tiny_model
    from trainer_bridge.adapters.verl_adapter import GroupSource, RollstreamAgentLoop

    settings = common.settings_for(args)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": args.n}}, "data": {}})
    rows = [{"raw_prompt": [{"role": "user", "content": f"Say {c}"}], "index": i}
            for i, c in enumerate("abcdefghij"[:args.rows])]
    with common.work_dir(args) as work, common.pipeline(settings, work / "logs"):
        tokenizer = AutoTokenizer.from_pretrained(tiny_model.build(work / "tiny").model)

        async def one(row: dict) -> verl.AgentLoopOutput:
            loop = hydra.utils.instantiate(
                config=verl._agent_loop_registry["rollstream"],
                trainer_config=verl.DictConfigWrap(config=config), server_manager=None,
                tokenizer=tokenizer, processor=None, hf_model_type=None, dataset_cls=None,
                data_config=verl.DictConfigWrap(config.data), tools=verl.ToolListWrap([]))
            return await loop.run({"temperature": 1.0}, **row)

        async def rollouts() -> list[verl.AgentLoopOutput]:  # each row rollout.n times
            return await asyncio.gather(*(one(row) for row in rows for _ in range(args.n)))

        RollstreamAgentLoop.source = GroupSource(settings, env="copy_letter",
                                                 data=lambda prompt: {"letter": prompt[-1]})
        try:
            outputs = asyncio.run(rollouts())
        finally:
            RollstreamAgentLoop.source.close()
            RollstreamAgentLoop.source = None
    for r, row in enumerate(rows):
        group = outputs[r * args.n:(r + 1) * args.n]
        print(f"row {r} ({row['raw_prompt'][-1]['content']!r}): {len(group)} samples, rewards "
              f"{[out.reward_score for out in group]}, episodes "
              f"{sorted(out.extra_fields['episode_id'] for out in group)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
