"""INIT: check a task against its environment and expand it into its group of episodes."""

from __future__ import annotations

import time

from rollstream.admission import AdmissionGate
from rollstream.bounds import check_task, show_id
from rollstream.config import Settings
from rollstream.contracts.events import EPISODE, TASK, Episode, Task
from rollstream.dedup import SeenIds
from rollstream.envs.base import InvalidTask
from rollstream.envs.registry import UnknownEnv, get_env
from rollstream.runtime import EventContext, InvalidEvent, Output, Stage
from rollstream.service.quotas import JobQuotas


def episode_id(task_id: str, sample_index: int) -> str:
    # Deterministic, so replaying a task yields the same episode ids (idempotent downstream).
    return f"{task_id}#{sample_index}"


class InitStage(Stage[Task]):
    name = "init"
    input_record = TASK

    def __init__(self, settings: Settings, quotas: JobQuotas | None = None) -> None:
        """`quotas`: the job's, inside a fleet (its tasks-queued quota counts what INIT takes)."""
        super().__init__(settings)
        self.quotas = quotas
        self.gate = (AdmissionGate(settings, settings.stage.admission_window)
                     if settings.stage.admission_window > 0 else None)
        self.seen = SeenIds(settings, self.name)  # a re-published task is expanded once

    def input_topic(self) -> str:
        return self.topics.tasks

    def capacity(self) -> int | None:
        return None if self.gate is None else self.gate.capacity()

    async def restore(self, partitions: list[int]) -> None:
        await self.seen.load(partitions)

    def on_revoke(self, partitions: list[int]) -> None:
        self.seen.forget(partitions)

    async def close(self) -> None:
        if self.gate is not None:
            self.gate.close()

    def handle(self, task: Task, ctx: EventContext) -> list[Output]:
        try:
            check_task(task, self.settings.bounds)
            get_env(task["env"]).validate_task(task)
        except (ValueError, UnknownEnv, InvalidTask) as exc:
            raise InvalidEvent(f"task {show_id(task['task_id'])}: {exc}") from exc
        if not self.seen.claim(ctx.partition, task["task_id"]):
            return []
        if self.gate is not None:
            self.gate.admit(task["task_id"])
        if self.quotas is not None:
            self.quotas.took(task["group_size"])  # its tasks-queued quota
        now = int(time.time() * 1000)
        episodes: list[Episode] = [{
            "episode_id": episode_id(task["task_id"], i),
            "task": task,
            "sample_index": i,
            "created_at_ms": now,
            "attempt": 0,
        } for i in range(task["group_size"])]
        return [self.seen.marker(ctx.partition, task["task_id"])] + [
            Output(self.topics.episodes, e["episode_id"], EPISODE, e) for e in episodes]
