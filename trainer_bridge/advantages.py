"""Group-relative advantages (GRPO, and Dr. GRPO without the std normalization)."""

from __future__ import annotations

import statistics

EPS = 1e-6


def group_advantages(rewards: list[float | None], normalize_std: bool = True) -> list[float | None]:
    """Advantage per sample: reward minus the group mean, divided by the group std (GRPO) or not
    (Dr. GRPO). Samples without a reward (infra failures) get None and take no part in the mean or
    std: a crashed sandbox must not pull the baseline down as a fake zero.
    """
    valid = [r for r in rewards if r is not None]
    if len(valid) < 2:
        return [None] * len(rewards)
    mean = statistics.fmean(valid)
    scale = statistics.pstdev(valid) + EPS if normalize_std else 1.0
    return [None if r is None else (r - mean) / scale for r in rewards]
