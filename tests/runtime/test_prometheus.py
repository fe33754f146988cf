"""A real Prometheus server scrapes a running pipeline; PromQL over its HTTP API sees every
episode scored and every stage's lag."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup, free_port, wait_http
from tests.helpers.metrics_helpers import GROUP, TASKS, start_pipeline

PROMETHEUS = shutil.which("prometheus")


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus server installed (make deps "
                                               "installs Debian's as root)")
def test_prometheus_scrapes_every_process_of_a_pipeline(settings: Settings,
                                                        tmp_path: Path) -> None:
    procs = ProcessGroup(tmp_path / "logs")
    ports = {name: free_port() for name in ("init", "run", "eval", "train", "status")}
    prom_port = free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "rollstream", "static_configs": [
                  {"targets": [f"127.0.0.1:{p}"], "labels": {"process": name}}
                  for name, p in ports.items()]}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # YAML is a superset of JSON
    prometheus = None
    try:
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115 - the process owns it
            stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{prom_port}"
        wait_http(f"{base}/-/ready", timeout=120, proc=prometheus)
        procs.start("status", "status", "--watch", "--json", "--interval", "1",
                    "--bootstrap-servers", settings.bootstrap_servers,
                    "--prefix", settings.prefix, "--metrics-port", str(ports["status"]))
        start_pipeline(settings, procs, tmp_path, ports)

        # The scored count, not its rate: the counter's series appears with the first scored
        # episode, and a small run can drain before Prometheus has two samples to take a rate of.
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
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)

    assert {r["metric"]["process"] for r in up} == set(ports)
    assert {r["metric"]["stage"] for r in lag} == {"init", "run", "eval", "train"}
    assert all(float(r["value"][1]) >= 0 for r in lag)
