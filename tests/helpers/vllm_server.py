"""A real vLLM server (its CPU build, `make vllm-deps`) serving the tiny local model, one per test
session.

Started on first use, not at session start: most runs select no real-vLLM test. With xdist
workers the controller only names a directory (conftest.py's pytest_configure); the first worker
that needs the server starts it there, detached from itself, under a file lock, and the others
read its address; the controller stops it when the run ends. Without workers the session
fixture starts and stops it. Its log is kept in that directory and its tail printed when it does
not come up within START_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rollstream.dev import tiny_model, vllm_launch
from rollstream.dev.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = vllm_launch.venv(ROOT)
MODEL_DIR = ROOT / ".rollstream" / "tiny-model"
SHARED_DIR_ENV = "ROLLSTREAM_TEST_VLLM_DIR"  # the controller's directory for the shared server
URL_ENV = "ROLLSTREAM_TEST_VLLM_URL"  # a running server of the tiny model to use instead
# To /health on a busy 2-core machine (28-125 s measured alone; over 180 s while the suite's
# six workers kept the load average above 20: ROLLSTREAM_TEST_VLLM_START_S).
START_TIMEOUT_S = float(os.environ.get("ROLLSTREAM_TEST_VLLM_START_S", "420"))


def impossible() -> str | None:
    """Why vLLM's CPU build cannot be installed here, or None."""
    if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
        return f"vLLM's CPU build is for x86-64 Linux only (this is {platform.platform()})"
    return None


@dataclass(frozen=True)
class RealVllm:
    url: str
    model: tiny_model.TinyModel
    log: Path

    @property
    def name(self) -> str:
        return str(self.model.model)  # the served model's name is its path


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def _start(directory: Path, model: tiny_model.TinyModel) -> tuple[int, str]:
    """Start the server detached (its own session) and wait for /health; (pid, url)."""
    if not (VENV / ".installed").is_file():
        raise RuntimeError(f"vLLM's CPU build is not installed in {VENV}: run `make vllm-deps`")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = directory / "vllm.log"
    argv, env = vllm_launch.serve_command(ROOT, model.model, port)
    with log.open("ab") as out:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _healthy(url):
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process.pid)
            tail = log.read_text(errors="replace").splitlines()[-40:]
            state = (f"exited with {process.returncode}" if process.returncode is not None
                     else f"not healthy after {START_TIMEOUT_S:.0f} s")
            raise RuntimeError(f"vLLM {state}; log {log}:\n" + "\n".join(tail))
        time.sleep(1)
    return process.pid, url


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def shared(directory: Path) -> RealVllm:
    """The server of `directory`, started by the first caller (any process) and reused."""
    model = tiny_model.build(MODEL_DIR)
    if os.environ.get(URL_ENV):
        return RealVllm(os.environ[URL_ENV].rstrip("/"), model, directory / "vllm.log")
    state = directory / "server.json"
    with (directory / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if state.is_file():
            known = json.loads(state.read_text())
            if "error" in known:  # the first start failed: the same error, not another wait
                raise RuntimeError(known["error"])
            return RealVllm(known["url"], model, directory / "vllm.log")
        try:
            pid, url = _start(directory, model)
        except RuntimeError as exc:
            state.write_text(json.dumps({"error": str(exc)}))
            raise
        state.write_text(json.dumps({"pid": pid, "url": url}))
    return RealVllm(url, model, directory / "vllm.log")


def stop_shared(directory: Path) -> None:
    """Stop the server a worker started in `directory`, if any (the controller, at the end)."""
    state = directory / "server.json"
    if state.is_file():
        pid = json.loads(state.read_text()).get("pid")
        if pid is not None:
            _stop(pid)


@contextlib.contextmanager
def own(directory: Path) -> Iterator[RealVllm]:
    """A server for this process alone (no workers), stopped on exit."""
    try:
        yield shared(directory)
    finally:
        stop_shared(directory)
