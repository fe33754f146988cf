"""Assemble scored trajectories into their task's group (the GRPO group of samples).

A group is released when all of its samples have arrived, or, for groups that never complete
(a sample lost to a dead-lettered event, a task cancelled), after `group_timeout_s`. A sample
that failed for good (infra: RUN spent its retries, stages/run.py) or never came is the
policy's `incomplete` to decide: "drop" the whole group (the default) or train on the rest
("partial"). Within a group that trains, failures without a reward (infra, env) and samples
older than the staleness bound take no part in the statistics; a group left with no reward
variance carries no learning signal and is dropped (dynamic sampling). Everything dropped is
counted, here (`stats`) and in the process's metrics.

An episode RUN played more than once arrives as its newest attempt only, but a late copy of an
older attempt may still come: within a group the highest attempt of an episode counts, and an
older or repeated one is set aside (`take_set_aside`: handled, nothing to train on).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from rollstream.contracts.events import ScoredTrajectory
from rollstream.telemetry import metrics
from trainer_bridge.advantages import group_advantages


@dataclass
class Sample:
    """A scored trajectory and where it came from (for committing after the trainer's ack)."""

    scored: ScoredTrajectory
    partition: int
    offset: int
    advantage: float | None = None

    @property
    def episode_id(self) -> str:
        return self.scored["trajectory"]["episode_id"]

    @property
    def attempt(self) -> int:
        return self.scored["trajectory"].get("attempt", 0)

    @property
    def reward(self) -> float | None:
        return self.scored["reward"]

    @property
    def oldest_version(self) -> int | None:
        turns = self.scored["trajectory"]["turns"]
        return min((t["policy_version"] for t in turns), default=None)


@dataclass
class Group:
    task_id: str
    size: int
    samples: list[Sample] = field(default_factory=list)
    first_seen: float = field(default_factory=time.monotonic)

    @property
    def complete(self) -> bool:
        return len(self.samples) >= self.size

    @property
    def rewards(self) -> list[float | None]:
        return [s.reward for s in self.samples]

    @property
    def trainable(self) -> list[Sample]:
        return [s for s in self.samples if s.advantage is not None]


@dataclass(frozen=True)
class GroupPolicy:
    normalize_std: bool = True  # False: Dr. GRPO
    max_staleness: int | None = None  # versions behind the trainer a sample may be
    group_timeout_s: float = 300.0
    # A group that lost a sample for good (its infra retries spent, or it never came): "drop"
    # the whole group, or train on the rest ("partial").
    incomplete: Literal["drop", "partial"] = "drop"
    drop_zero_variance: bool = True


class GroupAssembler:
    """Holds incomplete groups until every sample of the group has arrived."""

    def __init__(self, policy: GroupPolicy | None = None) -> None:
        self.policy = policy or GroupPolicy()
        self.pending: dict[str, Group] = {}
        self.stats: Counter[str] = Counter()
        self.dropped: list[Group] = []  # groups that left without training; the caller acks them
        self.set_aside: list[Sample] = []  # repeats and older attempts; the caller acks them

    def add(self, sample: Sample, current_version: int) -> Group | None:
        """Add a sample; return its group once complete and scored. Of an episode's samples
        the newest attempt counts; repeats and older attempts are set aside."""
        task = sample.scored["trajectory"]["task"]
        group = self.pending.setdefault(task["task_id"],
                                        Group(task["task_id"], task["group_size"]))
        same = next((s for s in group.samples if s.episode_id == sample.episode_id), None)
        if same is not None:
            if same.attempt >= sample.attempt:
                self._set_aside(sample, "duplicate_samples" if same.attempt == sample.attempt
                                else "older_attempts")
                return None
            group.samples.remove(same)
            self._set_aside(same, "older_attempts")
        group.samples.append(sample)
        if not group.complete:
            return None
        return self._release(self.pending.pop(group.task_id), current_version)

    def expire(self, current_version: int, now: float | None = None) -> list[Group]:
        """Groups past their timeout released for training (the others go to `dropped`)."""
        now = time.monotonic() if now is None else now
        released = []
        for task_id in [t for t, g in self.pending.items()
                        if now - g.first_seen >= self.policy.group_timeout_s]:
            group = self.pending.pop(task_id)
            self.stats["groups_timed_out"] += 1
            if self.policy.incomplete == "partial":
                kept = self._release(group, current_version)
                if kept is not None:
                    released.append(kept)
            else:
                self._drop(group, "groups_dropped_incomplete")
        return released

    def take_dropped(self) -> list[Group]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def take_set_aside(self) -> list[Sample]:
        set_aside, self.set_aside = self.set_aside, []
        return set_aside

    def _set_aside(self, sample: Sample, reason: str) -> None:
        self.stats[reason] += 1
        self.set_aside.append(sample)

    def _drop(self, group: Group, reason: str) -> None:
        self.stats[reason] += 1
        metrics.group_dropped(reason.removeprefix("groups_dropped_"))
        self.dropped.append(group)

    def _release(self, group: Group, current_version: int) -> Group | None:
        """Score the group's samples; None when the group has nothing to learn from, or lost
        a sample to an infra failure under the "drop" policy."""
        if self.policy.incomplete == "drop" and any(
                s.scored["failure_class"] == "infra" for s in group.samples):
            self._drop(group, "groups_dropped_infra")
            return None
        rewards: list[float | None] = []
        for s in group.samples:
            if s.reward is None:
                self.stats[f"{s.scored['failure_class']}_excluded"] += 1
                rewards.append(None)
            elif self._stale(s, current_version):
                self.stats["stale_dropped"] += 1
                rewards.append(None)
            else:
                rewards.append(s.reward)
        valid = [r for r in rewards if r is not None]
        if len(valid) < 2:
            self._drop(group, "groups_dropped_too_few")
            return None
        if self.policy.drop_zero_variance and max(valid) == min(valid):
            self._drop(group, "groups_dropped_zero_variance")
            return None
        for s, adv in zip(group.samples, group_advantages(rewards, self.policy.normalize_std),
                          strict=True):
            s.advantage = adv
        self.stats["groups_released"] += 1
        return group

    def _stale(self, sample: Sample, current_version: int) -> bool:
        oldest = sample.oldest_version
        bound = self.policy.max_staleness
        return bound is not None and oldest is not None and current_version - oldest > bound
