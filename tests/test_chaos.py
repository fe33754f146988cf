"""The chaos benchmark's short version: a few hundred episodes on the 3-node cluster while the
broker leading a partition of `episodes` is SIGKILLed and restarted; nothing lost, nothing
scored twice, nothing infra-classed, no process exits or hangs."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.chaos import measure

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # a 3-node cluster and nine processes start on a small machine
def test_a_broker_kill_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    result = measure(episodes=200, interval=15, kinds=["partition-leader"], baseline=False,
                     timeout_s=600, workdir=tmp_path, whole_cluster=False, max_faults=1)
    run = result["with_faults"]
    assert run["faults"] == {"partition-leader": 1}, run["fault_log"]
    assert run["expected"] == 200
    assert (run["lost"], run["duplicated"], run["infra"]) == (0, 0, 0), run
    assert run["processes_exited_unkilled"] == [] and run["processes_hung_at_stop"] == []
