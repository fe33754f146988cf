"""EVAL: score a finished trajectory with its environment's verifier.

How the episode ended is scored here, before the environment is asked (`termination_score`): an
infra or environment failure has no reward whatever a plug-in's `evaluate` would say.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from rollstream.config import Settings
from rollstream.contracts.events import (
    SCORED_TRAJECTORY,
    TRAJECTORY,
    ScoredTrajectory,
    Trajectory,
)
from rollstream.dedup import SeenIds
from rollstream.envs.base import termination_score
from rollstream.envs.registry import UnknownEnv, get_env
from rollstream.runtime import EventContext, InvalidEvent, Output, Stage
from rollstream.sandbox import Sandboxes
from rollstream.service.quotas import JobQuotas
from rollstream.telemetry import metrics


class EvalStage(Stage[Trajectory]):
    name = "eval"
    input_record = TRAJECTORY

    def __init__(self, settings: Settings, share: Callable[[], int] | None = None,
                 quotas: JobQuotas | None = None) -> None:
        """`share`: how many more trajectories this stage may score now (a fleet's fair share
        of its sandboxes, rollstream.service.fairshare); None: no bound beyond --max-in-flight;
        `quotas`: the job's inside a fleet (they bound its sandboxes)."""
        super().__init__(settings)
        self.share = share
        self.sandboxes = Sandboxes(settings.sandbox, quotas)
        self.seen = SeenIds(settings, self.name)  # each episode scored once (rollstream.dedup)

    def input_topic(self) -> str:
        return self.topics.trajectories

    def capacity(self) -> int | None:
        return None if self.share is None else self.share()

    async def restore(self, partitions: list[int]) -> None:
        await self.seen.load(partitions)

    def on_revoke(self, partitions: list[int]) -> None:
        self.seen.forget(partitions)

    async def handle(self, trajectory: Trajectory, ctx: EventContext) -> list[Output]:
        task = trajectory["task"]
        if trajectory["termination"] == "RUNNING":
            raise InvalidEvent(f"episode {trajectory['episode_id']!r} is not finished")
        try:
            env = get_env(task["env"], self.sandboxes)
        except UnknownEnv as exc:
            raise InvalidEvent(str(exc)) from exc
        # An older attempt than one scored already is late: the newer one counts.
        attempt = trajectory.get("attempt", 0)
        if not self.seen.claim(ctx.partition, trajectory["episode_id"], attempt):
            return []
        score = termination_score(trajectory) or await env.evaluate(task, trajectory)
        metrics.scored(task["env"], score.failure_class, score.reward,
                       [turn["policy_version"] for turn in trajectory["turns"]])
        marker = self.seen.marker(ctx.partition, trajectory["episode_id"], attempt)
        scored: ScoredTrajectory = {
            "trajectory": trajectory,
            "reward": score.reward,
            "failure_class": score.failure_class,
            "verifier": json.dumps(score.verifier),
            "scored_at_ms": int(time.time() * 1000),
        }
        return [marker, Output(self.topics.scored, trajectory["episode_id"], SCORED_TRAJECTORY,
                               scored)]
