"""free_port: a port for a test's server that a client connection cannot take meanwhile."""

from __future__ import annotations

import itertools
import socket

import pytest

from rollstream.dev import processes
from rollstream.dev.processes import EPHEMERAL_RANGE, free_port


def test_free_ports_lie_below_the_range_client_connections_take_theirs_from() -> None:
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert processes.PORTS_FROM <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # and nothing holds it


def test_a_port_held_by_a_listener_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        other = free_port()
        picks = itertools.chain([taken], itertools.repeat(other))
        monkeypatch.setattr(processes.random, "randrange", lambda *_: next(picks))
        monkeypatch.setattr(processes, "PORTS_FROM", 1)
        assert free_port() == other
