"""A new run learns from an earlier run's log: run 1's scored trajectories, filtered by the
policy version that sampled them and their reward, are replayed into run 2, which trains on them
with no new rollouts; the importance ratios it uses are against the logprobs run 1 logged, and
each token keeps the old version that sampled it. Replayed and fresh batches mix in a set share."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, load
from rollstream.consume.records import Output
from rollstream.contracts.codec import unpack_logprobs
from rollstream.contracts.events import POLICY_VERSION
from tests.helpers.scored_factory import scored, turn
from tests.helpers.trainers_env import committed_versions, publish_scored
from trainer_bridge.bridge import TrainerBridge
from trainer_bridge.offpolicy import importance_ratios, mixed, replay_scored, replay_settings
from trainer_bridge.tensors import to_tensors
from trainer_bridge.trainer import GRPOTrainer, TinyPolicy

GROUP = 4
# Joining the two bridges' groups and the copy's reads, on a busy machine.
JOIN_BOUND_S = 60


def _run1_log(version: int, tasks: int, rewards: list[float], tag: str) -> list[dict]:
    return [scored(f"{tag}-v{version}-{t}", i, rewards[i], version=version,
                   turns=[turn(0, [258, 83, 260, 259], [97 + i, 98 + t, 260], version)])
            for t in range(tasks) for i in range(GROUP)]


@pytest.fixture
def run2(bootstrap: str) -> Iterator[Settings]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, prefix, partitions=4)
    yield load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)
    delete_topics(bootstrap, prefix)
    delete_topics(bootstrap, prefix + "-replay")


def test_run_two_trains_on_run_ones_log_with_the_logged_logprobs(
        settings: Settings, run2: Settings, tmp_path: Path) -> None:
    varied = [0.5, 1.0, 0.75, 1.0]
    log = (_run1_log(0, 2, varied, "old") + _run1_log(1, 2, varied, "kept")
           + _run1_log(2, 2, varied, "kept") + _run1_log(2, 1, [0.0] * GROUP, "low"))
    publish_scored(settings, log)
    # Versions 1..2 only, rewards of at least 0.5: the four "kept" groups.
    copied = replay_scored(settings, run2, min_version=1, max_version=2, min_reward=0.5)
    assert copied == 4 * GROUP
    logged = {e["trajectory"]["episode_id"]: e for e in log}

    trainer = GRPOTrainer(TinyPolicy(seed=0), tmp_path / "ckpt", version=10)
    steps = 0
    with TrainerBridge(replay_settings(run2), 2) as replayed, \
            TrainerBridge(run2, 2) as fresh:
        for batch in mixed(fresh, replayed, replay_share=1.0, max_batches=2, idle_timeout_s=10):
            tensors = to_tensors(batch.trainable)
            for row, sample in enumerate(batch.trainable):
                old = logged[sample.episode_id]["trajectory"]["turns"][0]
                sampled = tensors.loss_mask[row]
                np.testing.assert_array_equal(tensors.old_logprobs[row][sampled].numpy(),
                                              unpack_logprobs(old["logprobs"]))
                assert set(tensors.versions[row][sampled].tolist()) == {old["policy_version"]}
            with torch.no_grad():
                current = trainer.policy.token_logprobs(tensors)
            ratios = importance_ratios(current, tensors)
            # The same ratios, from the raw log: exp(current - logged) on sampled tokens.
            mask = tensors.loss_mask[:, 1:]
            expected = torch.ones_like(current)
            for row, sample in enumerate(batch.trainable):
                lp = torch.from_numpy(unpack_logprobs(
                    logged[sample.episode_id]["trajectory"]["turns"][0]["logprobs"]))
                expected[row, mask[row]] = torch.exp(current[row, mask[row]] - lp)
            torch.testing.assert_close(ratios, expected)
            # And they are the ratios the trainer's loss uses: its KL estimate from them.
            _, metrics = trainer.loss(tensors)
            k3 = ((ratios - 1) - torch.log(ratios))[mask].mean().item()
            assert metrics["kl"] == pytest.approx(k3, rel=1e-5)
            trainer.step(batch)
            batch.ack()
            steps += 1
    assert steps == 2
    with TrainerBridge(replay_settings(run2), 2) as again:
        assert list(again.batches(idle_timeout_s=3)) == []  # both replayed batches committed


def test_mixing_replayed_and_fresh_batches_in_a_set_share(
        settings: Settings, run2: Settings) -> None:
    varied = [0.0, 1.0, 0.5, 1.0]
    publish_scored(settings, _run1_log(1, 4, varied, "old"))
    assert replay_scored(settings, run2) == 4 * GROUP
    publish_scored(run2, _run1_log(5, 8, varied, "new"))
    with TrainerBridge(replay_settings(run2), 1) as replayed, TrainerBridge(run2, 1) as fresh:
        order = []
        for batch in mixed(fresh, replayed, replay_share=0.25, max_batches=8, idle_timeout_s=10):
            order.append(batch.groups[0].task_id.startswith("old"))
            batch.ack()
    assert sum(order) == 2 and len(order) == 8  # one replayed batch in four
    with pytest.raises(ValueError, match="replay_share"):
        next(mixed(fresh, replayed, replay_share=1.5))


def test_reward_filters_keep_whole_groups_copied_once_and_replay_flows_without_fresh_data(
        settings: Settings, run2: Settings, tmp_path: Path) -> None:
    # Each group has rewards below and above 0.5: filtering samples by reward left groups
    # incomplete and without variance (0 steps); whole groups pass on their mean reward.
    publish_scored(settings, _run1_log(1, 2, [0.0, 1.0, 0.25, 1.0], "good")  # mean 0.5625
                   + _run1_log(1, 2, [0.0, 1.0, 0.0, 0.0], "bad"))          # mean 0.25
    assert replay_scored(settings, run2, min_reward=0.5) == 2 * GROUP
    assert replay_scored(settings, run2, min_reward=0.5) == 0  # copied already
    assert replay_scored(settings, run2) == 2 * GROUP  # only the groups not there yet

    trainer = GRPOTrainer(TinyPolicy(seed=0), tmp_path / "ckpt", version=3)
    trained: list[str] = []
    started = time.monotonic()
    # No fresh data at all: the replayed batches still come, and the iteration ends once both
    # sides stayed empty for the idle timeout instead of waiting on the fresh side for ever.
    with TrainerBridge(replay_settings(run2), 1) as replayed, \
            TrainerBridge(run2, 1) as fresh:
        for batch in mixed(fresh, replayed, replay_share=0.25, idle_timeout_s=5):
            assert [len(g.samples) for g in batch.groups] == [GROUP]
            event = trainer.step(batch)
            batch.ack([Output(run2.topics.policy, "policy", POLICY_VERSION, event)])
            trained.append(batch.groups[0].task_id)
            # The trainer's version, acknowledged through either bridge, is both bridges'.
            assert replayed.current_version == event["version"]
        assert fresh.current_version == replayed.current_version == 3 + len(trained)
    assert time.monotonic() - started < 5 + JOIN_BOUND_S
    assert sorted(t.split("-v")[0] for t in trained) == ["bad", "bad", "good", "good"]
    assert [e["version"] for e in committed_versions(run2)] == [4, 5, 6, 7]
