"""TRL fed by Rollstream: its real GRPOTrainer (rollout_func) trains the tiny local Qwen2 on the
CPU from a job's scored topic, each step's weights committed as a PolicyVersion with the batch's
offsets; killed with SIGKILL and restarted it loses no batch and trains none twice. The async
trainer's rollout worker hands TRL's own RolloutSample to TRL's own queue dataset, planner and
collator."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rollstream import kafka, policy_versions
from rollstream.config import Settings
from rollstream.dev import tiny_model
from tests.helpers.trainers_env import publish_scored, sampled_groups, subprocess_env, use_trainers
from trainer_bridge.bridge import TrainerBridge

use_trainers()
pytestmark = pytest.mark.trainers

GROUP = 4
GROUPS_PER_STEP = 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tiny_model.TinyModel:
    return tiny_model.build(tmp_path_factory.mktemp("tiny") / "m")


def committed(settings: Settings) -> list[dict]:
    return policy_versions.newer(
        kafka.read_partitions(settings, policy_versions.partitions(settings)))


def test_grpo_trainer_trains_five_steps_from_the_scored_topic(
        settings: Settings, tiny: tiny_model.TinyModel, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from trainer_bridge.adapters import trl_adapter

    steps = 5
    events = sampled_groups(tiny.model, steps * GROUPS_PER_STEP, GROUP)
    publish_scored(settings, events)
    rollouts = trl_adapter.train(settings, tiny.model, tmp_path / "ckpt", max_steps=steps,
                                 groups_per_batch=GROUPS_PER_STEP, num_generations=GROUP,
                                 use_cpu=True)
    versions = committed(settings)
    assert [v["version"] for v in versions] == [1, 2, 3, 4, 5]
    assert len({v["step_id"] for v in versions}) == steps  # five different batches
    base = load_file(str(tiny.model / "model.safetensors"))
    last = load_file(str(Path(versions[-1]["uri"]) / "model.safetensors"))
    assert any(not torch.equal(base[k], last[k]) for k in base)  # TRL's loss moved the weights
    assert [e["version"] for e in rollouts.published] == [1, 2, 3, 4, 5]
    with TrainerBridge(settings, 1) as again:  # every batch's offsets are committed
        assert list(again.batches(idle_timeout_s=3)) == []


@pytest.mark.slow
def test_trainer_killed_mid_run_loses_no_batch_and_trains_none_twice(
        settings: Settings, tiny: tiny_model.TinyModel, tmp_path: Path) -> None:
    steps = 6
    events = sampled_groups(tiny.model, steps * GROUPS_PER_STEP, GROUP, seed=1)
    # A step takes a fraction of a second here: the trainer gets three steps' groups and one of
    # the fourth's, so it is killed holding part of a batch, waiting for the rest.
    first_part = (3 * GROUPS_PER_STEP + 1) * GROUP
    publish_scored(settings, events[:first_part])
    script = Path(__file__).parents[1] / "helpers" / "trl_train_proc.py"

    def start(remaining: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(script), settings.bootstrap_servers, settings.prefix,
             str(tiny.model), str(tmp_path / "ckpt"), str(remaining)],
            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first = start(steps)
    deadline = time.monotonic() + 240
    while len(committed(settings)) < 3:
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the trainer committed no three steps in 240 s"
        time.sleep(0.5)
    time.sleep(2)  # it holds the fourth step's first group meanwhile
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    done = len(committed(settings))
    assert done == 3, "the trainer stepped on a partial batch"
    publish_scored(settings, events[first_part:])
    second = start(steps - done)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    versions = committed(settings)
    assert [v["version"] for v in versions] == list(range(1, steps + 1))
    # Each committed version trained a different batch, and together they are all the groups.
    assert len({v["step_id"] for v in versions}) == steps
    trained = sum(v["metrics"]["samples"] for v in versions)
    assert trained == len(events)
