"""A broker of the test's own, for the tests that SIGKILL it (pipeline_helpers.kill_broker):
the session's broker is everyone's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollstream.broker import local


@pytest.fixture
def own_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    libs = local.resolve_jars()  # the project's jars, fetched once, shared with this broker
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "broker"))
    # 512 MB: restarted after a SIGKILL, a broker of 256 MB died of OutOfMemoryError while
    # it recovered its logs and activated its controller (a CI run of the broker-restart test).
    monkeypatch.setenv(local.HEAP_ENV, "512m")
    local.kafka_dir().mkdir(parents=True)
    local.libs_dir().symlink_to(libs, target_is_directory=True)
    bootstrap = local.start(timeout=120)
    try:
        yield bootstrap
    finally:
        local.stop(timeout=20)
