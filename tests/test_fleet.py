"""A fleet in one process (rollstream.fleet) on the real broker: it serves a job created while it
runs, drains and stops a paused one (its group empties, its input waits), and serves it again
from where it stopped when resumed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from producers.publish import publish, validate_task
from rollstream import jobs, kafka
from rollstream.config import Settings
from rollstream.fleet import Fleet
from rollstream.topics import create_topics, delete_topics
from stages.init import InitStage

PARTITIONS = 2


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
