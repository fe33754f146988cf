"""Learning from earlier runs: a past run's scored log as off-policy data for a new run.

`replay_scored` copies the past run's scored trajectories that pass the filters (the policy
versions that sampled them, their reward, when they were written) into the new run's replay
topic, `<prefix>-replay.scored`, in one transaction. A bridge on `replay_settings(settings)`
reads them like fresh ones. Nothing is re-sampled: the importance ratio of each token is
against the logprob the old server logged for it (TensorBatch.old_logprobs), and the policy
version that sampled it is kept per token (TensorBatch.versions), so the trainer knows how far
off-policy each sample is. `mixed` interleaves replayed and fresh batches in a set proportion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from producers.replay import replay
from rollstream.config import Settings
from rollstream.contracts.events import SCORED_TRAJECTORY
from trainer_bridge.bridge import Batch, TrainerBridge
from trainer_bridge.tensors import TensorBatch

REPLAY_SUFFIX = "-replay"


def replay_settings(settings: Settings) -> Settings:
    """The settings whose scored topic is the run's replay topic."""
    return dataclasses.replace(settings, prefix=settings.prefix + REPLAY_SUFFIX)


def replay_scored(past: Settings, run: Settings, *, min_version: int | None = None,
                  max_version: int | None = None, min_reward: float | None = None,
                  max_reward: float | None = None, start_time_ms: int | None = None,
                  end_time_ms: int | None = None) -> int:
    """Copy the past run's scored trajectories within the bounds (versions: every turn's; all
    bounds inclusive but end_time_ms) to the run's replay topic; returns how many. The bounds
    apply to each sample: a group left incomplete by them is released after the bridge's
    group timeout, or dropped, as GroupPolicy.incomplete says."""
    if min_version is not None and max_version is not None and min_version > max_version:
        raise ValueError(f"min_version {min_version} is above max_version {max_version}")

    def keep(record: str, value: dict) -> bool:
        if record != SCORED_TRAJECTORY:
            return False
        versions = [t["policy_version"] for t in value["trajectory"]["turns"]]
        reward = value["reward"]
        return (bool(versions)
                and (min_version is None or min(versions) >= min_version)
                and (max_version is None or max(versions) <= max_version)
                and (min_reward is None or (reward is not None and reward >= min_reward))
                and (max_reward is None or (reward is not None and reward <= max_reward)))

    return replay(past, past.topics.scored, start_time_ms=start_time_ms,
                  end_time_ms=end_time_ms, keep=keep,
                  to_topic=replay_settings(run).topics.scored)


def importance_ratios(logprobs: torch.Tensor, batch: TensorBatch) -> torch.Tensor:
    """exp(log p_current - log p_logged) on sampled tokens ([B, T-1], aligned with
    `PolicyModel.token_logprobs`), 1 elsewhere: the ratio the reference GRPO trainer clips."""
    mask = batch.loss_mask[:, 1:]
    return torch.where(mask, torch.exp(logprobs - batch.old_logprobs[:, 1:]),
                       torch.ones_like(logprobs))


def mixed(fresh: TrainerBridge, replayed: TrainerBridge, replay_share: float,
          max_batches: int | None = None,
          idle_timeout_s: float | None = None) -> Iterator[Batch]:
    """Batches from both bridges, `replay_share` of them replayed (0..1), evenly spread; each
    batch is acknowledged through its own bridge. When one side runs dry the other goes on."""
    if not 0.0 <= replay_share <= 1.0:
        raise ValueError(f"replay_share must be within 0..1, got {replay_share}")
    sources = {True: replayed.batches(idle_timeout_s=idle_timeout_s),
               False: fresh.batches(idle_timeout_s=idle_timeout_s)}
    taken = {True: 0, False: 0}
    produced = 0
    while sources and (max_batches is None or produced < max_batches):
        # Replayed next when it is behind its share of what was produced so far.
        want = (taken[True] + 1) <= replay_share * (produced + 1) + 1e-9
        side = want if want in sources else (not want)
        if side not in sources:
            return
        batch = next(sources[side], None)
        if batch is None:
            del sources[side]
            continue
        taken[side] += 1
        produced += 1
        yield batch
