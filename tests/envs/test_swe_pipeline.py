"""End to end on the real broker: the shipped SWE set published → INIT → RUN → EVAL → scored,
each stage its own process, the policy served over the inference contract.

- a scripted policy that replays each task's gold patch through the tools: every task resolved;
- a scripted policy that submits without changing anything: none resolved;
- the embedded model: every episode ends with a failure class (and a reward where one is due),
  none hangs.
The `sandbox_root` fixture fails a test that leaves a sandbox or a sandboxed process behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.publish import load_tasks, publish
from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup, free_port, wait_http
from tests.helpers.sandbox_helpers import needs_bwrap, sandbox_root
from tests.helpers.swe_helpers import SHIPPED, scored

__all__ = ["sandbox_root"]

pytestmark = [needs_bwrap, pytest.mark.slow]


def shipped_tasks(max_turns: int, max_tokens: int) -> list[dict]:
    tasks = load_tasks(SHIPPED, "swe-bench")
    for i, task in enumerate(tasks):
        task.update(group_size=1, max_turns=max_turns)
        task["sampling"] = {**task["sampling"], "max_tokens": max_tokens, "seed": i}
    return tasks


def run_pipeline(settings: Settings, logs: Path, policy: list[str],
                 tasks: list[dict]) -> list[dict]:
    """Start a policy server and one process per stage, publish `tasks`, wait for every
    episode to be scored; returns the ScoredTrajectory events."""
    procs = ProcessGroup(logs)
    port = free_port()
    # Eight episodes at a time per stage, not all 26: each holds a sandbox whose commands take
    # a core, and with 26 at once beside the other workers' tests the load reached 84 on 2
    # cores and the shared broker stalled for a minute.
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix,
              "--commit-interval-ms", "100", "--max-in-flight", "8"]
    try:
        server = procs.start("policy", *policy, "--port", str(port))
        for stage in ("init", "run", "eval"):
            procs.start(stage, "stage", stage, *common,
                        *(["--policy-url", f"http://127.0.0.1:{port}"] if stage == "run" else []))
        wait_http(f"http://127.0.0.1:{port}/health", proc=server, timeout=120)
        publish(settings, tasks)
        deadline = time.monotonic() + 240
        events = scored(settings)
        while len(events) < len(tasks):
            assert time.monotonic() < deadline, f"{len(events)}/{len(tasks)} scored in time"
            procs.check_alive()
            time.sleep(1.0)
            events = scored(settings)
        return events
    finally:
        procs.stop_all()


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "logs"


def test_gold_patches_through_the_tools_resolve_every_task(
        settings: Settings, logs: Path, sandbox_root: Path) -> None:
    tasks = shipped_tasks(max_turns=8, max_tokens=4096)
    events = run_pipeline(settings, logs, ["serve-scripted", "--swe-gold", str(SHIPPED)],
                          tasks)
    assert sorted(e["trajectory"]["task"]["task_id"] for e in events) == sorted(
        t["task_id"] for t in tasks)
    for event in events:
        assert (event["reward"], event["failure_class"]) == (1.0, "ok"), event["verifier"]
        turns = event["trajectory"]["turns"]
        assert json.loads(turns[-1]["tool_call"]) == [{"name": "submit", "arguments": {}}]


def test_submitting_nothing_resolves_nothing(settings: Settings, logs: Path,
                                             sandbox_root: Path) -> None:
    tasks = shipped_tasks(max_turns=4, max_tokens=256)
    events = run_pipeline(settings, logs,
                          ["serve-scripted", "--swe-submit-only", str(SHIPPED)], tasks)
    assert len(events) == len(tasks)
    for event in events:
        assert (event["reward"], event["failure_class"]) == (0.0, "agent")
        assert json.loads(event["verifier"])["reason"] == "empty patch"


def test_the_embedded_model_ends_every_episode_with_a_failure_class(
        settings: Settings, logs: Path, sandbox_root: Path) -> None:
    tasks = shipped_tasks(max_turns=3, max_tokens=48)
    events = run_pipeline(settings, logs, ["serve-policy"], tasks)
    assert len(events) == len(tasks)
    for event in events:
        # A random byte-level model calls no tool: out of turns or of context, never infra.
        assert event["failure_class"] in ("agent", "truncated", "ok")
        assert event["reward"] is not None
