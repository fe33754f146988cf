"""Shared by the whole-pipeline tests: the mixed task set, SIGKILLing the broker an `own_broker`
fixture started (tests/e2e/conftest.py), the version a server serves, and waiting on a condition."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

from producers.publish import validate_task
from rollstream.broker import local
from rollstream.contracts.wire import VERSION_PATH

GROUP = 4


def make_tasks(n: int) -> list[dict]:
    tasks = []
    for i in range(n):
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 6, "seed": i}
        if i % 2:
            tasks.append({"task_id": f"g{i}", "env": "guess_number", "prompt": "Guess 0-9.",
                          "data": {"secret": i % 10, "low": 0, "high": 9}, "max_turns": 3,
                          "group_size": GROUP, "sampling": sampling})
        else:
            tasks.append({"task_id": f"a{i}", "env": "arithmetic", "prompt": f"{i % 5}+2=",
                          "data": {"answer": str(i % 5 + 2)}, "max_turns": 1,
                          "group_size": GROUP, "sampling": sampling})
    return [validate_task(t) for t in tasks]


def kill_broker() -> None:
    pid = int((local.kafka_dir() / "broker.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while local.is_running() and time.monotonic() < deadline:
        time.sleep(0.1)


def served_version(url: str) -> int:
    with urllib.request.urlopen(url + VERSION_PATH, timeout=5) as response:
        return int(json.load(response)["version"])


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")
