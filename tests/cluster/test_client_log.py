"""librdkafka's own lines go through the project's logging, and a refused address ends a
one-shot command at once."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer

from rollstream.config import load


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections to it are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_lines_go_to_the_projects_log_not_stderr(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    settings = load(bootstrap_servers=f"127.0.0.1:{_closed_port()}")
    caplog.set_level(logging.DEBUG, logger="rollstream")
    producer = Producer(settings.kafka())
    deadline = time.monotonic() + 20
    while not any("Connection refused" in r.getMessage() for r in caplog.records) \
            and time.monotonic() < deadline:
        producer.poll(0.2)  # delivers the queued log lines to the logger
    client = [r for r in caplog.records if r.name == "rollstream.kafka.client"]
    assert any("Connection refused" in r.getMessage() for r in client), caplog.records
    # An error the project handles itself (it waits, or the command says so): detail, INFO.
    assert {r.levelno for r in client} <= {logging.INFO, logging.DEBUG}
    assert "|FAIL|" not in capfd.readouterr().err  # librdkafka's raw stderr format


def test_a_refused_address_ends_a_command_at_once_in_one_line() -> None:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "rollstream.cli", "status",
                          "--bootstrap-servers", f"127.0.0.1:{_closed_port()}"],
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 69, out.stderr
    assert out.stderr.count("\n") == 1 and "Connection refused" in out.stderr, out.stderr
    assert took < 15, f"took {took:.1f} s (the --timeout default is 30)"
