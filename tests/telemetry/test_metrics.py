"""Prometheus metrics: a real stage process scraped over HTTP, parsed by prometheus_client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup, free_port
from tests.helpers.metrics_helpers import scrape, value


def scrape_until(procs: ProcessGroup, port: int, done: Callable[[dict], bool],
                 timeout_s: float = 60) -> dict:
    """Scrape the process until `done(samples)` holds (it may not be listening yet)."""
    deadline = time.monotonic() + timeout_s
    samples: dict = {}
    while not done(samples):
        procs.check_alive()
        assert time.monotonic() < deadline, f"the process reported {samples}"
        time.sleep(0.3)
        try:
            samples = scrape(port)
        except OSError:
            continue  # not listening yet
    return samples


def test_a_stage_serves_what_it_processed(settings: Settings, tmp_path: Path) -> None:
    tasks = [validate_task({"task_id": f"t{i}", "env": "arithmetic", "prompt": "1+1=",
                            "data": {"answer": "2"}, "group_size": 3}) for i in range(20)]
    publish(settings, tasks)
    producer = kafka.producer(settings)
    for i in range(2):  # not Avro: INIT dead-letters them
        producer.produce(settings.topics.tasks, b"not an event", f"bad{i}")
    producer.flush(10)

    port = free_port()
    procs = ProcessGroup(tmp_path)
    procs.start("init", "stage", "init", "--bootstrap-servers", settings.bootstrap_servers,
                "--prefix", settings.prefix, "--metrics-port", str(port))
    try:
        # Counters move before the commit; wait for the transaction's histogram to count it.
        samples = scrape_until(procs, port, lambda s: (
            value(s, "rollstream_events_consumed_total", stage="init") >= 22
            and value(s, "rollstream_transaction_commit_seconds_count", stage="init") >= 1))
    finally:
        procs.stop_all()

    assert value(samples, "rollstream_events_consumed_total", stage="init") == 22
    assert value(samples, "rollstream_events_produced_total", stage="init",
                 topic=settings.topics.episodes) == 60
    assert value(samples, "rollstream_events_produced_total", stage="init",
                 topic=settings.topics.dlq) == 2
    assert value(samples, "rollstream_events_dead_lettered_total", stage="init") == 2
    # A sample of each batch (a sync stage): at least one event, never more than there were.
    assert 1 <= value(samples, "rollstream_event_latency_seconds_count", stage="init") <= 22
    assert value(samples, "rollstream_rebalances_total", stage="init", kind="assigned") >= 1
    assert value(samples, "rollstream_transaction_aborts_total", stage="init") == 0
    assert value(samples, "rollstream_paused_partitions", stage="init") == 0
    # What was produced is what the topics hold.
    episodes = [TopicPartition(settings.topics.episodes, p, 0) for p in range(4)]
    assert len(list(kafka.read_partitions(settings, episodes))) == 60


def test_domain_metrics_count_scores_and_staleness() -> None:
    from prometheus_client import REGISTRY

    from rollstream.telemetry import metrics

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before_ok = sample("rollstream_episodes_total", failure_class="ok")
    before_infra = sample("rollstream_episodes_total", failure_class="infra")
    before_rewards = sample("rollstream_reward_count", env="envx")
    metrics.scored("envx", "ok", 0.75)
    metrics.scored("envx", "infra", None)
    assert sample("rollstream_episodes_total", failure_class="ok") == before_ok + 1
    assert sample("rollstream_episodes_total", failure_class="infra") == before_infra + 1
    assert sample("rollstream_reward_count", env="envx") == before_rewards + 1  # infra: none
    assert sample("rollstream_reward_sum", env="envx") >= 0.75


def test_sandboxes_alive_counts_created_and_not_destroyed() -> None:
    from prometheus_client import REGISTRY

    from rollstream.sandbox.base import Sandbox, SandboxSpec

    class Workspace(Sandbox):  # the smallest real Sandbox: destroy() is all that matters here
        backend = "test"

        async def _run(self, *args: object) -> tuple[int, bool]:
            return 0, False

        async def write_files(self, files: object) -> None: ...

        async def destroy(self) -> None:
            self.closed = True

    before = REGISTRY.get_sample_value("rollstream_sandboxes_alive")
    boxes = [Workspace(f"s{i}", SandboxSpec()) for i in range(3)]
    assert REGISTRY.get_sample_value("rollstream_sandboxes_alive") == before + 3
    asyncio.run(boxes[0].destroy())
    assert REGISTRY.get_sample_value("rollstream_sandboxes_alive") == before + 2


def test_the_controller_serves_its_updates(settings: Settings, tmp_path: Path) -> None:
    """A real controller process, one live embedded server and one that is down: the version
    applied, the update latency and the failures per server, the servers that answer."""
    from rollstream.contracts.codec import codec
    from rollstream.dev.background import BackgroundServer
    from rollstream.policy_server.model import build_model, save

    checkpoint = tmp_path / "step-1.safetensors"
    save(build_model(seed=1), checkpoint, version=1)
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.policy, codec().encode("PolicyVersion", {
        "version": 1, "kind": "full", "uri": str(checkpoint), "step_id": "step-1",
        "metrics": {}, "created_at_ms": int(time.time() * 1000)}), key="policy", partition=0)
    producer.flush(10)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    port = free_port()
    procs = ProcessGroup(tmp_path)
    with BackgroundServer() as live:
        procs.start("controller", "controller", "--bootstrap-servers",
                    settings.bootstrap_servers, "--prefix", settings.prefix,
                    "--policy-url", f"{live},{down}", "--health-interval-s", "0.3",
                    "--metrics-port", str(port))
        try:
            samples = scrape_until(procs, port, lambda s: (
                value(s, "rollstream_controller_update_failures_total", server=down) >= 2
                and value(s, "rollstream_controller_policy_versions_applied_total",
                          server=live) >= 1))
        finally:
            procs.stop_all()

    # Applied once: the live server then reports version 1 and is left alone.
    assert value(samples, "rollstream_controller_policy_versions_applied_total",
                 server=live) == 1
    assert value(samples, "rollstream_controller_update_seconds_count", server=live) == 1
    assert value(samples, "rollstream_controller_update_seconds_sum", server=live) > 0
    assert value(samples, "rollstream_controller_update_failures_total", server=live) == 0
    assert value(samples, "rollstream_controller_policy_versions_applied_total",
                 server=down) == 0
    assert value(samples, "rollstream_controller_servers") == 2
    assert value(samples, "rollstream_controller_servers_healthy") == 1
    assert value(samples, "rollstream_controller_latest_policy_version") == 1


def test_what_a_jobs_tasks_count_carries_its_label_until_it_is_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs' contexts in one process: each job's stage series, turns, server time,
    sandbox-seconds and staleness count only what ran in its context (its tasks' tasks too);
    forgetting a job drops its series, and a count that comes later does not bring them back."""
    from prometheus_client import REGISTRY

    from rollstream.sandbox.base import Sandbox, SandboxSpec
    from rollstream.telemetry import metrics

    class Workspace(Sandbox):
        backend = "test"

        async def _run(self, *args: object) -> tuple[int, bool]:
            return 0, False

        async def write_files(self, files: object) -> None: ...

        async def destroy(self) -> None:
            self._closing()

    def sample(name: str, job: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {**labels, metrics.JOB_LABEL: job})

    monkeypatch.setattr(metrics, "_serving", True)  # for_stage: real series, not the no-ops
    jobs = {name: metrics.job_context(name) for name in ("job-x", "job-y")}
    assert sample("rollstream_episodes_total", "job-x", failure_class="ok") == 0  # from 0
    stage = jobs["job-x"].run(metrics.for_stage, "eval")
    stage.dead_lettered()

    async def episode(turns: int, versions: list[int]) -> None:
        async def play() -> None:  # a task of the job's task: it inherits the job
            for _ in range(turns):
                metrics.turn(5)
                metrics.server_time(0.25)
            box = Workspace("w", SandboxSpec())
            await asyncio.sleep(0.05)
            await box.destroy()
            metrics.scored("envx", "ok", 1.0, versions)

        await asyncio.create_task(play())

    async def both() -> None:
        await asyncio.gather(
            asyncio.create_task(episode(3, [2, 4]), context=jobs["job-x"]),
            asyncio.create_task(episode(1, [-1]), context=jobs["job-y"]))

    asyncio.run(both())
    assert sample("rollstream_turns_total", "job-x") == 3
    assert sample("rollstream_sampled_tokens_total", "job-x") == 15
    assert sample("rollstream_server_seconds_total", "job-x") == 0.75
    assert sample("rollstream_turns_total", "job-y") == 1
    assert sample("rollstream_episodes_total", "job-y", failure_class="ok") == 1
    for name in jobs:
        assert 0.05 <= (sample("rollstream_sandbox_seconds_total", name) or 0) < 5, name
    assert sample("rollstream_events_dead_lettered_total", "job-x", stage="eval") == 1
    assert sample("rollstream_events_dead_lettered_total", "job-y", stage="eval") is None
    # x's episode began at version 2 while 4 was the newest it saw: 2 stale; y's: unknown.
    assert sample("rollstream_episode_staleness_versions_sum", "job-x") == 2
    assert sample("rollstream_episode_staleness_versions_count", "job-y") == 0

    metrics.forget_job("job-x")
    jobs["job-x"].run(metrics.turn, 7)  # late, as an episode cut off while the job stopped
    assert sample("rollstream_turns_total", "job-x") is None
    assert sample("rollstream_events_dead_lettered_total", "job-x", stage="eval") is None
    assert sample("rollstream_turns_total", "job-y") == 1
    metrics.forget_job("job-y")
