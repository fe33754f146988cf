"""Assemble scored trajectories into their task's group (the GRPO group of samples)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """A scored trajectory and where it came from (for committing after the trainer's ack)."""

    scored: dict
    partition: int
    offset: int

    @property
    def episode_id(self) -> str:
        return self.scored["trajectory"]["episode_id"]


@dataclass
class Group:
    task_id: str
    size: int
    samples: list[Sample] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.samples) >= self.size

    @property
    def rewards(self) -> list[float | None]:
        return [s.scored["reward"] for s in self.samples]


class GroupAssembler:
    """Holds incomplete groups until every sample of the group has arrived."""

    def __init__(self) -> None:
        self.pending: dict[str, Group] = {}

    def add(self, sample: Sample) -> Group | None:
        """Add a sample; return its group once complete. A repeated episode id is ignored."""
        task = sample.scored["trajectory"]["task"]
        group = self.pending.setdefault(task["task_id"],
                                        Group(task["task_id"], task["group_size"]))
        if any(s.episode_id == sample.episode_id for s in group.samples):
            return None
        group.samples.append(sample)
        if group.complete:
            return self.pending.pop(group.task_id)
        return None
