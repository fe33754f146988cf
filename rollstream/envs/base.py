"""The environment plug-in interface, and helpers every environment shares.

An environment is stateless: RUN passes the episode's state into every call and gets the new
state back, checkpoints it as JSON after each turn (Trajectory.env_state), and may resume the
episode from that JSON in another process. So states must be JSON-serializable, and `step` must
not mutate the state it is given (a retried turn starts again from the same checkpoint).

Scoring rule (`termination_score`, applied by EVAL before it calls `evaluate`, so no environment
can turn an infra failure into a reward): how an episode ended decides its failure class before
the environment looks at any answer.

    TRUNCATED    -> "truncated", reward 0.0   (the model ran out of room: its own doing)
    AGENT_ERROR  -> "agent",     reward 0.0
    ENV_ERROR    -> "env",       reward None  (nothing to learn from a broken environment)
    INFRA_ERROR  -> "infra",     reward None  (an infra failure is never a reward of 0)
    RUNNING      -> "infra",     reward None  (an unfinished checkpoint reached EVAL)
    DONE, MAX_TURNS -> the environment's own scoring: "ok" when the agent gave a checkable
                       answer (reward from the verifier), "agent" with reward 0.0 when it gave
                       none or a malformed one.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from rollstream import config
from rollstream.contracts.events import FailureClass, Task, Termination, Trajectory
from rollstream.sandbox import Sandboxes


class InvalidTask(ValueError):
    """A task's fields or data do not fit its environment; the message names the field."""


@dataclass
class StepResult:
    observation: str | None  # next user message shown to the model; None when done
    done: bool
    tool_call: str | None  # the parsed action as JSON text (recorded in the Turn), or None
    state: dict  # new JSON-serializable env state


@dataclass
class Score:
    reward: float | None  # None only for failures with nothing to learn from (env, infra)
    failure_class: FailureClass
    verifier: dict  # details, JSON-serializable


# How RUN plays an environment's episodes: "steps", RUN samples each turn and hands the
# completion to `step`; "harness", an agent harness runs its own loop against RUN's recording
# gateway (rollstream.envs.harness), which records each of its calls as a turn.
EnvKind = Literal["steps", "harness"]
ENV_KINDS: tuple[EnvKind, ...] = ("steps", "harness")


class Environment(ABC):
    """A task family: turns a model's completions into observations, and scores the episode."""

    name: ClassVar[str]
    description: ClassVar[str]
    kind: ClassVar[EnvKind] = "steps"
    # The chat role of an observation that answers a tool call: "tool" renders it as a tool
    # result in the model's template (append-only for tool-trained templates), "user" as text.
    observation_role: ClassVar[str] = "user"

    def __init__(self, sandboxes: Sandboxes | None = None) -> None:
        self._sandboxes = sandboxes

    @property
    def sandboxes(self) -> Sandboxes:
        """Where the environment's sandboxes come from: what the stage handed it (its settings,
        its job's quota), else the process's settings, resolved at first use."""
        if self._sandboxes is None:
            self._sandboxes = process_sandboxes()
        return self._sandboxes

    @abstractmethod
    async def reset(self, task: Task) -> dict:
        """The initial state (JSON-serializable) for one episode of `task`."""

    @abstractmethod
    async def step(self, task: Task, state: dict, completion_text: str) -> StepResult:
        """Apply one completion to `state`; must not mutate `state`."""

    @abstractmethod
    async def evaluate(self, task: Task, trajectory: Trajectory) -> Score:
        """Score a finished trajectory. EVAL calls it only when `termination_score` leaves
        the score to the environment (DONE, MAX_TURNS)."""

    @abstractmethod
    def validate_task(self, task: Mapping[str, Any]) -> None:
        """Raise InvalidTask naming the field if `task` (a Task, or a task file's entry being
        checked) lacks what this environment needs."""

    async def close(self, task: Task, state: dict) -> None:
        """Release what the episode holds (a sandbox), once RUN is done with it, before EVAL."""

    def failure(self, state: dict) -> tuple[FailureClass, str] | None:
        """A failure the environment recorded in the episode's state rather than raising (its
        class and detail; `evaluate` scores it): RUN plays an episode whose environment failed
        as "infra" again. None: nothing failed."""
        return None


def process_sandboxes() -> Sandboxes:
    """Sandboxes under the settings this process resolves (defaults < config file <
    environment), outside any job: for code handed none (a test, a library user)."""
    return Sandboxes(config.load().sandbox)


# Terminations whose score does not depend on any answer; the module docstring says why.
_TERMINATION_SCORES: dict[Termination, tuple[float | None, FailureClass]] = {
    "TRUNCATED": (0.0, "truncated"),
    "AGENT_ERROR": (0.0, "agent"),
    "ENV_ERROR": (None, "env"),
    "INFRA_ERROR": (None, "infra"),
    "RUNNING": (None, "infra"),
}


def termination_score(trajectory: Trajectory) -> Score | None:
    """The Score fixed by how the episode ended, or None when the environment must score it."""
    termination = trajectory.get("termination", "RUNNING")
    fixed = _TERMINATION_SCORES.get(termination)
    if fixed is None:
        return None
    reward, failure_class = fixed
    detail = trajectory.get("termination_detail", "")
    return Score(reward, failure_class, {"termination": termination, "detail": detail})


def agent_failure(reason: str, **verifier: Any) -> Score:
    """The agent gave no checkable answer: a real (zero) reward, not an infra failure."""
    return Score(0.0, "agent", {"reason": reason, **verifier})


def completions(trajectory: Trajectory) -> list[str]:
    """The model's completion texts, turn by turn."""
    return [turn.get("completion_text", "") for turn in trajectory.get("turns", [])]


_INT = re.compile(r"-?\d+")


def first_int(text: str) -> int | None:
    """The first integer written in `text` (sign included), or None."""
    match = _INT.search(text)
    return int(match.group()) if match else None


def task_data(task: Mapping[str, Any]) -> dict:
    """The task's data as a dict. The schema carries it as a JSON string; task files and the
    publisher may hold it as an object before it is serialized, so both are accepted."""
    raw = task.get("data", "{}")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidTask(f"task field 'data' is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidTask(f"task field 'data' must be a JSON object, got {type(raw).__name__}")
    return raw


def _field(data: Mapping[str, Any], field: str) -> Any:
    if field not in data:
        raise InvalidTask(f"task data is missing field {field!r}")
    return data[field]


def data_int(data: Mapping[str, Any], field: str) -> int:
    """An integer field of task data; an integer written as a string ("42") is accepted."""
    value = _field(data, field)
    # bool is an int subclass, but `true` as an answer key is a mistake.
    if not isinstance(value, bool) and isinstance(value, int | str):
        try:
            return int(value)
        except ValueError:
            pass
    raise InvalidTask(f"task data field {field!r} must be an integer, got {value!r}")


def data_str(data: Mapping[str, Any], field: str) -> str:
    """A non-empty string field of task data."""
    value = _field(data, field)
    if not isinstance(value, str) or not value:
        raise InvalidTask(f"task data field {field!r} must be a non-empty string, got {value!r}")
    return value


class SingleTurnEnvironment(Environment):
    """One completion, one answer: `step` parses it and ends the episode; `evaluate` re-parses
    the recorded completion (the turns are the source of truth) and grades it."""

    async def reset(self, task: Task) -> dict:
        return {}

    async def step(self, task: Task, state: dict, completion_text: str) -> StepResult:
        answer = self.parse_answer(completion_text)
        tool_call = None if answer is None else json.dumps({"answer": answer})
        return StepResult(
            observation=None, done=True, tool_call=tool_call, state={"answer": answer}
        )

    async def evaluate(self, task: Task, trajectory: Trajectory) -> Score:
        fixed = termination_score(trajectory)
        if fixed is not None:
            return fixed
        texts = completions(trajectory)
        answer = self.parse_answer(texts[-1]) if texts else None
        if answer is None:
            return agent_failure("no answer", completion=texts[-1] if texts else None)
        return self.grade(task_data(task), answer)

    @abstractmethod
    def parse_answer(self, completion_text: str) -> Any | None:
        """The JSON-serializable answer in a completion, or None if it holds none."""

    @abstractmethod
    def grade(self, data: dict, answer: Any) -> Score:
        """Score a parsed answer against the task data (failure class "ok")."""
