"""`rollstream status` on a real pipeline run: every stage listed, lags drained to 0, and each
process's /metrics agreeing with what the topics hold."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup, free_port
from tests.helpers.metrics_helpers import GROUP, TASKS, scrape, start_pipeline, value


def status(settings: Settings, *extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "rollstream.cli", "status", "--json", "--interval", "0.5",
         "--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix,
         *extra], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_status_shows_every_stage_drained_and_metrics_match(settings: Settings,
                                                             tmp_path: Path) -> None:
    procs = ProcessGroup(tmp_path / "logs")
    ports = {name: free_port() for name in ("init", "run", "eval", "train")}
    try:
        url = start_pipeline(settings, procs, tmp_path, ports)
        deadline = time.monotonic() + 120
        metrics_urls = [f"--metrics-url=http://127.0.0.1:{p}/metrics" for p in ports.values()]
        while True:
            procs.check_alive()
            snap = status(settings, "--policy-url", url, *metrics_urls)
            stages = {s["stage"]: s for s in snap["stages"]}
            if all(s["lag"] == 0 and s["committed"] > 0 for s in stages.values()):
                break
            assert time.monotonic() < deadline, f"the pipeline did not drain: {snap}"
            time.sleep(1)
        samples = {name: scrape(p) for name, p in ports.items()}
        # Not told the servers: it probes the ones RUN reports using, not its own default.
        unnamed = status(settings, *metrics_urls)["servers"]
    finally:
        procs.stop_all()

    assert set(stages) == {"init", "run", "eval", "train"}
    for name, s in stages.items():
        assert s["lag_exact"] and s["lag"] == 0
        assert len(s["members"]) == 1, name
        assert sorted(s["members"][0]["partitions"]) == list(range(4)), name
        if name != "train":  # the trainer has no in-flight gauge
            assert s["in_flight"] == 0, name
        assert "rate" in s
    assert snap["dlq"]["count"] == 0
    assert snap["servers"] == [{"url": url, "healthy": True, "load": snap["servers"][0]["load"],
                                "assumed": False}]
    assert [(s["url"], s["healthy"]) for s in unnamed] == [(url, True)]

    scored = list(kafka.read_partitions(
        settings, [TopicPartition(settings.topics.scored, p, 0) for p in range(4)]))
    assert len(scored) == TASKS * GROUP
    assert value(samples["init"], "rollstream_events_consumed_total", stage="init") == TASKS
    assert value(samples["run"], "rollstream_events_consumed_total", stage="run") == TASKS * GROUP
    assert value(samples["eval"], "rollstream_events_produced_total", stage="eval",
                 topic=settings.topics.scored) == TASKS * GROUP
    scored_total = sum(v for (name, _), v in samples["eval"].items()
                       if name == "rollstream_episodes_total")
    assert scored_total == TASKS * GROUP
    assert value(samples["run"], "rollstream_inference_requests_total", server=url,
                 outcome="ok") >= TASKS * GROUP


def test_status_renders_a_jobs_numbers() -> None:
    from rich.console import Console

    from rollstream.ops.status import render

    snap = {"prefix": "rs.alpha", "stages": [], "policy": None, "servers": [],
            "dlq": {"count": 1, "latest": []},
            "job": {"name": "alpha", "episodes": 10, "failure_classes": {"ok": 9, "infra": 1},
                    "turns": 12, "sampled_tokens": 60, "dead_letters": 1,
                    "server_seconds": 3.5, "server_share": 0.25, "sandbox_seconds": 0.0,
                    "staleness_mean": 1.5, "retries": 3, "retries_spent": 1,
                    "groups_dropped": {"infra": 1, "zero_variance": 2},
                    "adapter_lacking": [{"server": "http://vllm-1:8000", "adapter": "team-a-v3",
                                         "newest": True}]}}
    console = Console(record=True, width=300)
    console.print(render(snap))
    text = console.export_text()
    assert ("job alpha (from /metrics): 10 episodes scored (ok 9, infra 1), 12 turns, "
            "60 tokens sampled, 1 dead-lettered, server time 3.5 s (25% of all jobs'), "
            "sandbox time 0 s, staleness 1.5 versions on average; server http://vllm-1:8000 "
            "lacks team-a-v3 (the job's newest adapter) and serves it nothing") in text
    assert ("infra retries: 3 episodes played again, 1 failed with every retry spent; groups "
            "dropped: infra 1, zero_variance 2") in text
    console.print(render({**snap, "job": {"name": "alpha"}}))  # no --metrics-url given
    assert "job alpha: give the fleet's --metrics-url" in console.export_text()


def test_retry_numbers_are_runs_and_the_trainers_counts_from_metrics_pages() -> None:
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rollstream.ops.status import retry_numbers
    from rollstream.telemetry import metrics

    def count() -> None:
        metrics.retried(spent=False)
        metrics.retried(spent=False)
        metrics.retried(spent=True)
        metrics.group_dropped("infra")

    metrics.job_context("retrying").run(count)
    try:
        families = list(text_string_to_metric_families(generate_latest(REGISTRY).decode()))
        assert retry_numbers(families, "retrying") == {
            "retries": 2, "retries_spent": 1, "groups_dropped": {"infra": 1}}
        everyone = retry_numbers(families)  # without --job: every series on the pages
        assert everyone["retries"] >= 2 and everyone["groups_dropped"]["infra"] >= 1
    finally:
        metrics.forget_job("retrying")


def test_status_on_missing_topics_exits_78_naming_one(bootstrap: str) -> None:
    """docs/security.md's table: the pipeline's topics missing is exit 78 with one line."""
    out = subprocess.run(
        [sys.executable, "-m", "rollstream.cli", "status", "--bootstrap-servers", bootstrap,
         "--prefix", "status-nothing-here"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 78, out.stderr
    assert "status-nothing-here.tasks" in out.stderr and "rollstream topics create" in out.stderr
    assert "Traceback" not in out.stderr


def test_lag_leaves_out_an_aborted_transactions_records(settings: Settings) -> None:
    """What a publish stopped by Ctrl-C leaves: many records in an aborted transaction. They
    are no one's work, so INIT's lag stays 0 (more of them than the old exact-count limit)."""
    from rollstream.cluster.kafka import transactional_producer
    from rollstream.ops.status import Inspector

    p = transactional_producer(settings, f"{settings.prefix}.test-aborted")
    p.begin_transaction()
    for i in range(25_000):
        p.produce(settings.topics.tasks, b"x", key=str(i).encode())
    p.flush(60)
    p.abort_transaction(60)
    inspector = Inspector(settings)
    try:
        init = inspector.stage("init", "init", "tasks")
    finally:
        inspector.close()
    assert (init["lag"], init["lag_exact"]) == (0, True)


def test_a_server_only_assumed_says_where_runs_servers_come_from(settings: Settings) -> None:
    """With no --policy-url and no RUN page, status can only probe the default URL: a DOWN
    there says how to show RUN's own servers instead of reading as an outage."""

    from rich.console import Console

    from rollstream.ops.status import Inspector, render

    for named, assumed in ((None, True), ("http://127.0.0.1:9", False)):
        chosen = settings if named is None else settings.override(policy_url=named)
        inspector = Inspector(chosen)
        try:
            rows = inspector.servers()
        finally:
            inspector.close()
        assert [row["assumed"] for row in rows] == [assumed]
    console = Console(record=True, width=300)
    console.print(render({"prefix": "p", "stages": [], "policy": None,
                          "dlq": {"count": 0, "latest": []},
                          "servers": [{"url": "http://127.0.0.1:8011", "healthy": False,
                                       "load": {}, "assumed": True}]}))
    assert ("server http://127.0.0.1:8011: DOWN (the default URL: RUN's servers are those its "
            "--metrics-url page reports, or name them with --policy-url)") in console.export_text()
