"""A stage as a real OS process: SIGTERM finishes, commits and leaves the group."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup


def test_sigterm_commits_and_exits_cleanly(settings: Settings, tmp_path: Path) -> None:
    tasks = [validate_task({"task_id": f"t{i}", "env": "arithmetic", "prompt": "1+1=",
                            "data": {"answer": "2"}, "group_size": 2}) for i in range(30)]
    publish(settings, tasks)
    procs = ProcessGroup(tmp_path)
    procs.start("init", "stage", "init", "--bootstrap-servers", settings.bootstrap_servers,
                "--prefix", settings.prefix)
    episodes = [TopicPartition(settings.topics.episodes, p, 0) for p in range(4)]
    deadline = time.monotonic() + 60
    while len(list(kafka.read_partitions(settings, episodes))) < 60:
        procs.check_alive()
        assert time.monotonic() < deadline, "INIT produced too little"
        time.sleep(0.5)

    started = time.monotonic()
    assert procs.stop("init", timeout=30) == 0
    assert time.monotonic() - started < 15
    log = (tmp_path / "init.log").read_text()
    assert "stage init stopped" in log

    committed = kafka.consumer(settings, f"{settings.prefix}.init").committed(
        [TopicPartition(settings.topics.tasks, p) for p in range(4)], timeout=10)
    assert all(tp.offset >= 0 for tp in committed)
    # Nothing is left after the committed offsets: a restarted INIT would redo no task.
    assert list(kafka.read_partitions(settings, committed)) == []


def test_instance_id_gives_static_membership_that_survives_a_restart(
        settings: Settings, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    group = f"{settings.prefix}.init"

    def members() -> list:
        description = admin.describe_consumer_groups([group])[group].result(timeout=10)
        return description.members

    procs = ProcessGroup(tmp_path)
    args = ["stage", "init", "--bootstrap-servers", settings.bootstrap_servers,
            "--prefix", settings.prefix, "--instance-id", "worker-7"]
    procs.start("init", *args)
    deadline = time.monotonic() + 60
    while not members():
        procs.check_alive()
        assert time.monotonic() < deadline
        time.sleep(0.5)
    [member] = members()
    assert member.group_instance_id == f"{group}.worker-7"
    first_id = member.member_id
    procs.kill("init")  # a crash: no leave-group, the static member stays
    procs.start("init-again", *args)
    # While the group rebalances it may list no member at all: wait for the new one.
    while not (current := members()) or current[0].member_id == first_id:
        procs.check_alive()
        assert time.monotonic() < deadline, "the restarted process never replaced its member"
        time.sleep(0.5)
    [member] = members()
    assert member.group_instance_id == f"{group}.worker-7"  # the same static member, replaced
    procs.stop_all()
