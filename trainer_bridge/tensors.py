"""Batches as torch tensors: what a policy-gradient step needs, token for token.

Each sample's sequence is its turns' `prompt_ids + completion_ids` concatenated: exactly the ids
the servers saw and sampled (no re-tokenization). The loss mask covers only sampled tokens,
never prompts or observations. `old_logprobs` are the sampled tokens' logprobs as the server
reported them, `versions` the policy version that sampled each token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rollstream.contracts.codec import unpack_ids, unpack_logprobs
from trainer_bridge.groups import Sample

PAD_ID = 0


@dataclass
class TensorBatch:
    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] bool: real tokens
    loss_mask: torch.Tensor  # [B, T] bool: tokens the policy sampled
    old_logprobs: torch.Tensor  # [B, T] float32, 0 outside the loss mask
    advantages: torch.Tensor  # [B, T] float32: the sample's advantage on its sampled tokens
    versions: torch.Tensor  # [B, T] int64: policy version that sampled each token, -1 elsewhere
    position_ids: torch.Tensor  # [B, T] int64: restart at 0 for each packed sequence
    sequence_ids: torch.Tensor  # [B, T] int64: which sample a token belongs to, -1 for padding

    @property
    def num_sampled_tokens(self) -> int:
        return int(self.loss_mask.sum())


def columns(sample: Sample) -> tuple[np.ndarray, ...]:
    """(ids, sampled mask, logprobs, versions) over the sample's whole sequence, turn after turn:
    the form every trainer adapter starts from."""
    parts_ids, parts_mask, parts_lp, parts_ver = [], [], [], []
    for turn in sample.scored["trajectory"]["turns"]:
        prompt = unpack_ids(turn["prompt_ids"])
        completion = unpack_ids(turn["completion_ids"])
        parts_ids += [prompt, completion]
        parts_mask += [np.zeros(len(prompt), bool), np.ones(len(completion), bool)]
        parts_lp += [np.zeros(len(prompt), np.float32), unpack_logprobs(turn["logprobs"])]
        parts_ver += [np.full(len(prompt), -1), np.full(len(completion), turn["policy_version"])]
    return tuple(np.concatenate(p) if p else np.zeros(0) for p in
                 (parts_ids, parts_mask, parts_lp, parts_ver))


def to_tensors(samples: list[Sample], pack_to: int | None = None) -> TensorBatch:
    """One row per sample (right-padded), or with `pack_to`, samples packed first-fit into rows
    of at most that many tokens (position_ids restart per sample; sequence_ids tell them apart)."""
    rows: list[list[int]] = [[i] for i in range(len(samples))]
    cols = [columns(s) for s in samples]
    if pack_to is not None:
        rows = _pack([len(c[0]) for c in cols], pack_to)
    width = max((sum(len(cols[i][0]) for i in row) for row in rows), default=0)
    shape = (len(rows), width)
    out = {
        "input_ids": np.full(shape, PAD_ID, np.int64),
        "attention_mask": np.zeros(shape, bool),
        "loss_mask": np.zeros(shape, bool),
        "old_logprobs": np.zeros(shape, np.float32),
        "advantages": np.zeros(shape, np.float32),
        "versions": np.full(shape, -1, np.int64),
        "position_ids": np.zeros(shape, np.int64),
        "sequence_ids": np.full(shape, -1, np.int64),
    }
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            ids, mask, lp, ver = cols[i]
            end = at + len(ids)
            out["input_ids"][r, at:end] = ids
            out["attention_mask"][r, at:end] = True
            out["loss_mask"][r, at:end] = mask
            out["old_logprobs"][r, at:end] = lp
            out["advantages"][r, at:end] = np.where(mask, samples[i].advantage or 0.0, 0.0)
            out["versions"][r, at:end] = ver
            out["position_ids"][r, at:end] = np.arange(len(ids))
            out["sequence_ids"][r, at:end] = i
            at = end
    return TensorBatch(**{k: torch.from_numpy(v) for k, v in out.items()})


def _pack(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing; a sample longer than the capacity gets a row of its own."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows
