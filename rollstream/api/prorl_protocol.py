"""ProRL Agent's legacy server API (`scripts/start_server.py` of ProRL-Agent-Server): its request
models, the Rollstream task a `/process` call becomes, and the result dict it answers with.

A request's `instance` names its environment in `env` (or ProRL's `data_source`), its first
user message in `prompt` (or `problem_statement`, `instruction`), and the environment's payload
in `data` (else the instance's other keys are). `sampling_params` keeps ProRL's names
(`max_output_tokens`, `max_iterations`) and takes Rollstream's too.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel

from rollstream.api import trajectories
from rollstream.api.joblog import ApiTask, RequestError, task_id
from rollstream.contracts.events import ScoredTrajectory

ROUTING_KEYS = ("env", "data_source", "prompt", "problem_statement", "instruction", "data",
                "max_turns")
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "seed": "seed", "max_output_tokens": "max_tokens", "max_tokens": "max_tokens"}


class ProcessRequest(BaseModel):
    instance: dict[str, Any]
    sampling_params: dict[str, Any]
    job_id: str | None = None


class CancelRequest(BaseModel):
    job_id: str


class LLMServerRequest(BaseModel):
    address: str


def process_task_id(request: ProcessRequest) -> str:
    """The task of a `/process` call: its job_id's (the same job_id is the same rollout), or a
    new one when the caller gave none (as ProRL does)."""
    return task_id("prorl", request.job_id or str(uuid.uuid4()))


def to_task(request: ProcessRequest, tid: str) -> dict[str, Any]:
    """The Rollstream task (not yet validated) that rolls out one trajectory of the request."""
    instance = request.instance
    env = instance.get("env") or instance.get("data_source")
    if not isinstance(env, str):
        raise RequestError("instance: name the Rollstream environment in 'env' (or "
                           "'data_source'); `rollstream envs` lists them")
    prompt = next((instance[k] for k in ("prompt", "problem_statement", "instruction")
                   if isinstance(instance.get(k), str)), None)
    if prompt is None:
        raise RequestError("instance: the first user message goes in 'prompt' (or "
                           "'problem_statement', 'instruction'), a string")
    data = instance.get("data", {k: v for k, v in instance.items() if k not in ROUTING_KEYS})
    params = request.sampling_params
    sampling = {ours: params[theirs] for theirs, ours in SAMPLING_KEYS.items()
                if params.get(theirs) is not None}
    task: dict[str, Any] = {
        "task_id": tid, "env": env, "prompt": prompt, "data": data, "group_size": 1,
        "metadata": {"api.dialect": "prorl",
                     "api.instance_id": json.dumps(instance.get("instance_id")),
                     "api.trajectory_id": json.dumps(instance.get("trajectory_id"))},
    }
    if sampling:
        task["sampling"] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 64,
                            "seed": None, **sampling}
    turns = params.get("max_iterations", instance.get("max_turns"))
    if turns is not None:
        task["max_turns"] = turns
    return task


def result(entry: ApiTask) -> dict[str, Any]:
    """ProRL's `/process` result dict for a finished task of one trajectory."""
    meta = entry.meta
    base = {"instance_id": json.loads(meta.get("api.instance_id", "null")),
            "trajectory_id": json.loads(meta.get("api.trajectory_id", "null"))}
    scored = entry.results.get(0)
    if scored is None:  # cancelled (ProRL answers 200 with an error) or past its deadline
        what = "cancelled" if entry.cancelled else "timed out"
        return {**base, "error": f"job {entry.caller_id} {what}", "success": False,
                "messages": [], "tools": [], "resolved": False, "finish": False,
                "end_properly": False, "filter": True,
                "critical_error": None if entry.cancelled else "timeout", "git_patch": None}
    return {**base, **_outcome(scored), "messages": trajectories.messages(scored), "tools": [],
            "timing": _timing(entry.task["created_at_ms"], scored), "git_patch": None,
            "episode_id": scored["trajectory"]["episode_id"]}


def _outcome(scored: ScoredTrajectory) -> dict[str, Any]:
    """ProRL's verdict keys from Rollstream's failure class and reward."""
    failure = scored["failure_class"]
    success = failure in ("ok", "truncated")
    critical = "run" if failure in ("infra", "env") else None
    detail = scored["trajectory"]["termination_detail"]
    return {
        "success": success,
        "error": None if success else (detail or failure),
        "finish": scored["trajectory"]["termination"] == "DONE",
        "end_properly": failure != "agent",
        "resolved": scored["reward"] is not None and scored["reward"] >= 1.0,
        "reward": scored["reward"],
        "failure_class": failure,
        "report": _report(scored["verifier"]),
        "critical_error": critical,
        "filter": critical is not None or not success,
    }


def _report(verifier: str) -> Any:
    """The verifier's record (JSON from the environments Rollstream ships; else its text)."""
    try:
        return json.loads(verifier) if verifier else None
    except json.JSONDecodeError:
        return verifier


def _timing(created_ms: int, scored: ScoredTrajectory) -> dict[str, Any]:
    """ProRL's timing (seconds): queued to started (init), the episode (run), scoring (eval)."""
    trajectory = scored["trajectory"]
    init = max(0, trajectory["started_at_ms"] - created_ms) / 1000
    run = max(0, trajectory["finished_at_ms"] - trajectory["started_at_ms"]) / 1000
    evaluate = max(0, scored["scored_at_ms"] - trajectory["finished_at_ms"]) / 1000
    return {"init_time": init, "run_time": run, "eval_time": evaluate, "others_time": 0.0,
            "counted_elapsed": init + run + evaluate, "timeout_triggered": False}
