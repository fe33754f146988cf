"""The seed system's own request and response models, rebuilt from its source's field lists
(ProRL-Agent-Server: the legacy `openhands/nvidia/utils.py` request models and the `/process`
result dict of `async_server_process.py`; Polar's `src/polar/rollout/models.py` and
`polar/trajectory/models.py`), so the API tests speak to `rollstream api` as the seed's clients
do, not through Rollstream's own structures. Importing the packages themselves would pull in
OpenHands' or Polar's whole stack; these are their pydantic v2 definitions, field for field
(types, defaults, constraints, `extra`), for the models a trainer sends or reads."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# -- ProRL Agent, legacy server -------------------------------------------------------------


class ProcessRequest(BaseModel):
    instance: dict[str, Any]
    sampling_params: dict[str, Any]
    job_id: str | None = None


class CancelRequest(BaseModel):
    job_id: str


class LLMServerRequest(BaseModel):
    address: str


class ProrlMessage(BaseModel):
    """A message of the `/process` result (process_messages_from_agent_state); the id fields
    are there when token-level generation is on."""

    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    input_ids: list[int] | None = None
    logprobs: list[float] | None = None


class ProrlTiming(BaseModel):
    init_time: float
    run_time: float
    eval_time: float
    others_time: float
    counted_elapsed: float
    timeout_triggered: bool


class ProcessResult(BaseModel):
    """The `/process` result dict (final_result plus timing); a plain dict upstream, so extra
    keys are allowed."""

    model_config = ConfigDict(extra="allow")
    git_patch: str | None = None
    success: bool
    error: str | None = None
    finish: bool
    messages: list[ProrlMessage]
    tools: list[dict[str, Any]]
    end_properly: bool
    resolved: bool
    critical_error: str | None = None
    instance_id: Any = None
    trajectory_id: Any = None
    filter: bool
    timing: ProrlTiming | None = None


# -- Polar -----------------------------------------------------------------------------------


class StrategySpec(BaseModel):
    strategy: str
    config: dict[str, Any] = {}


class EvaluatorSpec(BaseModel):
    strategy: str
    config: dict[str, Any] = {}
    env: dict[str, str] = {}
    refresh_runtime: bool = False


class AgentSpec(BaseModel):
    harness: str | None = None
    import_path: str | None = None
    model_name: str | None = None
    settings: dict[str, Any] = {}
    env: dict[str, str] = {}
    mcp_servers: list[dict[str, Any]] = []
    skills_path: str | None = None
    custom_shell: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> AgentSpec:
        if (self.harness is None) == (self.import_path is None):
            raise ValueError("exactly one of harness and import_path must be set")
        return self


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
    evaluator: EvaluatorSpec | None = None
    callback_url: str | None = None
    metadata: dict[str, object] = {}

    @field_validator("metadata")
    @classmethod
    def _agent_timeout(cls, value: dict[str, object]) -> dict[str, object]:
        timeout = value.get("agent_timeout")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float)
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise ValueError("agent_timeout must be a positive finite number")
        return value


class Trace(BaseModel):
    prompt_ids: list[int] = []
    response_ids: list[int] = []
    loss_mask: list[int] = []
    prompt_messages: list[dict[str, Any]] = []
    response_messages: list[dict[str, Any]] = []
    tools: list[dict] | None = None
    finish_reason: str | None = None
    response_logprobs: list[float] | None = None
    reward: float | None = None
    reward_components: dict[str, float] = {}
    metadata: dict[str, Any] = {}

    @model_validator(mode="after")
    def _lengths(self) -> Trace:
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask values must be 0 or 1")
        if self.loss_mask and len(self.loss_mask) != len(self.response_ids):
            raise ValueError("loss_mask must be as long as response_ids")
        if (self.response_logprobs is not None
                and len(self.response_logprobs) != len(self.response_ids)):
            raise ValueError("response_logprobs must be as long as response_ids")
        if self.reward is not None and (isinstance(self.reward, bool)
                                        or not math.isfinite(self.reward)):
            raise ValueError("reward must be finite")
        return self


class Trajectory(BaseModel):
    status: str
    metadata: dict = {}
    traces: list[Trace] = []
    error: str | None = None

    @field_validator("status")
    @classmethod
    def _status(cls, value: str) -> str:
        if value not in ("COMPLETED", "TIMEOUT", "ERROR"):
            raise ValueError(f"trajectory status {value!r}")
        return value


class SessionTiming(BaseModel):
    model_config = ConfigDict(extra="forbid")
    register_to_init_queue_ms: float = 0.0
    rollout_dispatch_ms: float = 0.0
    rollout_result_wait_ms: float = 0.0
    rollout_pipeline_e2e_ms: float = 0.0
    init_ms: float = 0.0
    ready_queue_ms: float = 0.0
    run_ms: float = 0.0
    postrun_queue_ms: float = 0.0
    postrun_ms: float = 0.0
    container_start_ms: float = 0.0
    eval_container_start_ms: float = 0.0
    runtime_validation_ms: float = 0.0
    eval_runtime_validation_ms: float = 0.0
    prepare_ms: float = 0.0
    eval_prepare_ms: float = 0.0
    agent_setup_ms: float = 0.0
    agent_exec_ms: float = 0.0
    agent_postprocess_ms: float = 0.0
    build_ms: float = 0.0
    eval_ms: float = 0.0
    postrun_exec_ms: float = 0.0
    runtime_stop_ms: float = 0.0
    e2e_ms: float = 0.0
    runtime_exec_ms: float = 0.0
    runtime_exec_count: int = 0
    runtime_exec_timeout_count: int = 0
    runtime_exec_failure_count: int = 0
    runtime_exec_exception_count: int = 0
    runtime_exec_cancelled_count: int = 0
    runtime_exec_ms_by_category: dict[str, float] = {}
    runtime_exec_count_by_category: dict[str, int] = {}
    mini_swe_command_ms: float = 0.0
    mini_swe_command_count: int = 0
    mini_swe_command_timeout_count: int = 0
    mini_swe_command_failure_count: int = 0
    mini_swe_command_ms_by_category: dict[str, float] = {}
    mini_swe_command_count_by_category: dict[str, int] = {}


class SessionResult(BaseModel):
    session_id: str
    task_id: str
    status: str  # SessionStatus: REGISTERED ... COMPLETED, ERROR, TIMEOUT
    trajectory: Trajectory
    timing: SessionTiming = SessionTiming()
    node_id: str | None = None
    error: str | None = None
    metadata: dict[str, object] = {}


class TaskResult(BaseModel):
    task_id: str
    status: str  # "running" | "completed" | "failed"
    results: list[SessionResult]
    result_paths: list[str] = []


class TaskStatus(BaseModel):
    task_id: str
    status: str
    total_sessions: int
    completed_sessions: int
    results: list[SessionResult] = []
    result_paths: list[str] = []
