"""Polar's rollout task API (`src/polar/rollout/` of ProRL-Agent-Server): the submit request,
the Rollstream task it becomes, and the task status, task result and session results it is
answered with.

A Polar task names its environment in `evaluator.strategy` (Polar's evaluator scores; a
Rollstream environment both plays and scores) and its payload in `evaluator.config`;
`instruction` is the prompt, `num_samples` the group, `agent.settings.step_limit` the turns and
`agent.settings.model_kwargs` the sampling. `runtime` and `builder` are accepted and not used:
the job's environment and the trainer's sample layout decide them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollstream.api import trajectories
from rollstream.api.joblog import ApiTask, RequestError, session_status
from rollstream.contracts.events import ScoredTrajectory

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed")


class AgentSpec(BaseModel):
    harness: str | None = None
    import_path: str | None = None
    model_name: str | None = None
    settings: dict[str, Any] = {}


class StrategySpec(BaseModel):
    strategy: str
    config: dict[str, Any] = {}


class TaskRequest(BaseModel):
    task_id: str
    instruction: str
    num_samples: int = Field(1, ge=1)
    dispatch_priority: int = Field(0, ge=0, le=100)
    early_stop_min_usable_sessions: int | None = Field(None, ge=1)
    timeout_seconds: float = Field(600.0, gt=0)
    runtime: dict[str, Any] | None = None
    agent: AgentSpec
    builder: StrategySpec = StrategySpec(strategy="per_request")
    evaluator: StrategySpec | None = None
    callback_url: str | None = None
    metadata: dict[str, object] = {}

    @field_validator("metadata")
    @classmethod
    def _agent_timeout(cls, metadata: dict[str, object]) -> dict[str, object]:
        value = metadata.get("agent_timeout")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError("metadata.agent_timeout must be a positive finite number")
        return metadata

    @model_validator(mode="after")
    def _early_stop(self) -> TaskRequest:
        if (self.early_stop_min_usable_sessions is not None
                and self.early_stop_min_usable_sessions > self.num_samples):
            raise ValueError("early_stop_min_usable_sessions must be at most num_samples")
        return self


class SessionTiming(BaseModel):
    """The durations Rollstream knows of Polar's (ms); the others stay 0, as Polar's do for a
    stage a session did not go through."""

    model_config = ConfigDict(extra="forbid")
    rollout_pipeline_e2e_ms: float = 0.0
    init_ms: float = 0.0
    run_ms: float = 0.0
    postrun_ms: float = 0.0
    e2e_ms: float = 0.0


def to_task(request: TaskRequest, tid: str) -> dict[str, Any]:
    """The Rollstream task (not yet validated) of a Polar submit."""
    if request.evaluator is None:
        raise RequestError("evaluator: name the Rollstream environment in evaluator.strategy "
                           "(`rollstream envs` lists them) and its payload in evaluator.config")
    settings = request.agent.settings
    kwargs = settings.get("model_kwargs") or {}
    seed_base = request.metadata.get("eval_sampling_seed_base")
    sampling = {k: kwargs[k] for k in SAMPLING_KEYS if kwargs.get(k) is not None}
    if isinstance(seed_base, int) and "seed" not in sampling:
        sampling["seed"] = seed_base
    task: dict[str, Any] = {
        "task_id": tid, "env": request.evaluator.strategy, "prompt": request.instruction,
        "data": request.evaluator.config, "group_size": request.num_samples,
        "metadata": {
            "api.dialect": "polar", "api.timeout_s": repr(request.timeout_seconds),
            "api.dispatch_priority": str(request.dispatch_priority),
            "api.callback_url": request.callback_url or "",
            "api.harness": request.agent.harness or request.agent.import_path or "",
            "api.model": request.agent.model_name or "",
            "api.metadata": json.dumps(request.metadata, default=str),
        },
    }
    if sampling:
        task["sampling"] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 64,
                            "seed": None, **sampling}
    if settings.get("step_limit") is not None:
        task["max_turns"] = settings["step_limit"]
    return task


def session_result(entry: ApiTask, index: int) -> dict[str, Any]:
    """Polar's SessionResult of sample `index`: its trajectory, or a synthetic TIMEOUT (ERROR
    when cancelled) with no traces, as Polar gives a session that did not finish."""
    session_id = f"{entry.task['task_id']}#{index}"
    base = {"session_id": session_id, "task_id": entry.caller_id, "node_id": None,
            "metadata": json.loads(entry.meta.get("api.metadata", "{}"))}
    scored = entry.results.get(index)
    if scored is None:
        status = "ERROR" if entry.cancelled else "TIMEOUT"
        error = "cancelled" if entry.cancelled else "timed out"
        return {**base, "status": status, "error": error, "timing": SessionTiming().model_dump(),
                "trajectory": {"status": status, "traces": [], "error": error,
                               "metadata": {"record_count": 0}}}
    status = session_status(scored)
    error = None if status == "COMPLETED" else (
        scored["trajectory"]["termination_detail"] or scored["failure_class"])
    return {**base, "status": status, "error": error,
            "timing": _timing(entry.task["created_at_ms"], scored).model_dump(),
            "trajectory": {"status": status, "traces": trajectories.traces(scored),
                           "error": error, "metadata": _trajectory_metadata(scored)}}


def _trajectory_metadata(scored: ScoredTrajectory) -> dict[str, Any]:
    trajectory = scored["trajectory"]
    return {"episode_id": trajectory["episode_id"], "failure_class": scored["failure_class"],
            "termination": trajectory["termination"], "reward": scored["reward"],
            "record_count": len(trajectory["turns"])}


def _timing(created_ms: int, scored: ScoredTrajectory) -> SessionTiming:
    trajectory = scored["trajectory"]
    started, finished = trajectory["started_at_ms"], trajectory["finished_at_ms"]
    return SessionTiming(rollout_pipeline_e2e_ms=max(0, scored["scored_at_ms"] - created_ms),
                         init_ms=max(0, started - created_ms), run_ms=max(0, finished - started),
                         postrun_ms=max(0, scored["scored_at_ms"] - finished),
                         e2e_ms=max(0, finished - started))


def task_status(entry: ApiTask) -> dict[str, Any]:
    """Polar's TaskStatus: results in completion order while running, in session order (every
    session, synthetic ones for those that did not finish) once over."""
    # While running: insertion order, the order they were scored in.
    indexes = list(range(entry.task["group_size"])) if entry.finished else list(entry.results)
    return {"task_id": entry.caller_id, "status": entry.status(),
            "total_sessions": entry.task["group_size"],
            "completed_sessions": len(entry.results),
            "results": [session_result(entry, i) for i in indexes], "result_paths": []}


def task_result(entry: ApiTask) -> dict[str, Any]:
    """Polar's TaskResult, the callback's body."""
    status = task_status(entry)
    return {k: status[k] for k in ("task_id", "status", "results", "result_paths")}
