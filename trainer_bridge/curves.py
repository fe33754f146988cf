"""Training curves as TensorBoard event files, written next to the checkpoints.

`tensorboard --logdir <checkpoint-dir>/tensorboard` shows, per policy version: loss, KL to the
behaviour policy and clip fraction, reward, advantages, staleness of the samples and tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch


class TrainingCurves:
    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = logdir
        self.writer = SummaryWriter(str(logdir))

    def step(self, version: int, scalars: dict[str, float],
             advantages: list[float], staleness: list[int]) -> None:
        """One trainer step, recorded at its new policy version."""
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, version)
        if advantages:
            adv = torch.tensor(advantages)
            self.writer.add_scalar("advantages/mean", adv.mean().item(), version)
            self.writer.add_scalar("advantages/abs_mean", adv.abs().mean().item(), version)
            self.writer.add_histogram("advantages", adv, version)
        if staleness:
            self.writer.add_scalar("staleness/mean", sum(staleness) / len(staleness), version)
            self.writer.add_scalar("staleness/max", max(staleness), version)
        self.writer.flush()  # a step is seconds apart; readers see it at once

    def close(self) -> None:
        self.writer.close()
