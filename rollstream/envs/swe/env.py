"""`swe`: repository-level bug fixing with tools in a sandbox, scored by the task's tests.

reset builds the repository in a new sandbox; each step runs the tool calls of one completion
and answers with their output; the episode ends on `submit` (or at max_turns, or when the token
budget is spent). The episode's artifact is the workspace's `git diff`, recomputed after every
step and kept in the state, so an episode checkpointed here and resumed by another process is
rebuilt there (fresh sandbox, same base, same diff applied). close destroys the sandbox; EVAL
grades the diff in a fresh one (grading.py).

Failures: a sandbox that cannot be had or dies mid-episode ends the episode as "infra", a task
whose repository cannot be built as "env"; both are kept in the state (the environment cannot
set the trajectory's termination) and `evaluate` reports them without a reward.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any, ClassVar

from rollstream.contracts.events import FailureClass
from rollstream.contracts.tool_calls import MalformedCall, parse_tool_calls
from rollstream.envs.base import (
    Environment,
    Score,
    StepResult,
    agent_failure,
    termination_score,
)
from rollstream.envs.swe import workspace
from rollstream.envs.swe.grading import grade, sandbox_spec
from rollstream.envs.swe.instance import SweInstance
from rollstream.envs.swe.tools import Tools
from rollstream.envs.swe.workspace import WorkspaceError
from rollstream.sandbox import Sandbox, SandboxError
from rollstream.sandbox.capture import head_tail_text

log = logging.getLogger(__name__)

NO_TOOL_CALL = ("No tool call found. Call a tool as <tool_call>{\"name\": \"bash\", "
                "\"arguments\": {\"command\": \"ls\"}}</tool_call>, and call submit when done.")


def _response(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>"


class SweEnv(Environment):
    name = "swe"
    description = "multi-turn: fix a repository with bash/editor tools in a sandbox; tests score"
    observation_role = "tool"  # every observation answers a tool call

    # This process's live sandboxes by id. Environment instances are created per call, and a
    # state naming a sandbox that is not here comes from another process: it is rebuilt.
    _live: ClassVar[dict[str, Sandbox]] = {}

    def validate_task(self, task: dict) -> None:
        SweInstance.from_task(task)

    async def reset(self, task: dict) -> dict:
        state: dict[str, Any] = {"sandbox": None, "base": None, "patch": "", "undo": {},
                                 "submitted": False, "tokens": self._bytes(task["prompt"]),
                                 "exit": None, "failure": None}
        instance = SweInstance.from_task(task)
        await self._open(instance, task, state)
        return state

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        state = copy.deepcopy(state)
        if state["failure"] is not None:
            return StepResult(None, True, None, state)
        instance = SweInstance.from_task(task)
        config = instance.scaffold
        calls = parse_tool_calls(completion_text)[: config.max_calls_per_turn]
        recorded = json.dumps([c.as_json() for c in calls]) if calls else None
        try:
            sandbox = self._live.get(state["sandbox"]) or await self._open(instance, task, state)
            if sandbox is None:
                return StepResult(None, True, recorded, state)
            observation = await self._run(sandbox, instance, state, calls)
            try:
                state["patch"] = await workspace.diff(sandbox, state["base"],
                                                      config.max_patch_bytes)
            except WorkspaceError as exc:
                # The repository was built at reset; only the agent's commands broke it since.
                state["exit"] = f"broken repository: {exc}"
        except SandboxError as exc:
            self._fail(state, "infra", f"sandbox: {exc}")
        except WorkspaceError as exc:
            self._fail(state, "env", str(exc))
        except ValueError as exc:  # the patch outgrew its bound: the agent's doing
            state["exit"] = f"patch too large: {exc}"
        if state["failure"] is not None or state["exit"] is not None:
            return StepResult(None, True, recorded, state)
        if state["submitted"]:
            state["exit"] = "submitted"
            return StepResult(None, True, recorded, state)
        state["tokens"] += self._bytes(completion_text) + self._bytes(observation)
        budget = config.max_total_tokens
        if budget is not None and state["tokens"] / config.bytes_per_token > budget:
            state["exit"] = "token budget"
            return StepResult(None, True, recorded, state)
        return StepResult(observation, False, recorded, state)

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        fixed = termination_score(trajectory)
        if fixed is not None:
            return fixed
        state = json.loads(trajectory.get("env_state") or "{}")
        failure = state.get("failure")
        if failure is not None:
            return Score(None, failure["class"], {"reason": failure["detail"]})
        exit_reason = state.get("exit")
        if exit_reason == "token budget":
            return Score(0.0, "truncated", {"reason": "token budget spent"})
        if not state.get("submitted"):
            return agent_failure(exit_reason or "no submit", patch=state.get("patch", ""))
        return await grade(SweInstance.from_task(task), state.get("patch", ""), self.sandboxes)

    async def close(self, task: dict, state: dict) -> None:
        sandbox = self._live.pop(state.get("sandbox") or "", None)
        if sandbox is not None:
            await sandbox.destroy()

    def failure(self, state: dict) -> tuple[FailureClass, str] | None:
        failure = state.get("failure")
        return None if failure is None else (failure["class"], failure["detail"])

    # -- internals ------------------------------------------------------------------------------

    @staticmethod
    def _bytes(text: str | None) -> int:
        return len((text or "").encode())

    @staticmethod
    def _fail(state: dict, failure_class: str, detail: str) -> None:
        log.warning("episode failed (%s): %s", failure_class, detail)
        state["failure"] = {"class": failure_class, "detail": detail}

    async def _open(self, instance: SweInstance, task: dict, state: dict) -> Sandbox | None:
        """A sandbox holding the episode's workspace: the task's repository at its base, plus
        the state's patch when resuming. Records failures in `state` (None is returned)."""
        try:
            sandbox = await self.sandboxes.create(sandbox_spec(instance, stage="run"))
        except SandboxError as exc:
            self._fail(state, "infra", f"sandbox: {exc}")
            return None
        try:
            base = await workspace.prepare(sandbox, instance)
            if state["base"] is not None and base != state["base"]:
                raise WorkspaceError(f"resumed on commit {base}, started on {state['base']}")
            if state["patch"]:
                applied = await workspace.apply_patch(sandbox, state["patch"], base, "resume")
                if not applied.applied:
                    raise WorkspaceError(f"cannot restore the workspace: {applied.log}")
        except (SandboxError, WorkspaceError) as exc:
            await sandbox.destroy()
            self._fail(state, "infra" if isinstance(exc, SandboxError) else "env", str(exc))
            return None
        state["sandbox"], state["base"] = sandbox.id, base
        self._live[sandbox.id] = sandbox
        return sandbox

    async def _run(self, sandbox: Sandbox, instance: SweInstance, state: dict,
                   calls: list) -> str:
        if not calls:
            return _response(NO_TOOL_CALL)
        tools = Tools(sandbox, instance.scaffold, state["undo"])
        parts = []
        for call in calls:
            if isinstance(call, MalformedCall):
                text = f"Error: could not read the tool call: {call.error}"
            else:
                outcome = await tools.call(call)
                text = outcome.observation
                if outcome.submitted:
                    state["submitted"] = True
            parts.append(_response(head_tail_text(text, instance.scaffold.max_observation_chars)))
            if state["submitted"]:
                break
        return "\n".join(parts)

