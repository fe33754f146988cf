"""What a sandbox costs an agent: creating and destroying one, and the overhead of a tool call.

Designs, timed in the same run (bwrap always; docker too where an engine answers):
- ``plain``: ``bash -c true`` as an asyncio subprocess on the host, no sandbox: the baseline a
  tool call cannot beat.
- ``exec``: ``Sandbox.exec("true")`` (bwrap: a fresh set of namespaces per command).
- ``tool_call``: the scaffold's ``bash`` tool running ``true`` (exec plus the observation).
- ``step``: a whole ``swe`` env step for a completion holding that tool call: parse the call,
  run it, take the workspace's ``git diff`` (what RUN pays per turn besides inference).
Lifecycle: ``create_destroy`` (an empty sandbox) and ``create_prepare_destroy`` (a sandbox with
a shipped task's repository built in it, as RUN's reset and EVAL do).

Target: bwrap ``tool_call`` median <= 50 ms. With an engine, docker's medians are printed next
to bwrap's with their ratio (docker / bwrap).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import percentiles_ms, print_table, write_result
from producers.publish import load_tasks
from rollstream.contracts.tool_calls import ToolCall, hermes
from rollstream.envs.base import process_sandboxes
from rollstream.envs.swe import workspace
from rollstream.envs.swe.env import SweEnv
from rollstream.envs.swe.instance import SweInstance
from rollstream.envs.swe.tools import Tools
from rollstream.sandbox import SandboxSpec
from rollstream.sandbox.backends import BACKEND_ENV, unavailable

NAME = "sandbox"
TARGET_MS = 50.0
SHIPPED = Path(__file__).resolve().parent.parent / "examples" / "swe" / "instances.jsonl"
BASH_TRUE = ToolCall("bash", {"command": "true"})


async def _time(fn: Callable[[], Awaitable[Any]], n: int, warmup: int = 3) -> dict[str, float]:
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await fn()
        samples.append(time.perf_counter_ns() - t0)
    return percentiles_ms(samples)


async def _plain() -> None:
    proc = await asyncio.create_subprocess_exec("bash", "-c", "true")
    await proc.wait()


async def _measure_backend(name: str, task: dict, n: int) -> dict[str, Any]:
    backend = process_sandboxes().backend(name)
    instance = SweInstance.from_task(task)
    spec = SandboxSpec(image=instance.image)
    out: dict[str, Any] = {}

    async def create_destroy() -> None:
        await (await backend.create(spec)).destroy()

    async def create_prepare_destroy() -> None:
        sandbox = await backend.create(spec)
        try:
            await workspace.prepare(sandbox, instance)
        finally:
            await sandbox.destroy()

    out["create_destroy"] = await _time(create_destroy, max(n // 4, 5))
    out["create_prepare_destroy"] = await _time(create_prepare_destroy, max(n // 10, 5))
    sandbox = await backend.create(spec)
    try:
        tools = Tools(sandbox, instance.scaffold, {})
        out["exec"] = await _time(lambda: sandbox.exec("true"), n)
        out["tool_call"] = await _time(lambda: tools.call(BASH_TRUE), n)
    finally:
        await sandbox.destroy()
    env = SweEnv()
    state = await env.reset(task)
    completion = hermes(BASH_TRUE)
    try:
        out["step"] = await _time(lambda: env.step(task, state, completion), max(n // 2, 10))
    finally:
        await env.close(task, state)
    return out


async def _measure(quick: bool) -> dict[str, Any]:
    task = load_tasks(SHIPPED, "swe-bench")[0]
    n = 40 if quick else 200
    results: dict[str, Any] = {"plain": {"bash_true": await _time(_plain, n)}}
    for name in ("bwrap", "docker"):
        reason = unavailable(name)
        os.environ[BACKEND_ENV] = name  # the env's own sandboxes (step) on this backend too
        results[name] = {"skipped": reason} if reason else await _measure_backend(name, task, n)
    return results


def run(quick: bool = False) -> dict[str, Any]:
    load_before = os.getloadavg()
    results = asyncio.run(_measure(quick))
    bwrap = results["bwrap"]
    measured = bwrap.get("tool_call", {}).get("median_ms")
    baseline = results["plain"]["bash_true"]
    doc = {
        "quick": quick,
        "parameters": {
            "command": "true (bash -c)",
            "task": "the first shipped SWE task (examples/swe) for prepare and step",
            "timer": "time.perf_counter_ns around each awaited call, sequential, after 3 warm-up "
                     "calls",
            "limits": "rollstream.sandbox.Limits defaults",
            # What else ran: the host's 1, 5 and 15 minute load averages around the run.
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]},
        },
        "results": results,
        "baseline": baseline,
        "ratio": round(measured / baseline["median_ms"], 2) if measured else None,
        "ratio_meaning": "bwrap tool_call median / plain host bash median (the sandbox's price)",
        "docker_vs_bwrap": {
            what: round(results["docker"][what]["median_ms"] / bwrap[what]["median_ms"], 2)
            for what in ("create_destroy", "exec", "tool_call", "step")
            if what in results["docker"] and what in bwrap},
        "target": {
            "description": f"bwrap tool call (`bash true`) median <= {TARGET_MS:g} ms",
            "measured_median_ms": measured,
            "met": measured is not None and measured <= TARGET_MS,
        },
    }
    path = write_result(NAME, doc)
    rows = []
    for backend in ("plain", "bwrap", "docker"):
        for what, stats in results[backend].items():
            if isinstance(stats, dict) and "median_ms" in stats:
                rows.append([backend, what, stats["median_ms"], stats["p99_ms"], stats["n"]])
            elif what == "skipped":
                rows.append([backend, "skipped", "", "", json.dumps(stats)[:60]])
    print_table(f"sandbox: lifecycle and tool-call overhead (ms) -> results/{path.name}",
                ["backend", "what", "p50", "p99", "n"], rows)
    if doc["docker_vs_bwrap"]:
        print(f"  docker / bwrap medians: {doc['docker_vs_bwrap']}")
    t = doc["target"]
    print(f"  target: {t['description']}: {t['measured_median_ms']} ms -> "
          f"{'MET' if t['met'] else 'NOT MET'}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
