"""Learning from earlier runs: a past run's scored log as off-policy data for a new run.

`replay_scored` copies the past run's scored trajectories that pass the filters (the policy
versions that sampled them, their reward, when they were written) into the new run's replay
topic, `<prefix>-replay.scored`, in one transaction. A bridge on `replay_settings(settings)`
reads them like fresh ones; whole groups are copied, each sample once however often it is
called. Nothing is re-sampled: the importance ratio of each token is against the logprob the
old server logged for it (TensorBatch.old_logprobs), and the policy
version that sampled it is kept per token (TensorBatch.versions), so the trainer knows how far
off-policy each sample is. `mixed` interleaves replayed and fresh batches in a set proportion.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Iterator

import torch
from confluent_kafka.admin import AdminClient

from producers.replay import replay
from rollstream.config import Settings
from rollstream.contracts.events import SCORED_TRAJECTORY
from trainer_bridge.bridge import Batch, TrainerBridge
from trainer_bridge.tensors import TensorBatch

REPLAY_SUFFIX = "-replay"
# `mixed`: how long neither bridge may have a batch before the iteration ends, and how long the
# side whose turn it is gets before the other side's batch comes instead.
MIXED_IDLE_S = 120.0
WAIT_S = 2.0


def replay_settings(settings: Settings) -> Settings:
    """The settings whose scored topic is the run's replay topic."""
    return dataclasses.replace(settings, prefix=settings.prefix + REPLAY_SUFFIX)


def replay_scored(past: Settings, run: Settings, *, min_version: int | None = None,
                  max_version: int | None = None, min_reward: float | None = None,
                  max_reward: float | None = None, start_time_ms: int | None = None,
                  end_time_ms: int | None = None) -> int:
    """Copy the past run's scored groups within the bounds to the run's replay topic; returns
    how many samples were copied. Whole groups pass or fail, so a group trains as it was
    sampled (a reward filter applied to samples left groups incomplete and, with their rewards
    alike, without the variance GRPO needs): the versions of every turn of every sample must
    lie within the version bounds, and the group's mean reward (infra failures left out)
    within the reward bounds; all bounds are inclusive but end_time_ms. Samples the replay topic
    holds already (an earlier call copied them) are not copied again."""
    if min_version is not None and max_version is not None and min_version > max_version:
        raise ValueError(f"min_version {min_version} is above max_version {max_version}")
    groups: dict[str, list[dict]] = defaultdict(list)

    def collect(record: str, value: dict) -> bool:
        if record == SCORED_TRAJECTORY:
            groups[value["trajectory"]["task"]["task_id"]].append(value)
        return False  # a first pass: nothing is written

    replay(past, past.topics.scored, keep=collect, start_time_ms=start_time_ms,
           end_time_ms=end_time_ms)
    kept = {task for task, values in groups.items()
            if _within(values, min_version, max_version, min_reward, max_reward)}
    target = replay_settings(run)
    copied = _episodes(target, target.topics.scored)

    def keep(record: str, value: dict) -> bool:
        return (record == SCORED_TRAJECTORY
                and value["trajectory"]["task"]["task_id"] in kept
                and value["trajectory"]["episode_id"] not in copied)

    return replay(past, past.topics.scored, keep=keep, to_topic=target.topics.scored,
                  start_time_ms=start_time_ms, end_time_ms=end_time_ms)


def _within(values: list[dict], min_version: int | None, max_version: int | None,
            min_reward: float | None, max_reward: float | None) -> bool:
    versions = [t["policy_version"] for v in values for t in v["trajectory"]["turns"]]
    rewards = [v["reward"] for v in values if v["reward"] is not None]
    if not versions or ((min_reward is not None or max_reward is not None) and not rewards):
        return False
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return ((min_version is None or min(versions) >= min_version)
            and (max_version is None or max(versions) <= max_version)
            and (min_reward is None or mean >= min_reward)
            and (max_reward is None or mean <= max_reward))


def _episodes(settings: Settings, topic: str) -> set[str]:
    """The episode ids of the scored trajectories on `topic` (none when it does not exist)."""
    if topic not in AdminClient(settings.kafka()).list_topics(timeout=30).topics:
        return set()
    found: set[str] = set()

    def collect(record: str, value: dict) -> bool:
        if record == SCORED_TRAJECTORY:
            found.add(value["trajectory"]["episode_id"])
        return False

    replay(settings, topic, keep=collect)
    return found


def importance_ratios(logprobs: torch.Tensor, batch: TensorBatch) -> torch.Tensor:
    """exp(log p_current - log p_logged) on sampled tokens ([B, T-1], aligned with
    `PolicyModel.token_logprobs`), 1 elsewhere: the ratio the reference GRPO trainer clips."""
    mask = batch.loss_mask[:, 1:]
    return torch.where(mask, torch.exp(logprobs - batch.old_logprobs[:, 1:]),
                       torch.ones_like(logprobs))


def mixed(fresh: TrainerBridge, replayed: TrainerBridge, replay_share: float,
          max_batches: int | None = None, idle_timeout_s: float | None = MIXED_IDLE_S,
          wait_s: float = WAIT_S) -> Iterator[Batch]:
    """Batches from both bridges, `replay_share` of them replayed (0..1), evenly spread; each
    batch is acknowledged through its own bridge. When the side whose turn it is has no batch
    within `wait_s`, the other side's next batch comes instead (so replayed batches flow while
    no fresh data does, and the other way round); the iteration ends once neither side had a
    batch for `idle_timeout_s` (None: it waits for ever). The policy version the trainer
    acknowledged last (`Batch.ack` with its PolicyVersion) is both bridges' current version."""
    if not 0.0 <= replay_share <= 1.0:
        raise ValueError(f"replay_share must be within 0..1, got {replay_share}")
    taken_replayed = produced = 0
    idle_since = time.monotonic()
    while max_batches is None or produced < max_batches:
        version = max(fresh.current_version, replayed.current_version)
        fresh.current_version = replayed.current_version = version
        # Replayed next when it is behind its share of what was produced so far.
        want = (taken_replayed + 1) <= replay_share * (produced + 1) + 1e-9
        batch = None
        for bridge in (replayed, fresh) if want else (fresh, replayed):
            batch = next(bridge.batches(max_batches=1, idle_timeout_s=wait_s), None)
            if batch is not None:
                taken_replayed += bridge is replayed
                break
        if batch is None:
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                return
            continue
        idle_since = time.monotonic()
        produced += 1
        yield batch
