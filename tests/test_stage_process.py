"""A stage as a real OS process: SIGTERM finishes, commits and leaves the group."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream import kafka
from rollstream.config import Settings
from rollstream.processes import ProcessGroup


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
