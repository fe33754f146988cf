"""The chaos benchmark's short version: a few hundred episodes on the 3-node cluster while the
broker leading a partition of `episodes` is SIGKILLed and restarted; nothing lost, nothing
scored twice, nothing infra-classed, no process exits or hangs. Four stage processes (RUN as a
dynamic and a static member, EVAL static, INIT dynamic): the full benchmark runs them all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import chaos

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with chaos.three_node_cluster(tmp_path_factory.mktemp("cluster")) as bootstrap:
        yield bootstrap


@pytest.mark.timeout(900)  # a 3-node cluster and five processes start on a small machine
def test_a_broker_kill_loses_and_duplicates_nothing(cluster: str, tmp_path: Path) -> None:
    # The kill comes 1 s after the first scored episode: mid-run, with transactions open.
    result = chaos.measure(cluster, episodes=200, interval=1, kinds=["partition-leader"],
                           baseline=False, timeout_s=600, workdir=tmp_path,
                           whole_cluster=False, max_faults=1, grace_s=3,
                           processes=["init-0", "run-0", "run-1", "eval-1"])
    run = result["with_faults"]
    assert run["faults"] == {"partition-leader": 1}, run["fault_log"]
    assert run["expected"] == 200
    assert (run["lost"], run["duplicated"], run["infra"]) == (0, 0, 0), run
    assert run["processes_exited_unkilled"] == [] and run["processes_hung_at_stop"] == []

