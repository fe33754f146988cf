"""The processes that follow <p>.policy ride out a broker restart: the inference controller
(`rollstream controller`) and INIT's admission follower, as OS processes, with the broker JVM
SIGKILLed and started again between two policy versions. Neither exits nor hangs, and each
acts on the version published after the restart: the controller loads it into the server,
INIT admits the tasks the trainer's new `groups_consumed` makes room for. The trainer's
consumer (`rollstream bridge`) runs beside them and must not exit either.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish
from rollstream.admission import CONSUMED
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec
from rollstream.dev.background import BackgroundServer
from rollstream.dev.processes import ProcessGroup
from rollstream.policy_server.model import build_model, save
from tests.helpers.pipeline_helpers import kill_broker, make_tasks, served_version, wait

TASKS = 12
WINDOW = 2  # tasks INIT lets in beyond what the trainer reports consumed


def publish_version(settings: Settings, version: int, uri: Path, consumed: int) -> None:
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.policy, codec().encode("PolicyVersion", {
        "version": version, "kind": "full", "uri": str(uri), "step_id": f"step-{version}",
        "metrics": {CONSUMED: float(consumed)}, "created_at_ms": int(time.time() * 1000)}),
        key="policy", partition=0)
    assert producer.flush(60) == 0


def admitted(settings: Settings) -> int:
    """Tasks INIT let in: distinct task ids on <p>.episodes (committed)."""
    msgs = kafka.read_partitions(settings, [TopicPartition(settings.topics.episodes, p, 0)
                                            for p in range(2)])
    return len({m.key().decode().split("#")[0] for m in msgs})


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_controller_and_admission_follow_new_versions_across_a_broker_restart(
        own_broker: str, tmp_path: Path) -> None:
    prefix = "followers"
    create_topics(own_broker, prefix, partitions=2)
    settings = load(bootstrap_servers=own_broker, prefix=prefix, partitions=2)
    checkpoints = []
    for version in (1, 2):
        checkpoints.append(tmp_path / f"step-{version}.safetensors")
        save(build_model(seed=version), checkpoints[-1], version=version)
    procs = ProcessGroup(tmp_path / "logs")
    with BackgroundServer() as server:
        common = ["--bootstrap-servers", own_broker, "--prefix", prefix]
        names = ["controller", "init", "bridge"]
        procs.start("controller", "controller", *common, "--policy-url", server,
                    "--health-interval-s", "0.5")
        procs.start("init", "stage", "init", *common, "--admission-window", str(WINDOW))
        procs.start("bridge", "bridge", *common)
        try:
            publish_version(settings, 1, checkpoints[0], consumed=0)
            wait(lambda: served_version(server) == 1, 120, "version 1 on the server")
            publish(settings, make_tasks(TASKS))
            wait(lambda: admitted(settings) >= WINDOW, 120, "the first window admitted")
            before = admitted(settings)

            kill_broker()
            time.sleep(3)
            local.start(timeout=120)
            procs.check_alive()

            # The trainer reports every admitted task consumed: room for all the others. A
            # stalled-trainer allowance lets in one more window per 30 s at most, far fewer.
            publish_version(settings, 2, checkpoints[1], consumed=TASKS)
            wait(lambda: served_version(server) == 2, 120, "version 2 on the server")
            wait(lambda: admitted(settings) == TASKS, 120, "every task admitted")
            assert before < TASKS - WINDOW
            procs.check_alive()  # none exited

            for name in names:  # none hangs: each stops on SIGTERM
                started = time.monotonic()
                code = procs.stop(name, timeout=40)
                assert time.monotonic() - started < 35, name
                # The bridge keeps Python's default SIGTERM: it ends by the signal.
                assert code in ((0, -signal.SIGTERM) if name == "bridge" else (0,)), name
        finally:
            procs.stop_all()
