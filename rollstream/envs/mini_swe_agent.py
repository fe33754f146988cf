"""mini-swe-agent as a `harness`: its harness object for a task, SWE tasks turned into harness
tasks, and the gold patch written as answers in its format (for the scripted policy).

mini-swe-agent runs unmodified, from its own virtualenv on PATH (`pip install mini-swe-agent`),
with its SWE-bench config and these overrides, all documented settings of it or of litellm:

- the model is `openai/rollstream` at $OPENAI_BASE_URL (the gateway), with cost tracking off
  (`cost_tracking: ignore_errors`) and litellm's bundled model-cost map
  (LITELLM_LOCAL_MODEL_COST_MAP), so nothing is looked up on the network;
- its environment is rollstream.gateway.clients.minisweagent.SandboxEnvironment (commands run
  in the episode's sandbox);
- its own step and cost limits are off: the task's max_turns and the harness's token budget
  and wall clock govern;
- any request that is not to the loopback interface goes to a closed local port (HTTP(S)_PROXY),
  so a harness that tried to reach the network would fail instead of leaking.
"""

from __future__ import annotations

import json
from typing import Any

from rollstream.contracts.tool_calls import ToolCall, hermes
from rollstream.envs.base import task_data
from rollstream.envs.harness import swe_task
from rollstream.envs.swe.instance import SweInstance

COMMAND = ('mini --agent-class default --exit-immediately -c swebench.yaml '
           '-c "$ROLLSTREAM_HARNESS_CONFIG" -t "$(cat "$ROLLSTREAM_TASK_FILE")" '
           '-o "$ROLLSTREAM_HARNESS_DIR/trajectory.json"')
CLOSED_PORT = "http://127.0.0.1:9"  # discard: nothing listens, a connection is refused at once
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"


def harness(max_total_tokens: int | None = None, wall_clock_s: float = 600.0,
            command_timeout_s: int = 60) -> dict[str, Any]:
    """The `harness` object of a task that mini-swe-agent plays."""
    return {
        "command": COMMAND,
        "config": {
            "agent": {"step_limit": 0, "cost_limit": 0},
            "model": {"model_name": "openai/rollstream", "cost_tracking": "ignore_errors"},
            "environment": {
                "environment_class":
                    "rollstream.gateway.clients.minisweagent.SandboxEnvironment",
                "cwd": "/testbed", "timeout": command_timeout_s},
        },
        "env": {
            "MSWEA_CONFIGURED": "true",  # no first-run set-up dialogue
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HTTP_PROXY": CLOSED_PORT, "HTTPS_PROXY": CLOSED_PORT,
            "http_proxy": CLOSED_PORT, "https_proxy": CLOSED_PORT,
        },
        "max_total_tokens": max_total_tokens,
        "wall_clock_s": wall_clock_s,
    }


def harness_task(task: dict, spec: dict[str, Any]) -> dict:
    """A `swe` task played by a harness instead (`spec`: the harness object)."""
    return {**task, "env": "harness", "data": json.dumps({**task_data(task), "harness": spec})}


def _answer(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n" + hermes(ToolCall("bash", {"command": command}))


def gold_script(instance: SweInstance) -> list[str]:
    """What a perfect agent answers mini-swe-agent, call by call: look, apply the gold patch
    with git, submit the way mini-swe-agent's SWE-bench prompt asks."""
    patch = instance.gold_patch if instance.gold_patch.endswith("\n") else (
        instance.gold_patch + "\n")
    return [
        _answer("Let me look at the repository first.", "git status --short && ls"),
        _answer("I know the fix; apply it.",
                f"git apply <<'ROLLSTREAM_PATCH'\n{patch}ROLLSTREAM_PATCH"),
        _answer("The fix is in place; submit it.", SUBMIT),
    ]


def gold_scripts(tasks: list[dict]) -> list[dict[str, Any]]:
    """Scripted-policy scripts (`serve-scripted --script`) for SWE tasks: each matched by
    its problem statement, which mini-swe-agent's first message quotes."""
    scripts = []
    for task in tasks:
        instance = SweInstance.from_task(swe_task(task))
        scripts.append({"match": instance.problem_statement.strip(),
                        "completions": gold_script(instance)})
    return scripts
