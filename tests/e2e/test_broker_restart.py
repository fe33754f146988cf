"""Stage processes ride out a broker restart: the broker JVM is SIGKILLed mid-run and started
again; every episode is scored exactly once, no stage process exits or hangs, a group-less
reader follows the topic across the restart, and SIGTERM still stops each stage in time.

Runs on a broker of its own (kept under the test's temporary folder, on its own ports): killing
a broker other tests share would break them.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics
from rollstream.config import Settings, load
from rollstream.dev.processes import ProcessGroup
from tests.helpers.pipeline_helpers import GROUP, kill_broker, make_tasks

TASKS = 40
DRAIN_S = 10


@pytest.mark.slow
def test_stages_ride_out_a_broker_restart(own_broker: str, tmp_path: Path) -> None:
    prefix = "restart"
    create_topics(own_broker, prefix, partitions=4)
    settings: Settings = load(bootstrap_servers=own_broker, prefix=prefix, partitions=4)
    procs = ProcessGroup(tmp_path / "logs")
    common = ["--bootstrap-servers", own_broker, "--prefix", prefix,
              "--commit-interval-ms", "100", "--drain-timeout", str(DRAIN_S)]
    policy = procs.start_policy()
    url = policy.url
    for name, stage in (("init", "init"), ("run", "run"), ("eval-a", "eval")):
        procs.start(name, "stage", stage, *common,
                    *(["--policy-url", url] if stage == "run" else []))
    procs.start("eval-b", "stage", "eval", *common, "--instance-id", "b")  # static member
    stages = ["init", "run", "eval-a", "eval-b"]
    policy.ready()

    tasks = make_tasks(TASKS)
    expected = {f"{t['task_id']}#{i}" for t in tasks for i in range(GROUP)}
    # A follower outside any group, as the controller and INIT's admission use.
    follower = kafka.reader(settings, [TopicPartition(settings.topics.scored, p, 0)
                                       for p in range(4)])
    followed: Counter[str] = Counter()

    def follow(until: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while sum(followed.values()) < until:
            procs.check_alive()
            assert time.monotonic() < deadline, f"{sum(followed.values())} scored of {until}"
            for msg in follower.consume(500, timeout=0.5):
                if msg.error() is None:
                    followed[msg.key().decode()] += 1

    try:
        assert publish(settings, tasks) == TASKS
        follow(len(expected) // 4, 180)
        kill_broker()  # mid-run: open transactions, in-flight episodes, group sessions cut off
        time.sleep(3)
        local.start(timeout=120)
        follow(len(expected), 300)
        time.sleep(3)  # a duplicate would be committed by now
        for msg in follower.consume(500, timeout=1):
            if msg.error() is None:
                followed[msg.key().decode()] += 1
        assert set(followed) == expected
        assert max(followed.values()) == 1, "an episode was scored twice"
        procs.check_alive()  # none exited

        for name in stages:  # none hangs: each stops within its drain timeout
            started = time.monotonic()
            assert procs.stop(name, timeout=DRAIN_S + 20) == 0, name
            assert time.monotonic() - started < DRAIN_S + 15, name
    finally:
        follower.close()
        procs.stop_all()
