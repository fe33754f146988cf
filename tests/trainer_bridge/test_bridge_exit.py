"""Nothing a bridge starts keeps a failing trainer alive: a process that opened a TrainerBridge
without `with` and then raised used to spin at interpreter exit, never ending. And a bridge with
no broker configured fails at once, in the CLI's words, instead of waiting for one."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollstream.config import Settings, load
from trainer_bridge.bridge import TrainerBridge

# Within this the process must be gone: the bridge's own close is bounded by the Kafka calls'
# timeout (30 s); a busy machine needs some of the rest to start Python.
EXIT_BOUND_S = 90

SCRIPT = """
import sys
from rollstream.config import load
from trainer_bridge.bridge import TrainerBridge

settings = load(bootstrap_servers=sys.argv[1], prefix=sys.argv[2], partitions=4)
bridge = TrainerBridge(settings, 2)
print("bridge open", flush=True)
raise RuntimeError("the trainer failed")
"""


def test_a_failing_process_that_never_closed_its_bridge_exits(
        settings: Settings, tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(SCRIPT)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script), settings.bootstrap_servers, settings.prefix],
        capture_output=True, text=True, timeout=EXIT_BOUND_S,
        cwd=Path(__file__).resolve().parents[2])
    took = time.monotonic() - started
    assert "bridge open" in done.stdout, done.stderr[-2000:]
    assert done.returncode == 1, done.stderr[-2000:]
    assert "RuntimeError: the trainer failed" in done.stderr
    assert took < EXIT_BOUND_S


def test_no_broker_configured_fails_at_once_in_the_clis_words() -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match="no Kafka broker is configured: name one with "
                                         "--bootstrap-servers"):
        TrainerBridge(load(bootstrap_servers="", prefix="nobroker"), 2)
    assert time.monotonic() - started < 5
