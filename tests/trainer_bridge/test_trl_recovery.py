"""TRL's GRPOTrainer, fed by Rollstream, killed with SIGKILL mid-run and restarted: it loses no
batch and trains none twice. A module of its own so that it runs beside the other TRL tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollstream.config import Settings
from rollstream.dev import tiny_model
from tests.helpers.trainers_env import (
    committed_versions,
    publish_scored,
    sampled_groups,
    subprocess_env,
    use_trainers,
)

use_trainers()
pytestmark = pytest.mark.trainers

GROUP = 4
GROUPS_PER_STEP = 2


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
    while len(committed_versions(settings)) < 3:
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the trainer committed no three steps in 240 s"
        time.sleep(0.5)
    time.sleep(2)  # it holds the fourth step's first group meanwhile
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    done = len(committed_versions(settings))
    assert done == 3, "the trainer stepped on a partial batch"
    publish_scored(settings, events[first_part:])
    second = start(steps - done)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    versions = committed_versions(settings)
    assert [v["version"] for v in versions] == list(range(1, steps + 1))
    # Each committed version trained a different batch, and together they are all the groups.
    assert len({v["step_id"] for v in versions}) == steps
    trained = sum(v["metrics"]["samples"] for v in versions)
    assert trained == len(events)
