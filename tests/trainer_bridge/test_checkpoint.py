"""The exactly-once checkpoint under the trainer: fenced by a second bridge with the same id,
SIGKILLed mid-commit and restarted, every batch is still trained exactly once."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rollstream.cluster import kafka
from rollstream.cluster.transaction import (
    FENCE_LIMIT,
    HUNG_S,
    WAIT_S,
    FenceCounter,
    IdInUse,
    Rewind,
    Transaction,
    classify,
)
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from tests.helpers.bridge_helpers import publish_groups
from tests.helpers.checkpoint_train_proc import trained
from trainer_bridge.bridge import TrainerBridge

TASKS = 150  # the three killed trainers commit a few dozen batches at most: most are left


def trained_episodes(settings: Settings) -> list[str]:
    msgs = kafka.read_partitions(settings, [TopicPartition(settings.topics.policy, 0, 0)])
    return [i for m in msgs for i in codec().decode_as("PolicyVersion", m.value())["uri"]
            .split(",")]


def expected(tasks: int, group_size: int) -> list[str]:
    return sorted(f"task{t}#{i}" for t in range(tasks) for i in range(group_size))


def test_errors_are_classified() -> None:
    assert classify(KafkaError(KafkaError._TIMED_OUT)) == "retry"
    assert classify(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True)) == "retry"
    assert classify(KafkaError(KafkaError._FENCED, fatal=True)) == "rebuild"
    assert classify(KafkaError(KafkaError.INVALID_TXN_STATE)) == "rebuild"
    assert classify(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH)) == "rebuild"
    assert classify(KafkaError(KafkaError._STATE, txn_requires_abort=True)) == "rebuild"
    assert classify(KafkaError(KafkaError.NOT_COORDINATOR, txn_requires_abort=True)) == "abort"


def test_an_id_fenced_again_and_again_stops_with_a_message_saying_why() -> None:
    fences = FenceCounter("transactional id x")
    for _ in range(FENCE_LIMIT - 1):
        fences.fenced("PRODUCER_FENCED")  # a broker restart or a crashed predecessor: go on
    with pytest.raises(IdInUse, match="another live process uses the same id"):
        fences.fenced("PRODUCER_FENCED")


def test_a_call_out_is_served_and_abandoned_once_it_is_no_longer_wanted() -> None:
    """While a transactional call is out the checkpoint hands it to its driver, which serves
    meanwhile (the stage keeps its consumer's group there); when the driver finds the
    transaction no longer wanted (partitions lost), the call is abandoned then, not after
    HUNG_S."""
    served: list[float] = []

    def serve() -> bool:
        served.append(time.monotonic())
        return len(served) >= 3

    checkpoint = Transaction(Settings(bootstrap_servers="127.0.0.1:1"), "serve-test")
    stuck = threading.Event()  # a call that does not return until released
    started = time.monotonic()
    try:
        with pytest.raises(KafkaException) as info:
            for call in checkpoint._call("send_offsets_to_transaction", stuck.wait, 60):
                if not call.wait(WAIT_S) and serve():
                    call.abandon("partitions lost")
    finally:
        stuck.set()
    assert info.value.args[0].code() == KafkaError._FATAL
    assert len(served) == 3
    assert time.monotonic() - started < HUNG_S
    assert checkpoint.producer is None and not checkpoint.in_txn


def test_a_fenced_trainer_cannot_commit_and_the_new_one_trains_each_batch_once(
        settings: Settings) -> None:
    settings = settings.override(instance_id="trainer-1")
    publish_groups(settings, tasks=8, group_size=2)
    zombie = TrainerBridge(settings, groups_per_batch=1)
    batches = zombie.batches(idle_timeout_s=20)
    first = next(batches)
    first.ack([trained(settings, first, 1)])
    second = next(batches)  # taken, trained, but not yet committed when the new trainer starts

    with TrainerBridge(settings, groups_per_batch=1) as successor:
        with pytest.raises(Rewind):  # fenced: its producer epoch and group member are stale
            second.ack([trained(settings, second, 2)])
        zombie.close()
        for step, batch in enumerate(successor.batches(idle_timeout_s=5), start=2):
            batch.ack([trained(settings, batch, step)])
    assert sorted(trained_episodes(settings)) == expected(8, 2)


@pytest.mark.slow
def test_a_trainer_killed_mid_commit_trains_each_batch_once(settings: Settings) -> None:
    publish_groups(settings, tasks=TASKS, group_size=2)
    cmd = [sys.executable, "-c",
           "import sys; from tests.helpers.checkpoint_train_proc import work; "
           "work(sys.argv[1], sys.argv[2])", settings.bootstrap_servers, settings.prefix]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    rng = random.Random(7)
    for _ in range(3):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline(), "the trainer committed nothing"
        time.sleep(rng.uniform(0.0, 0.5))  # committing; most of its time is spent in commits
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    done = len(trained_episodes(settings))
    assert done < 2 * TASKS, "the kills came after the work was done"

    # The groups left, one a batch; the idle bound only ends a resume that finds too few (a
    # killed trainer's open transaction holds the rest back until it times out: on a busy
    # machine a 5 s idle bound ended the resume early).
    left = TASKS - done // 2
    with TrainerBridge(settings.override(instance_id="trainer-k"), groups_per_batch=1) as bridge:
        for step, batch in enumerate(bridge.batches(idle_timeout_s=90)):
            batch.ack([trained(settings, batch, 1000 + step)])
            if step + 1 == left:
                break
    assert sorted(trained_episodes(settings)) == expected(TASKS, 2)
