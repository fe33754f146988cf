"""A real Prometheus server scrapes a running pipeline; PromQL over its HTTP API sees every
episode scored and every stage's lag."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup, free_port
from tests.helpers.metrics_helpers import (
    GROUP,
    PROMETHEUS,
    TASKS,
    prometheus,
    query,
    start_pipeline,
)


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus server installed (make deps "
                                               "installs Debian's as root)")
def test_prometheus_scrapes_every_process_of_a_pipeline(settings: Settings,
                                                        tmp_path: Path) -> None:
    procs = ProcessGroup(tmp_path / "logs")
    ports = {name: free_port() for name in ("init", "run", "eval", "train", "status")}
    with prometheus(tmp_path, ports) as base:
        try:
            procs.start("status", "status", "--watch", "--json", "--interval", "1",
                        "--bootstrap-servers", settings.bootstrap_servers,
                        "--prefix", settings.prefix, "--metrics-port", str(ports["status"]))
            start_pipeline(settings, procs, tmp_path, ports)

            # The scored count, not its rate: the counter's series appears with the first
            # scored episode, and a small run can drain before Prometheus has two samples to
            # take a rate of.
            deadline = time.monotonic() + 120
            while True:
                procs.check_alive()
                up = query(base, "up")
                scored = query(base, "sum(rollstream_episodes_total)")
                lag = query(base, "rollstream_stage_lag_events")
                if (len(up) == len(ports) and all(r["value"][1] == "1" for r in up)
                        and scored and float(scored[0]["value"][1]) == TASKS * GROUP
                        and len(lag) == 4):
                    break
                assert time.monotonic() < deadline, f"up={up} scored={scored} lag={lag}"
                time.sleep(1)
        finally:
            procs.stop_all()

    assert {r["metric"]["process"] for r in up} == set(ports)
    assert {r["metric"]["stage"] for r in lag} == {"init", "run", "eval", "train"}
    assert all(float(r["value"][1]) >= 0 for r in lag)
