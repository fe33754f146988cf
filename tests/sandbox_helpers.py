"""Shared by the sandbox and SWE tests: a private sandbox root, and the leak check (no sandbox
directory and no sandboxed process may outlive a test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollstream.sandbox import bwrap
from rollstream.sandbox.leases import ROOT_ENV

BWRAP_MISSING = bwrap.available()
needs_bwrap = pytest.mark.skipif(BWRAP_MISSING is not None, reason=f"{BWRAP_MISSING}")


def live_sandboxes(root: Path) -> tuple[list[str], dict[int, str]]:
    return sorted(p.name for p in root.glob("bw-*")), bwrap.sandbox_processes()


@pytest.fixture
def sandbox_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """ROLLSTREAM_SANDBOX_ROOT for this test (in-process and child processes alike); fails the
    test if a sandbox or a sandboxed process is left afterwards."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setenv(ROOT_ENV, str(root))
    before = bwrap.sandbox_processes()
    yield root
    dirs, procs = live_sandboxes(root)
    leaked = {pid: sid for pid, sid in procs.items() if pid not in before}
    assert not dirs, f"sandboxes left behind: {dirs}"
    assert not leaked, f"sandboxed processes left behind: {leaked}"
