"""`harness`: a SWE task played by an external agent harness (mini-swe-agent, SWE-agent, an
in-house loop) that talks to RUN's recording gateway instead of an LLM API.

Task.data is a `swe` task's data plus a `harness` object:

    command           shell command that runs the harness for one task (run with bash -c)
    config            object written as JSON to $ROLLSTREAM_HARNESS_CONFIG (config.yaml: JSON
                      is YAML)
    env               extra environment variables for the harness
    max_total_tokens  the episode's token budget (prompt + completion ids of all its calls)
    wall_clock_s      the harness is stopped after this long (default 1800)
    max_command_s     upper bound of one sandboxed command's timeout (default 600)

Isolation: the harness process runs beside the sandbox, never inside it, with a private empty
working directory, a minimal environment (nothing of RUN's own: no broker address, no
credentials) and two endpoints: the gateway's OpenAI API (OPENAI_BASE_URL / OPENAI_API_KEY, the
key naming the episode) and $ROLLSTREAM_EXEC_URL, which runs a command in the episode's
sandbox (the same no-network, resource-limited sandbox the `swe` environment uses). Everything
the model decides to run goes through that endpoint; the repository exists only in the sandbox.
The harness program itself is trusted code, as RUN is: the task names it, RUN runs it.

The episode ends when the harness exits: exit 0 is a finished attempt, graded like a `swe`
episode on the workspace's diff; any other exit is the agent's failure (AGENT_ERROR, reward 0).
A wall-clock limit reached is TRUNCATED; the gateway ends it early for spent budgets (turns,
tokens) and for infrastructure failures (inference, sandbox), which are never rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollstream.envs.base import InvalidTask, Score, StepResult, task_data
from rollstream.envs.swe import workspace
from rollstream.envs.swe.env import SweEnv
from rollstream.envs.swe.instance import SweInstance
from rollstream.sandbox import ExecResult, SandboxError
from rollstream.sandbox.capture import HeadTail

PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
OUTPUT_TAIL_BYTES = 4000  # of the harness's own output, kept for the record
# The variables a harness inherits from RUN's environment; the rest it is given explicitly.
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # holds the rollstream package (clients)


@dataclass(frozen=True)
class HarnessSpec:
    command: str
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    max_total_tokens: int | None = None
    wall_clock_s: float = 1800.0
    max_command_s: float = 600.0

    @classmethod
    def from_task(cls, task: dict) -> HarnessSpec:
        raw = task_data(task).get("harness")
        if not isinstance(raw, dict):
            raise InvalidTask("task data field 'harness' must be an object with a 'command'")
        known = {"command", "config", "env", "max_total_tokens", "wall_clock_s", "max_command_s"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidTask(f"task data field 'harness.{unknown[0]}' is unknown; known: "
                              f"{', '.join(sorted(known))}")
        if not isinstance(raw.get("command"), str) or not raw["command"].strip():
            raise InvalidTask("task data field 'harness.command' must be a non-empty string")
        if not isinstance(raw.get("config", {}), dict):
            raise InvalidTask("task data field 'harness.config' must be an object")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise InvalidTask("task data field 'harness.env' must map names to strings")
        budget = raw.get("max_total_tokens")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or budget <= 0):
            raise InvalidTask("task data field 'harness.max_total_tokens' must be a positive "
                              "integer or null")
        for name in ("wall_clock_s", "max_command_s"):
            value = raw.get(name, 1.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidTask(f"task data field 'harness.{name}' must be a positive number")
        return cls(**raw)


def swe_task(task: dict) -> dict:
    """The task as the `swe` environment reads it: the data without the harness object."""
    data = {k: v for k, v in task_data(task).items() if k != "harness"}
    return {**task, "data": data}


@dataclass
class HarnessEndpoints:
    """What a harness is given to reach RUN."""

    base_url: str  # the gateway, without /v1
    api_key: str
    exec_path: str


@dataclass
class HarnessExit:
    returncode: int | None  # None: stopped by RUN (wall clock, or the episode ended)
    reason: str
    output_tail: str


class HarnessEnv(SweEnv):
    name = "harness"
    kind = "harness"
    description = ("any agent harness, unmodified, against RUN's OpenAI-compatible gateway; "
                   "SWE tasks in a sandbox, tests score")

    def validate_task(self, task: dict) -> None:
        HarnessSpec.from_task(task)
        super().validate_task(swe_task(task))

    async def reset(self, task: dict) -> dict:
        state = await super().reset(swe_task(task))
        state["restarts"] = 0
        return state

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        raise TypeError("a harness episode is played by its harness through the gateway, "
                        "not turn by turn")

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        return await super().evaluate(swe_task(task), trajectory)

    def fail(self, state: dict, failure_class: str, detail: str) -> None:
        self._fail(state, failure_class, detail)

    async def execute(self, task: dict, state: dict, command: str,
                      timeout_s: float | None) -> ExecResult:
        """Run one of the agent's commands in the episode's sandbox."""
        sandbox = self._live.get(state.get("sandbox") or "")
        if sandbox is None or state.get("failure") is not None:
            raise SandboxError("the episode has no live sandbox")
        spec = HarnessSpec.from_task(task)
        limit = SweInstance.from_task(swe_task(task)).scaffold.command_timeout_s
        return await sandbox.exec(command, timeout_s=min(timeout_s or limit, spec.max_command_s))

    async def finish(self, task: dict, state: dict, outcome: HarnessExit) -> None:
        """Record how the harness ended and the workspace's diff (the episode's answer)."""
        state["harness"] = {"returncode": outcome.returncode, "reason": outcome.reason,
                            "output_tail": outcome.output_tail}
        state["submitted"] = outcome.returncode == 0
        state["exit"] = outcome.reason
        sandbox = self._live.get(state.get("sandbox") or "")
        if sandbox is None or state.get("failure") is not None:
            return
        config = SweInstance.from_task(swe_task(task)).scaffold
        try:
            state["patch"] = await workspace.diff(sandbox, state["base"], config.max_patch_bytes)
        except SandboxError as exc:
            self._fail(state, "infra", f"sandbox: {exc}")
        except workspace.WorkspaceError as exc:
            self._fail(state, "env", str(exc))
        except ValueError as exc:  # the patch outgrew its bound: the agent's doing
            state["submitted"], state["exit"] = False, f"patch too large: {exc}"

    async def run_harness(self, task: dict, endpoints: HarnessEndpoints,
                          stop: asyncio.Event) -> HarnessExit:
        """Start the harness and wait for it to exit, for `stop`, or for the wall clock; the
        process group is killed in every case (cancellation included)."""
        spec = HarnessSpec.from_task(task)
        workdir = Path(tempfile.mkdtemp(prefix="rollstream-harness-"))
        output = HeadTail(OUTPUT_TAIL_BYTES)
        try:
            env = self._environment(task, spec, endpoints, workdir)
            proc = await asyncio.create_subprocess_exec(
                "bash", "-c", spec.command, cwd=workdir, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, preexec_fn=_own_group_dying_with_run)
            reader = asyncio.create_task(_drain(proc, output))
            stopped = asyncio.create_task(stop.wait())
            exited = asyncio.create_task(proc.wait())
            try:
                done, _ = await asyncio.wait({stopped, exited}, timeout=spec.wall_clock_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                _kill_group(proc.pid)  # its children too, whether it exited or not
                await exited
                await reader
            tail = output.value().decode("utf-8", errors="replace")
            if exited in done:
                return HarnessExit(proc.returncode, f"harness exited {proc.returncode}", tail)
            if stopped in done:
                return HarnessExit(None, "stopped by the gateway", tail)
            return HarnessExit(None, f"wall-clock limit of {spec.wall_clock_s:g} s", tail)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    @staticmethod
    def _environment(task: dict, spec: HarnessSpec, endpoints: HarnessEndpoints,
                     workdir: Path) -> dict[str, str]:
        instance = SweInstance.from_task(swe_task(task))
        (workdir / "task.md").write_text(instance.problem_statement, encoding="utf-8")
        # JSON is YAML too, and harnesses that read YAML may insist on the extension.
        (workdir / "config.yaml").write_text(json.dumps(spec.config), encoding="utf-8")
        local = "127.0.0.1,localhost"
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env.update({
            "HOME": str(workdir),
            "PYTHONPATH": str(PROJECT_ROOT),  # rollstream.gateway.clients for the harness
            "OPENAI_BASE_URL": endpoints.base_url + "/v1",
            "OPENAI_API_BASE": endpoints.base_url + "/v1",  # older clients' name for it
            "OPENAI_API_KEY": endpoints.api_key,
            "ROLLSTREAM_EXEC_URL": endpoints.base_url + endpoints.exec_path,
            "ROLLSTREAM_TASK_FILE": str(workdir / "task.md"),
            "ROLLSTREAM_HARNESS_CONFIG": str(workdir / "config.yaml"),
            "ROLLSTREAM_HARNESS_DIR": str(workdir),
            "ROLLSTREAM_WORKDIR": "/testbed",
            "NO_PROXY": local,
            "no_proxy": local,
        })
        env.update(spec.env)
        return env


async def _drain(proc: asyncio.subprocess.Process, output: HeadTail) -> None:
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(65536):
        output.feed(chunk)


def _own_group_dying_with_run() -> None:
    """In the child before exec: its own process group (killed whole when the episode ends),
    and SIGKILL when RUN dies (a RUN killed mid-episode must not leave its harness calling a
    gateway that is gone; the episode restarts in the process that takes it over)."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
