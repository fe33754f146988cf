"""A broker of the test's own, for the tests that SIGKILL it (pipeline_helpers.kill_broker):
the session's broker is everyone's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollstream.broker import local


@pytest.fixture
def own_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # 512 MB: restarted after a SIGKILL, a broker of 256 MB died of OutOfMemoryError while
    # it recovered its logs and activated its controller (a CI run of the broker-restart test).
    monkeypatch.setenv(local.HEAP_ENV, "512m")
    with local.home_sharing_jars(tmp_path / "broker"):
        bootstrap = local.start(timeout=120)
        try:
            yield bootstrap
        finally:
            local.stop(timeout=20)
