"""A sample as prompt and response: the cut every trainer's rollout type makes.

The prompt is the sequence up to the first sampled token; the response is everything after it,
sampled tokens (mask 1) and, in multi-turn episodes, the observations between them (mask 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer_bridge.groups import Sample
from trainer_bridge.tensors import columns


@dataclass(frozen=True)
class Sequence:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1 on tokens the policy sampled, 0 on observations
    response_logprobs: list[float]  # the server's logprob of each sampled token, 0.0 elsewhere
    response_versions: list[int]  # the policy version that sampled each token, -1 elsewhere
    num_turns: int


def split(sample: Sample) -> Sequence:
    ids, mask, logprobs, versions = columns(sample)
    sampled = np.flatnonzero(mask)
    if sampled.size == 0:
        raise ValueError(f"episode {sample.episode_id} has no sampled token to train on")
    cut = int(sampled[0])
    return Sequence(
        prompt_ids=ids[:cut].astype(np.int64).tolist(),
        response_ids=ids[cut:].astype(np.int64).tolist(),
        response_mask=mask[cut:].astype(np.int64).tolist(),
        response_logprobs=np.where(mask[cut:], logprobs[cut:], 0.0).astype(float).tolist(),
        response_versions=versions[cut:].astype(np.int64).tolist(),
        num_turns=len(sample.scored["trajectory"]["turns"]),
    )
