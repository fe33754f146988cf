"""librdkafka's own lines go through the project's logging, and a refused address ends a
one-shot command at once."""

from __future__ import annotations

import socket
import subprocess
import sys
import time


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections to it are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# In a process of its own, as a command is: a client there whose transaction failed before
# (test_publish's all-or-nothing test, in the same worker) leaves later clients' lines undelivered.
CLIENT = """
import logging, sys, time
from confluent_kafka import Producer
from rollstream.config import load
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout,
                    format="%(name)s %(levelname)s %(message)s")
producer = Producer(load(bootstrap_servers=sys.argv[1]).kafka())
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    producer.poll(0.2)  # delivers the queued log lines to the logger
"""


def test_client_lines_go_to_the_projects_log_not_stderr() -> None:
    out = subprocess.run([sys.executable, "-c", CLIENT, f"127.0.0.1:{_closed_port()}"],
                         capture_output=True, text=True, timeout=120)
    client = [line for line in out.stdout.splitlines()
              if line.startswith("rollstream.kafka.client ")]
    assert any("Connection refused" in line for line in client), out.stdout[-2000:]
    # An error the project handles itself (it waits, or the command says so): detail, INFO.
    assert {line.split()[1] for line in client} <= {"INFO", "DEBUG"}
    assert "|FAIL|" not in out.stderr  # librdkafka's raw stderr format


def test_a_refused_address_ends_a_command_at_once_in_one_line() -> None:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "rollstream.cli", "status",
                          "--bootstrap-servers", f"127.0.0.1:{_closed_port()}"],
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 69, out.stderr
    assert out.stderr.count("\n") == 1 and "Connection refused" in out.stderr, out.stderr
    assert took < 15, f"took {took:.1f} s (the --timeout default is 30)"
