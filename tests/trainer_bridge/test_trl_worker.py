"""The TRL adapters' guards that need no trainer: a worker stopped before it started (TRL does
so when its own setup failed) is a no-op, so TRL's error is the one seen; and a trainer starting
below the newest committed version is refused, since its versions would come after newer ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstream.config import Settings
from tests.helpers.trainers_env import committed_versions
from trainer_bridge.adapters import trl_adapter
from trainer_bridge.bridge import TrainerBridge


def test_stop_before_start_is_a_no_op(settings: Settings, tmp_path: Path) -> None:
    with TrainerBridge(settings, 1) as bridge:
        worker = trl_adapter.RolloutWorker(bridge, 4, trl_adapter.SavedWeights(tmp_path))
        worker.stop()  # raised "cannot join thread before it is started"
        worker.stop()
        assert not worker._thread.is_alive()


def test_a_trainer_starting_below_the_newest_committed_version_is_refused(
        settings: Settings, tmp_path: Path) -> None:
    with TrainerBridge(settings, 1) as bridge:
        rollouts = trl_adapter.BridgeRollouts(bridge, tmp_path, version=4)
        batch = trl_adapter.Batch([], bridge)
        batch.ack([trl_adapter.version_event(settings, 5, tmp_path, "s5", {})[0]])
        assert [v["version"] for v in committed_versions(settings)] == [5]
        for start in (trl_adapter.BridgeRollouts, lambda b, d: trl_adapter.RolloutWorker(
                b, 4, trl_adapter.SavedWeights(d))):
            with pytest.raises(ValueError, match=r"holds version 5 already and this trainer "
                                                 r"starts at version 0: .*start_from"):
                start(bridge, tmp_path)
        assert trl_adapter.start_from(settings, tmp_path) == (tmp_path, 5)
        assert rollouts.version == 4
