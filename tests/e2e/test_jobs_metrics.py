"""Per-job accounting of a shared fleet, scraped over HTTP: one `rollstream fleet` process per
stage serves two jobs, and each job's series (`rollstream_job="<name>"`) count that job's work
exactly as its own topics record it: episodes per failure class, turns, sampled tokens, dead
letters, staleness, as `rollstream status --job` sums them; with Prometheus scraping the fleet,
every query of the jobs dashboard finds the job's series; a job the fleet stops serving loses
its series."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from producers.publish import publish, validate_task
from rollstream.cli import main
from rollstream.cluster import kafka
from rollstream.cluster.topics import delete_topics
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup, free_port
from rollstream.ops.status import job_numbers
from rollstream.service import jobs, usage
from rollstream.telemetry.metrics import JOB_LABEL
from tests.helpers.metrics_helpers import PROMETHEUS, prometheus, query, scrape, value

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/rollstream-jobs.json"
PARTITIONS = 2
GROUP = 2
TASKS = {"alpha": 5, "beta": 8}  # different counts: one job's numbers cannot pass for another's


def tasks_for(job: str) -> list[dict]:
    return [validate_task({"task_id": f"{job}-{i}", "env": "arithmetic", "prompt": f"{i % 5}+1=",
                           "data": {"answer": str(i % 5 + 1)}, "group_size": GROUP,
                           "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                        "max_tokens": 6, "seed": i}})
            for i in range(TASKS[job])]


def logged(settings: Settings, job: str) -> usage.Usage:
    """The job's usage from its committed records, all hours summed."""
    total = usage.Usage(job, 0)
    for row in usage.job_usage(settings, jobs.get(settings, job)):
        total.episodes += row.episodes
        total.turns += row.turns
        total.sampled_tokens += row.sampled_tokens
        total.dead_letters += row.dead_letters
        for fc, n in row.failures.items():
            total.failures[fc] += n
    return total


def versioned(settings: Settings) -> int:
    """Scored episodes with a turn of a known policy version (those staleness counts)."""
    parts = [TopicPartition(settings.topics.scored, p, 0) for p in range(PARTITIONS)]
    records = (codec().decode_as("ScoredTrajectory", m.value())
               for m in kafka.read_partitions(settings, parts))
    return sum(1 for r in records
               if any(t["policy_version"] >= 0 for t in r["trajectory"]["turns"]))


def jobs_on(samples: dict) -> set[str]:
    return {dict(labels)[JOB_LABEL] for _, labels in samples if JOB_LABEL in dict(labels)}


@pytest.mark.slow
def test_each_jobs_series_count_that_jobs_work(settings: Settings, tmp_path: Path) -> None:
    base = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    procs = ProcessGroup(tmp_path / "logs")
    ports = {stage: free_port() for stage in ("init", "run", "eval")}
    own: dict[str, Settings] = {}
    try:
        for name in TASKS:
            assert main(["jobs", "create", name, "--partitions", str(PARTITIONS), *base]) == 0
            own[name] = jobs.job_settings(settings, jobs.get(settings, name))
        policy = procs.start_policy()
        url = policy.url
        for stage, port in ports.items():
            procs.start(stage, "fleet", stage, *base, "--commit-interval-ms", "100",
                        "--metrics-port", str(port),
                        *(["--policy-url", url] if stage == "run" else []))
        policy.ready()
        # Prometheus (where installed) scrapes the fleet from here on.
        with prometheus(tmp_path, ports) if PROMETHEUS else nullcontext() as prom:
            for name in TASKS:
                assert publish(own[name], tasks_for(name)) == TASKS[name]
            poison = kafka.producer(own["alpha"])  # not Avro: alpha's INIT dead-letters it
            poison.produce(own["alpha"].topics.tasks, b"not an event", b"bad")
            poison.flush(10)

            def wait_for(done: Callable[[], bool], what: str, timeout: float = 120) -> None:
                deadline = time.monotonic() + timeout
                while not done():
                    procs.check_alive()
                    assert time.monotonic() < deadline, f"timed out waiting for {what}"
                    time.sleep(0.5)

            expected = {name: n * GROUP for name, n in TASKS.items()}
            wait_for(lambda: all(logged(settings, n).episodes == expected[n] for n in TASKS)
                     and logged(settings, "alpha").dead_letters == 1, "every job's episodes")
            log = {name: logged(settings, name) for name in TASKS}
            # Counted as they are handled, before their commit: by now every page shows them.
            pages = {stage: scrape(port) for stage, port in ports.items()}

            for name, counted in log.items():
                job = {JOB_LABEL: name}
                assert counted.episodes == expected[name]  # exact from the log: 0 lost, 0 doubled
                for fc, n in counted.failures.items():
                    assert value(pages["eval"], "rollstream_episodes_total", failure_class=fc,
                                 **job) == n, (name, fc)
                assert value(pages["eval"], "rollstream_events_consumed_total", stage="eval",
                             **job) == expected[name]
                assert value(pages["run"], "rollstream_turns_total", **job) == counted.turns > 0
                assert value(pages["run"], "rollstream_sampled_tokens_total",
                             **job) == counted.sampled_tokens > 0
                assert value(pages["run"], "rollstream_server_seconds_total", **job) > 0
                assert value(pages["init"], "rollstream_events_consumed_total", stage="init",
                             **job) == TASKS[name] + counted.dead_letters
                assert value(pages["init"], "rollstream_events_dead_lettered_total", stage="init",
                             **job) == counted.dead_letters
                assert value(pages["eval"], "rollstream_episode_staleness_versions_count",
                             **job) == versioned(own[name])
            assert log["alpha"].dead_letters == 1 and log["beta"].dead_letters == 0
            # A single pipeline's series (no job) count nothing of the jobs'.
            assert value(pages["run"], "rollstream_turns_total") == 0

            # What `status --job` shows: the job's own numbers, summed over the fleet's pages.
            families = [f for port in ports.values() for f in text_string_to_metric_families(
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                .decode())]
            shown = job_numbers(families, "alpha")
            assert (shown["episodes"], shown["turns"], shown["sampled_tokens"],
                    shown["dead_letters"]) == (expected["alpha"], log["alpha"].turns,
                                               log["alpha"].sampled_tokens, 1)
            assert shown["failure_classes"] == log["alpha"].failures
            assert 0 < shown["server_share"] < 1  # beta's requests held the server too

            # Prometheus keeps the label; every query of the jobs dashboard finds alpha's series.
            if prom is not None:
                dashboard = json.loads(DASHBOARD.read_text())
                exprs = [t["expr"].replace("$job", "alpha")
                         for p in dashboard["panels"] for t in p.get("targets", [])]
                wait_for(lambda: all(query(prom, e) for e in exprs), "the dashboard's series", 60)

            # A job no longer served here: its series go (the label stays bounded by the jobs).
            assert main(["jobs", "pause", "beta", *base]) == 0
            wait_for(lambda: all(jobs_on(scrape(port)) == {"alpha"} for port in ports.values()),
                     "beta's series to go", timeout=60)
    finally:
        procs.stop_all()
        for name in own:
            delete_topics(settings.bootstrap_servers, f"{settings.prefix}.{name}")
