"""slime: a rollout function (`--rollout-function-path
trainer_bridge.adapters.slime_adapter.generate_rollout`) returning slime's samples from the
bridge, grouped by prompt.

slime is not on the package registry, so nothing here imports it until `generate_rollout` runs
inside slime; `sample_fields` is the mapping onto the fields of `slime.utils.types.Sample` as its
source defines them (tokens = prompt + response, `loss_mask` and `rollout_log_probs` over the
response only, `weight_versions` one per response token). The tests check it against those
field lists, read from slime's source.

Set `ROLLSTREAM_SLIME_GROUPS` (groups per rollout, default 4) and the usual Rollstream
environment (KAFKA_BOOTSTRAP_SERVERS, ROLLSTREAM_PREFIX). The batch a call returns is
acknowledged at the next call: slime calls the function again only after training on the last.
slime's evaluation calls are refused with the setting that routes them elsewhere
(`--eval-function-path`). slime syncs its weights to its own rollout servers, so no
PolicyVersion is published (said once, at the first call).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trainer_bridge.adapters.sequences import split
from trainer_bridge.bridge import Batch, TrainerBridge
from trainer_bridge.groups import Group, Sample

log = logging.getLogger("rollstream.bridge.slime")

# slime evaluates with the rollout function unless told otherwise: the setting that changes it.
EVAL_REFUSED = (
    "slime called the Rollstream rollout function for evaluation: it serves training rollouts "
    "only (its batches are acknowledged as trained). slime's --eval-function-path defaults to "
    "--rollout-function-path: set --eval-function-path "
    "slime.rollout.sglang_rollout.generate_rollout to evaluate on slime's own servers, or "
    "leave --eval-interval unset")

_state: dict[str, Any] = {}  # the bridge and the batch handed out last, across slime's calls


def sample_fields(sample: Sample, group_index: int, index: int) -> dict[str, Any]:
    """Keyword arguments of slime's Sample for one of ours."""
    q = split(sample)
    trajectory = sample.scored["trajectory"]
    failed = sample.reward is None
    return {
        "group_index": group_index,
        "index": index,
        "rollout_id": index,
        "prompt": trajectory["task"]["prompt"],
        "tokens": q.prompt_ids + q.response_ids,
        "response_length": len(q.response_ids),
        "reward": sample.reward if not failed else 0.0,
        "loss_mask": q.response_mask,
        "rollout_log_probs": q.response_logprobs,
        "weight_versions": [str(v) for v in q.response_versions],
        "status": "failed" if failed else
                  ("truncated" if trajectory["termination"] == "TRUNCATED" else "completed"),
        "metadata": {"episode_id": sample.episode_id, "advantage": sample.advantage},
        "remove_sample": failed,
    }


def group_fields(groups: list[Group], first_index: int = 0) -> list[list[dict[str, Any]]]:
    out, index = [], first_index
    for gi, group in enumerate(groups):
        row = []
        for s in sorted(group.samples, key=lambda s: s.scored["trajectory"]["sample_index"]):
            row.append(sample_fields(s, gi, index))
            index += 1
        out.append(row)
    return out


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.types import Sample as SlimeSample

    if evaluation:
        raise ValueError(EVAL_REFUSED)
    bridge = _state.get("bridge")
    if bridge is None:
        from rollstream.config import load

        groups = int(os.environ.get("ROLLSTREAM_SLIME_GROUPS", "0")) or 4
        bridge = _state["bridge"] = TrainerBridge(load(), groups)
        log.warning("slime updates the weights of its own rollout servers: batches are "
                    "committed without a PolicyVersion, so nothing is published to %s and "
                    "Rollstream's inference servers keep the weights they have",
                    bridge.settings.topics.policy)
    last: Batch | None = _state.pop("batch", None)
    if last is not None:
        last.ack()
    bridge.current_version = rollout_id
    batch = next(bridge.batches(max_batches=1))
    _state["batch"] = batch
    samples = [[_slime_sample(SlimeSample, f) for f in row] for row in group_fields(batch.groups)]
    return RolloutFnTrainOutput(samples=samples, metrics=dict(bridge.stats))


def close() -> None:
    """Close the rollout function's bridge; the batch handed out last stays uncommitted, so the
    next rollout function gets it again."""
    _state.pop("batch", None)
    bridge = _state.pop("bridge", None)
    if bridge is not None:
        bridge.close()


def _slime_sample(cls: Any, fields: dict[str, Any]) -> Any:
    status = cls.Status(fields.pop("status"))
    return cls(**fields, status=status)
