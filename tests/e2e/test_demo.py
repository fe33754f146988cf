"""`rollstream demo` as a user runs it (a short version): it finishes, summarizes and plots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_finishes_with_a_summary_and_a_plot(bootstrap: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollstream.cli", "demo", "--tasks", "40", "--timeout", "180",
         "--bootstrap-servers", bootstrap, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "320/320" in out  # 40 tasks x 8 samples, every one scored
    for heading in ("mean reward by the policy version", "policy versions trained",
                    "per-stage latency"):
        assert heading in out
    # The embedded template is append-only: one training sample per episode.
    assert "1.00 (320 in all)" in out
    plot = tmp_path / "demo.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
