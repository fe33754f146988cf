"""Shared by the SWE tests: the shipped task set, tool calls, playing completions through the
`swe` environment in-process, a pytest log with edge cases, reading `scored` back, and where
mini-swe-agent is installed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import load_tasks
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.envs.base import Score
from rollstream.envs.swe.env import SweEnv

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "examples" / "swe" / "instances.jsonl"
HARNESS_BIN = Path(os.environ.get("ROLLSTREAM_HARNESS_BIN",
                                  ROOT / ".rollstream" / "harness-venv" / "bin"))
needs_mini = pytest.mark.skipif(
    not (HARNESS_BIN / "mini").exists(),
    reason=f"mini-swe-agent is not installed at {HARNESS_BIN} (`make harness-deps`); "
           "test_harness_env.py covers the harness environment with plain HTTP harnesses")


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def shipped(slug: str | None = None) -> list[dict]:
    tasks = load_tasks(SHIPPED, "swe-bench")
    return [t for t in tasks if slug is None or t["task_id"].endswith(f"__{slug}-1")]


async def play(task: dict, completions: list[str], env: SweEnv | None = None,
               state: dict | None = None, step_tasks: dict[int, dict] | None = None,
               ) -> tuple[Score, list[str | None], dict]:
    """Run completions through the env as RUN would; returns EVAL's score, the observations
    and the final state. `step_tasks` gives some steps (by index) a task of their own."""
    env = env or SweEnv()
    state = state if state is not None else await env.reset(task)
    observations = []
    try:
        for i, text in enumerate(completions):
            result = await env.step((step_tasks or {}).get(i, task), state, text)
            state = result.state
            observations.append(result.observation)
            if result.done:
                break
    finally:
        await env.close(task, state)
    trajectory = {"termination": "DONE", "env_state": json.dumps(state), "turns": []}
    return await env.evaluate(task, trajectory), observations, state


def scored(settings: Settings) -> list[dict]:
    tps = [TopicPartition(settings.topics.scored, p, 0) for p in range(settings.partitions)]
    return [codec().decode_as("ScoredTrajectory", m.value())
            for m in kafka.read_partitions(settings, tps)]


# SWE-bench's parse_log_pytest: lines starting with a status word; FAILED lines drop " - "; the
# id is the second whitespace-separated word; XPASS is not one of its statuses; the SKIPPED [N]
# summary names no test. (tests/envs/test_swebench_contract.py runs it on this log too.)
EDGE_LOG = "\n".join([
    "PASSED tests/a.py::test_ids[a b]",
    "FAILED tests/a.py::test_y - AssertionError: x",
    "XFAIL tests/a.py::test_z - reason",
    "XPASS tests/a.py::test_w",
    "  PASSED tests/a.py::indented",
    "ERROR tests/a.py::test_e",
    "SKIPPED [1] tests/a.py:3: no",
    "PASSED",
])
