"""The pipeline's events as Python types: one TypedDict per Avro record of `schemas/*.avsc`, as
the codec decodes it, and the record names as constants.

The `.avsc` files stay the source of truth; tests/contracts/test_events.py checks every TypedDict
here against them field by field, so a schema change that is not mirrored here fails the suite.
Token ids and logprobs are the packed bytes the schema holds (see `schemas/turn.avsc`).
"""

from __future__ import annotations

from typing import Final, Literal, TypedDict

# Record names, as the codec takes them (`codec().encode(TASK, ...)`, `Output(..., TASK, ...)`).
# Final: a type checker reads each as its Literal, so `codec().decode_as(TASK, ...)` is a Task.
SAMPLING_PARAMS: Final = "SamplingParams"
TASK: Final = "Task"
EPISODE: Final = "Episode"
TURN: Final = "Turn"
TRAJECTORY: Final = "Trajectory"
TURN_CHECKPOINT: Final = "TurnCheckpoint"
SCORED_TRAJECTORY: Final = "ScoredTrajectory"
POLICY_VERSION: Final = "PolicyVersion"
DEAD_LETTER: Final = "DeadLetter"
JOB: Final = "Job"

# How an episode ended: a closed set (the schema's enum), RUNNING while it is played.
Termination = Literal[
    "RUNNING", "DONE", "MAX_TURNS", "TRUNCATED", "AGENT_ERROR", "ENV_ERROR", "INFRA_ERROR"
]
FailureClass = Literal["ok", "agent", "env", "infra", "truncated"]
WeightsKind = Literal["full", "lora"]
JobState = Literal["RUNNING", "PAUSED", "DRAINING", "CANCELLED", "FINISHED"]


class SamplingParams(TypedDict):
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int | None


class Task(TypedDict):
    task_id: str
    env: str
    prompt: str
    data: str
    group_size: int
    max_turns: int
    sampling: SamplingParams
    metadata: dict[str, str]
    created_at_ms: int


class Episode(TypedDict):
    episode_id: str
    task: Task
    sample_index: int
    created_at_ms: int
    attempt: int


class Turn(TypedDict):
    index: int
    prompt_ids: bytes
    completion_ids: bytes
    logprobs: bytes
    policy_version: int
    adapter: str | None
    finish_reason: str
    completion_text: str
    tool_call: str | None
    observation: str | None
    server: str
    started_at_ms: int
    inference_ms: float
    env_ms: float
    new_sample: bool


class Trajectory(TypedDict):
    episode_id: str
    task: Task
    sample_index: int
    turns: list[Turn]
    termination: Termination
    termination_detail: str
    env_state: str
    started_at_ms: int
    finished_at_ms: int
    attempt: int


class TurnCheckpoint(TypedDict):
    episode_id: str
    turn: Turn
    env_state: str
    previous_observation: str | None
    started_at_ms: int


class ScoredTrajectory(TypedDict):
    trajectory: Trajectory
    reward: float | None
    failure_class: FailureClass
    verifier: str
    scored_at_ms: int


class PolicyVersion(TypedDict):
    version: int
    kind: WeightsKind
    uri: str
    step_id: str
    metrics: dict[str, float]
    created_at_ms: int


class DeadLetter(TypedDict):
    stage: str
    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes | None
    failed_at_ms: int
    truncated_from: int | None


class Job(TypedDict):
    name: str
    prefix: str
    principal: str
    adapter: str
    policy_urls: list[str]
    weight: float
    priority: int
    quota_episodes: int
    quota_sandboxes: int
    quota_tasks_queued: int
    quota_turns_per_s: float
    admission_window: int
    max_staleness: int
    state: JobState
    group: str | None
    api_tokens: list[str]
    retries_infra: int
    group_policy: str
    created_at_ms: int
    updated_at_ms: int
