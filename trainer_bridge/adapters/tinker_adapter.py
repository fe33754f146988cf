"""Tinker: a bridge batch as `tinker.Datum`s for its importance-sampling / PPO losses.

Each sample is one datum: the model input is the sequence but its last token, the targets the
sequence shifted by one; `logprobs` are the sampling server's on sampled targets, `advantages`
the sample's group advantage on sampled targets and 0 on prompt and observation tokens (so they
carry no gradient). Acknowledge the batch once `forward_backward` has taken the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer_bridge.groups import Sample
from trainer_bridge.tensors import columns


def datum(sample: Sample) -> Any:
    from tinker import Datum, ModelInput, TensorData

    ids, mask, logprobs, _ = columns(sample)
    sampled = mask[1:]
    return Datum(
        model_input=ModelInput.from_ints(ids[:-1].astype(np.int64).tolist()),
        loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(ids[1:].astype(np.int64)),
            "logprobs": TensorData.from_numpy(np.where(sampled, logprobs[1:], 0.0)
                                              .astype(np.float32)),
            "advantages": TensorData.from_numpy(
                np.where(sampled, sample.advantage or 0.0, 0.0).astype(np.float32)),
        })


def data(samples: list[Sample]) -> list[Any]:
    """The trainable samples of a batch (`batch.trainable`) as Tinker data."""
    return [datum(s) for s in samples]
