"""Shared by the metrics and status tests: a pipeline whose processes serve /metrics, and its
samples scraped over HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from producers.publish import publish, validate_task
from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup, free_port, wait_http


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


PROMETHEUS = shutil.which("prometheus")


@contextmanager
def prometheus(workdir: Path, ports: dict[str, int]) -> Iterator[str]:
    """A real Prometheus server scraping every second each process of `ports` (name -> its
    /metrics port), labelled `process=<name>`; yields its base URL once it is ready."""
    assert PROMETHEUS is not None
    port = free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "rollstream", "static_configs": [
                  {"targets": [f"127.0.0.1:{p}"], "labels": {"process": name}}
                  for name, p in ports.items()]}]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # YAML is a superset of JSON
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
         f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=open(workdir / "prometheus.log", "wb"),  # noqa: SIM115 - the process owns it
        stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/-/ready", timeout=120, proc=server)
        yield base
    finally:
        server.terminate()
        server.wait(30)


def query(base: str, promql: str) -> list[dict]:
    """An instant PromQL query's result."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


TASKS, GROUP = 12, 2


def start_pipeline(settings: Settings, procs: ProcessGroup, workdir: Path,
                   ports: dict[str, int]) -> str:
    """Policy server, INIT, RUN, EVAL and the trainer, each stage serving /metrics on its port
    in `ports`; publishes TASKS tasks. Returns the policy server's URL."""
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    policy = procs.start_policy()
    url = policy.url
    for stage in ("init", "run", "eval"):
        procs.start(stage, "stage", stage, *common, "--commit-interval-ms", "100",
                    *(["--policy-url", url] if stage == "run" else []),
                    "--metrics-port", str(ports[stage]))
    procs.start("train", "train", *common, "--checkpoint-dir", str(workdir / "ckpt"),
                "--groups-per-batch", "2", "--metrics-port", str(ports["train"]))
    policy.ready()
    publish(settings, [validate_task({
        "task_id": f"a{i}", "env": "arithmetic", "prompt": f"{i % 5}+2=",
        "data": {"answer": str(i % 5 + 2)}, "group_size": GROUP,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4,
                     "seed": i}}) for i in range(TASKS)])
    return url
