"""Is the trainer bridge a bottleneck? Trajectories/s from <p>.scored into tensor batches, at
8k tokens per trajectory, against the rate at which the demo's closed loop produces rollouts,
both measured in this run on the same broker.

1. rollout rate: the closed loop of `make demo` (policy server, controller, INIT, RUN, EVAL,
   trainer) with the demo's task count; episodes scored per second from the publish to the last
   one scored, as the demo's summary reports it.
2. bridge rate: N scored trajectories of 8k tokens (one turn: 6k prompt + 2k sampled tokens, in
   groups of 8 with varied rewards) pre-filled into a fresh scored topic; a TrainerBridge decodes,
   groups, computes advantages, builds the tensor batch (`to_tensors`) and acks each batch
   (offsets committed). Trajectories/s from the first batch request to the last ack.
Target: bridge rate >= 10 x rollout rate.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from benchmarks import print_table, write_result
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec, pack_ids, pack_logprobs
from rollstream.contracts.events import SCORED_TRAJECTORY
from rollstream.dev.loop import LoopConfig

NAME = "bridge"
TARGET_RATIO = 10.0
TOKENS = 8192
GROUP = 8


def rollout_rate(bootstrap: str, tasks: int) -> dict[str, Any]:
    from producers.publish import publish
    from rollstream.dev.loop import ClosedLoop

    prefix = f"bench-{uuid.uuid4().hex[:8]}-loop"
    create_topics(bootstrap, prefix, 4)
    settings = load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)
    with TemporaryDirectory() as tmp:
        loop = ClosedLoop(settings, Path(tmp), LoopConfig(tasks=tasks))
        try:
            loop.start()
            published = time.time()
            publish(settings, loop.tasks())
            for progress in loop.follow(deadline=time.time() + 300):
                if len(progress.scored) >= tasks * GROUP:
                    break
        finally:
            loop.stop()
            delete_topics(bootstrap, prefix)
    times = progress.scored_times
    return {"tasks": tasks, "episodes": len(times),
            "episodes_per_s": round(len(times) / (times[-1] - published), 1)}


def scored_event(task: int, index: int, rng: np.random.Generator, tokens: int = TOKENS) -> bytes:
    prompt, completion = tokens * 3 // 4, tokens // 4
    turn = {"index": 0, "prompt_ids": pack_ids(rng.integers(0, 150_000, prompt, dtype=np.int32)),
            "completion_ids": pack_ids(rng.integers(0, 150_000, completion, dtype=np.int32)),
            "logprobs": pack_logprobs(-rng.random(completion, dtype=np.float32)),
            "policy_version": 0, "finish_reason": "stop", "started_at_ms": 1, "inference_ms": 1.0}
    task_event = {"task_id": f"t{task}", "env": "copy_letter", "prompt": "x",
                  "data": '{"letter": "a"}', "group_size": GROUP}
    trajectory = {"episode_id": f"t{task}#{index}", "task": task_event, "sample_index": index,
                  "turns": [turn], "termination": "DONE", "started_at_ms": 1}
    return codec().encode(SCORED_TRAJECTORY, {
        "trajectory": trajectory, "reward": float(index % 3) / 2, "failure_class": "ok",
        "scored_at_ms": 2})


def scored_topic(bootstrap: str, name: str, trajectories: int, tokens: int = TOKENS) -> Settings:
    """Fresh topics (prefix `bench-<id>-<name>`) whose scored topic holds `trajectories`
    scored events in groups of GROUP."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}-{name}"
    create_topics(bootstrap, prefix, 4)
    settings = load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)
    rng = np.random.default_rng(0)
    producer = kafka.producer(settings)
    for n in range(trajectories):
        task, index = divmod(n, GROUP)
        kafka.produce(producer, settings.topics.scored, scored_event(task, index, rng, tokens),
                      key=f"t{task}#{index}")
    producer.flush(60)
    return settings


def bridge_rate(bootstrap: str, trajectories: int) -> dict[str, Any]:
    from trainer_bridge.bridge import TrainerBridge
    from trainer_bridge.tensors import to_tensors

    settings = scored_topic(bootstrap, "bridge", trajectories)
    groups_per_batch = 4
    try:
        with TrainerBridge(settings, groups_per_batch) as bridge:
            start = time.perf_counter()
            tokens = seen = 0
            for batch in bridge.batches(trajectories // (GROUP * groups_per_batch),
                                        idle_timeout_s=30):
                tensors = to_tensors(batch.trainable)
                tokens += int(tensors.attention_mask.sum())
                seen += len(batch.samples)
                batch.ack()
            elapsed = time.perf_counter() - start
    finally:
        delete_topics(bootstrap, settings.prefix)
    return {"trajectories": seen, "tokens_per_trajectory": TOKENS,
            "tokens_in_batches": tokens, "seconds": round(elapsed, 3),
            "trajectories_per_s": round(seen / elapsed, 1),
            "tokens_per_s": round(tokens / elapsed)}


def run(quick: bool = False) -> dict[str, Any]:
    bootstrap = local.resolve_bootstrap()
    rollout = rollout_rate(bootstrap, tasks=60 if quick else LoopConfig().tasks)
    bridge = bridge_rate(bootstrap, trajectories=256 if quick else 1024)
    ratio = round(bridge["trajectories_per_s"] / rollout["episodes_per_s"], 2)
    doc = {
        "quick": quick,
        "parameters": {"tokens_per_trajectory": TOKENS, "group_size": GROUP,
                       "bridge": "decode + group + GRPO advantages + to_tensors + ack (offset "
                                 "commit) per batch of 4 groups",
                       "rollouts": "the demo's closed loop (copy_letter, embedded policy)"},
        "results": {"rollouts": rollout, "bridge": bridge},
        "baseline": {"design": "demo closed-loop rollout rate",
                     "episodes_per_s": rollout["episodes_per_s"]},
        "ratio": ratio,
        "ratio_meaning": "bridge trajectories/s at 8k tokens / demo episodes/s",
        "target": {"description": f"bridge >= {TARGET_RATIO}x the demo's rollout rate",
                   "ratio": ratio, "met": ratio >= TARGET_RATIO},
    }
    path = write_result(NAME, doc)
    print_table(f"bridge vs rollouts -> results/{path.name}", ["what", "per second", "ratio"], [
        ["demo rollouts (episodes)", rollout["episodes_per_s"], ""],
        [f"bridge ({TOKENS}-token trajectories)", bridge["trajectories_per_s"], ratio]])
    print(f"  target: ratio {ratio} >= {TARGET_RATIO} -> "
          f"{'MET' if doc['target']['met'] else 'NOT MET'}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
