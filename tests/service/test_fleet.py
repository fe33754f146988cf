"""A fleet in one process (rollstream.service.fleet) on the real broker: it serves a job created
while it runs, drains and stops a paused one (its group empties, its input waits), and serves it
again from where it stopped when resumed; RUN's jobs share the servers' slots by weight."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from producers.publish import publish, validate_task
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings
from rollstream.service import jobs
from rollstream.service.fleet import Fleet
from stages.init import InitStage

PARTITIONS = 2
SAMPLES = 15


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def episodes(settings: Settings) -> int:
    parts = [TopicPartition(settings.topics.episodes, p, 0) for p in range(PARTITIONS)]
    return len(list(kafka.read_partitions(settings, parts)))


def tasks(first: int, count: int) -> list[dict]:
    return [validate_task({"task_id": f"t{i}", "env": "arithmetic", "prompt": "1+1=",
                           "data": {"answer": "2"}, "group_size": 2})
            for i in range(first, first + count)]


@pytest.fixture
def fleet(settings: Settings) -> Iterator[Fleet]:
    served = Fleet(settings, lambda job_settings, job, share: InitStage(job_settings),
                   drain_timeout_s=5)
    thread = threading.Thread(target=lambda: asyncio.run(served.serve()))
    thread.start()
    yield served
    served.stop()
    thread.join(60)
    assert not thread.is_alive()
    delete_topics(settings.bootstrap_servers, f"{settings.prefix}.a")


def test_a_job_is_picked_up_paused_and_resumed_without_a_restart(settings: Settings,
                                                                   fleet: Fleet) -> None:
    job = jobs.new_job("a", settings.prefix)
    create_topics(settings.bootstrap_servers, job["prefix"], PARTITIONS, specs=jobs.JOB_TOPICS)
    jobs.put(settings, job)
    a = jobs.job_settings(settings, job)
    publish(a, tasks(0, 5))
    wait_until(lambda: episodes(a) == 10, "the job's first episodes")

    jobs.put(settings, {**job, "state": "PAUSED"})
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    group = a.topics.group("init")
    wait_until(lambda: "a" not in fleet.served, "the paused job's runtime to stop")
    assert admin.describe_consumer_groups([group])[group].result(timeout=10).members == []
    publish(a, tasks(5, 5))
    time.sleep(2)
    assert episodes(a) == 10  # paused: its input waits

    jobs.put(settings, {**job, "state": "RUNNING"})
    wait_until(lambda: episodes(a) == 20, "the resumed job's episodes")
    time.sleep(1)
    assert episodes(a) == 20  # from where it stopped: nothing redone


def test_backlogged_jobs_share_the_servers_by_weight(settings: Settings) -> None:
    """Two backlogged jobs, weights 1 and 3, on one RUN fleet whose server takes 4 episodes at
    once: while both have input waiting they get 1 and 3 of the slots."""
    from rollstream.dev.simulated import SimulatedServer
    from rollstream.inference.routing import Router
    from stages.run import RunStage

    made = {"x": jobs.new_job("x", settings.prefix, weight=1),
            "y": jobs.new_job("y", settings.prefix, weight=3)}
    for job in made.values():
        create_topics(settings.bootstrap_servers, job["prefix"], PARTITIONS,
                      specs=jobs.JOB_TOPICS)
        jobs.put(settings, job)
        publish(jobs.job_settings(settings, job), tasks(0, 40))
    samples: dict[str, list[int]] = {"x": [], "y": []}

    async def main() -> None:
        # Each episode: 6 decode steps of 20 ms (a digit, five more, then the stop token).
        server = SimulatedServer(script=lambda ids, body: ([ord("1")] * 6 + [0], "111111"),
                                 step_s=lambda running: 0.02)
        url = await server.start()
        run_settings = settings.override(policy_url=url, server_max_in_flight=4)
        router = Router([url], max_episodes=4)
        await router.start()
        init = Fleet(settings, lambda s, job, share: InitStage(s))
        run = Fleet(run_settings, lambda s, job, share: RunStage(s, router=router, share=share),
                    slots=router.slots)
        served = asyncio.gather(init.serve(), run.serve())
        try:
            deadline = time.monotonic() + 60
            while len(samples["x"]) < SAMPLES and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                runtimes = {name: s.runtime for name, s in run.served.items()}
                # Sampled once both have started (no preemption: the first to start may hold
                # every slot until its episodes end) while both have episodes left: the slots
                # each holds or may take now (one it may take is taken at its runtime's next
                # step).
                if (len(runtimes) == 2
                        and all(0 < r.stats["processed"] < 60 for r in runtimes.values())):
                    for name, runtime in runtimes.items():
                        samples[name].append(runtime.in_flight + run.allowance(name))
        finally:
            init.stop()
            run.stop()
            await served
            await router.close()
            await server.stop()

    try:
        asyncio.run(main())
    finally:
        for name in made:
            delete_topics(settings.bootstrap_servers, f"{settings.prefix}.{name}")
    assert len(samples["x"]) >= SAMPLES
    share_x = sum(samples["x"]) / (sum(samples["x"]) + sum(samples["y"]))
    assert 0.2 <= share_x <= 0.3, share_x  # its weight's share, 1 of the 4 slots
