"""The compose stack for real: brought up with the local-image override, it closes the RL loop
(tasks scored, the trainer publishes a policy version), then is torn down."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ("rollstream:latest", "rollstream/kafka:local", "rollstream/prometheus:local")


def _missing() -> str | None:
    """Why the stack cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    try:
        subprocess.run(["docker", "compose", "version"], check=True, capture_output=True,
                       timeout=30)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "no docker compose plugin"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker engine reachable"
    absent = [i for i in IMAGES if subprocess.run(["docker", "image", "inspect", i],
                                                  capture_output=True).returncode != 0]
    return f"images not built ({', '.join(absent)}): docker build . and make images" \
        if absent else None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compose_stack_closes_the_rl_loop() -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    compose = ["docker", "compose", "-p", f"rs{uuid.uuid4().hex[:8]}", "-f",
               str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.local.yml")]

    def run(*args: str, timeout: float = 300) -> str:
        return subprocess.run([*compose, *args], check=True, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT).stdout

    try:
        run("up", "-d", "--no-build", "kafka", "topics", "policy", "init", "run", "eval",
            "train", "controller", "prometheus")
        run("run", "--rm", "--no-deps", "init", "publish", "examples/tasks/copy_letter.jsonl")
        deadline = time.monotonic() + 300
        while True:
            out = run("run", "--rm", "--no-deps", "init", "status", "--json", "--interval", "1")
            snap = json.loads(out.strip().splitlines()[-1])
            stages = {s["stage"]: s for s in snap["stages"]}
            if (snap["policy"] and snap["policy"]["version"] >= 1
                    and stages["eval"]["committed"] > 0):
                break
            assert time.monotonic() < deadline, f"the loop did not close: {snap}"
            time.sleep(5)
    finally:
        subprocess.run([*compose, "down", "-v", "--remove-orphans"], capture_output=True,
                       timeout=300, cwd=ROOT)
    assert snap["dlq"]["count"] == 0
