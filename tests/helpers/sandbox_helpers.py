"""Shared by the sandbox and SWE tests: a private sandbox root, the leak check (no sandbox
directory and no sandboxed process may outlive a test), and running as an unprivileged owner."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollstream.sandbox import bwrap, docker
from rollstream.sandbox.backends import BACKEND_ENV
from rollstream.sandbox.leases import ROOT_ENV

BWRAP_MISSING = bwrap.available()
needs_bwrap = pytest.mark.skipif(BWRAP_MISSING is not None, reason=f"{BWRAP_MISSING}")
DOCKER_MISSING = docker.available()
# For tests run on each backend; docker's, heavier, are marked slow.
BACKENDS = [pytest.param("bwrap", id="bwrap", marks=needs_bwrap),
            pytest.param("docker", id="docker", marks=[
                pytest.mark.slow,
                pytest.mark.skipif(DOCKER_MISSING is not None, reason=f"{DOCKER_MISSING}")])]


def processes_in(root: Path) -> dict[int, str]:
    """Live sandboxed processes of sandboxes under `root` (other test runs have their own)."""
    return {pid: d for pid, d in bwrap.sandbox_processes().items()
            if d.startswith(f"{root}/")}


def live_sandboxes(root: Path) -> tuple[list[str], dict[int, str]]:
    return sorted(p.name for p in root.glob("bw-*")), processes_in(root)


@pytest.fixture
def sandbox_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """ROLLSTREAM_SANDBOX_ROOT for this test (in-process and child processes alike); fails the
    test if a sandbox or a sandboxed process is left afterwards."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setenv(ROOT_ENV, str(root))
    yield root
    dirs, procs = live_sandboxes(root)
    assert not dirs, f"sandboxes left behind: {dirs}"
    assert not procs, f"sandboxed processes left behind: {procs}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, sandbox_root: Path,
            monkeypatch: pytest.MonkeyPatch) -> str:
    """Every sandbox the test makes comes from this backend (and none may be left)."""
    monkeypatch.setenv(BACKEND_ENV, request.param)
    return request.param


def as_nobody() -> list[str] | None:
    """A command prefix running a Python as an unprivileged owner, or None where none can."""
    if os.geteuid() != 0:
        return [sys.executable]
    for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python]
        # The project's virtualenv may live where nobody may enter (e.g. under /root).
        probe = "import os, sys; os.listdir(sys.base_prefix)"  # bwrap must bind it
        if subprocess.run([*prefix, "-c", probe], capture_output=True).returncode == 0:
            return prefix
    return None
