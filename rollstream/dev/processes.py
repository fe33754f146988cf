"""Start and stop the pipeline's processes (policy server, stages) as real OS processes."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Where free_port looks: below the kernel's ephemeral range, from which every client connection
# takes its local port. A port the kernel hands out (bind to 0) can be taken by a client (a Kafka
# connection) between this call and the server's bind: a stage's metrics port once was.
PORTS_FROM = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A port on 127.0.0.1 that no socket holds now and that no client connection will take."""
    try:
        below = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        below = 0
    candidates = ([random.randrange(PORTS_FROM, below) for _ in range(100)]
                  if below > PORTS_FROM else [])
    for port in [*candidates, 0]:  # 0, the kernel's choice: no range known, or all taken
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


# The embedded policy server's first start imports torch (about 8 s of CPU alone); beside a
# fleet's processes starting on a busy two-core machine (load 12) it once took over 120 s.
POLICY_START_S = 300.0


@dataclass(frozen=True)
class PolicyServer:
    """The embedded policy server as ProcessGroup.start_policy started it, perhaps not ready."""

    url: str
    proc: subprocess.Popen

    def ready(self) -> str:
        """Wait until its /health answers (or it exits: RuntimeError); its URL."""
        wait_http(f"{self.url}/health", timeout=POLICY_START_S, proc=self.proc)
        return self.url


class ProcessGroup:
    """`rollstream ...` subprocesses with their logs; stops every one it started."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return self.start_program(name, [sys.executable, "-m", "rollstream.cli", *args], env)

    def start_policy(self) -> PolicyServer:
        """`rollstream serve-policy` (the embedded policy) on a free port as "policy", not
        waited for: start what else needs starting, then `ready()`."""
        port = free_port()
        proc = self.start("policy", "serve-policy", "--port", str(port))
        return PolicyServer(f"http://127.0.0.1:{port}", proc)

    def start_program(self, name: str, argv: list[str],
                      env: dict[str, str] | None = None) -> subprocess.Popen:
        """Any program (e.g. vLLM in its own virtualenv), logged and stopped like the rest."""
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        log.close()
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL: the crash case, nothing is flushed or committed."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def stop(self, name: str, timeout: float = 30.0) -> int:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self, timeout: float = 30.0) -> None:
        for name in list(self.procs):
            self.stop(name, timeout)

    def stop_together(self, timeout: float = 45.0) -> list[str]:
        """SIGTERM every process at once; the names that did not stop within `timeout` (hung,
        then killed): a benchmark's verdict on clean shutdown."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        hung, deadline = [], time.monotonic() + timeout
        for name, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(name)
                proc.kill()
                proc.wait()
        self.procs.clear()
        return hung

    def log_tail(self, name: str, lines: int = 40) -> str:
        """The end of a process's log, for a failure message (CI keeps no temp folders)."""
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see "
                                   f"{self.log_dir / (name + '.log')}")


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until GET url answers 200 (a started server is ready)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s")
