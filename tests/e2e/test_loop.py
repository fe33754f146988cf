"""The closed RL loop on the real broker, as real processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup
from tests.helpers.scored_factory import scored, turn


def committed_versions(settings: Settings) -> list[dict]:
    return [codec().decode_as("PolicyVersion", m.value()) for m in kafka.read_partitions(
        settings, [TopicPartition(settings.topics.policy, 0, 0)])]


@pytest.mark.slow
@pytest.mark.timeout(600)  # two trainers' start-ups: on a loaded machine about a minute each
def test_sigkill_of_the_trainer_loses_no_batch_and_trains_none_twice(
        settings: Settings, tmp_path: Path) -> None:
    groups, size = 8, 4  # 4 steps: the kill lands after the first, the restart does the rest
    producer = kafka.producer(settings)
    long_prompt = [65 + i % 26 for i in range(1500)]  # long enough that a step takes a while
    for g in range(groups):
        for i in range(size):
            event = scored(f"t{g}", i, float(i % 2), group_size=size,
                           turns=[turn(0, long_prompt, [97, 98, 260], 0)])
            kafka.produce(producer, settings.topics.scored,
                          codec().encode("ScoredTrajectory", event), key=f"t{g}#{i}")
    producer.flush()

    procs = ProcessGroup(tmp_path / "logs")
    args = ["train", "--bootstrap-servers", settings.bootstrap_servers, "--prefix",
            settings.prefix, "--checkpoint-dir", str(tmp_path / "ckpt"), "--groups-per-batch", "2"]
    try:
        procs.start("train", *args)
        deadline = time.monotonic() + 240  # before pytest's timeout: the failure says why
        while not committed_versions(settings):
            procs.check_alive()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        procs.kill("train")
        killed_at = len(committed_versions(settings))
        procs.start("train-2", *args)
        # A deadline of its own: in a loaded run the restart's start-up took two minutes, and
        # a stalled bridge says what it waits for every 30 s (in the log the failure shows).
        deadline = time.monotonic() + 240
        while len(committed_versions(settings)) < groups // 2:
            procs.check_alive()
            assert time.monotonic() < deadline, (
                [e["version"] for e in committed_versions(settings)],
                (tmp_path / "logs" / "train-2.log").read_text()[-6000:])
            time.sleep(0.5)
        time.sleep(3)  # a duplicate step would be committed by now
    finally:
        procs.stop_all()  # a failed run leaves no trainer behind

    events = committed_versions(settings)
    assert [e["version"] for e in events] == list(range(1, groups // 2 + 1))
    assert sum(e["metrics"]["samples"] for e in events) == groups * size  # each sample once
    assert len({e["step_id"] for e in events}) == len(events)
    assert killed_at < groups // 2
    log = (tmp_path / "logs" / "train-2.log").read_text()
    assert f"training from policy version {killed_at}" in log
