"""`rollstream plan` against KEDA's formula and the measured numbers: for workloads up to 256
partitions and 10,000 concurrent episodes, the lag KEDA reads at the planned load (Little's
law, counted here; plus the commit marker of each partition where the lag is Kafka's own count)
gives, through ceil(lag / lagThreshold) capped at the partitions, the replicas the plan says,
and they have the in-flight room and CPU the load needs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rollstream.deploy import plan as planner
from rollstream.deploy.plan import FILL, PlanError, Workload, keda_replicas, plan

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

WORKLOADS = [
    Workload(task_rate=0.1),
    Workload(task_rate=1, turns=1, decode_s=0.1, tool_s=0, eval_s=0),
    Workload(task_rate=10, group_size=16, turns=8, tool_s=3, eval_s=30),
    Workload(task_rate=50, max_in_flight=128, eval_s=5),
    # 10,000 episodes at once: 8 x 3 turns x 2.5 s x 166.7 tasks/s.
    Workload(task_rate=10_000 / (8 * 3 * 2.5)),
    Workload(task_rate=400, group_size=4, turns=2, decode_s=1, tool_s=0.5, max_in_flight=256,
             server_max_num_seqs=512),
]


def test_constants_are_the_measured_ones() -> None:
    at_scale = json.loads((RESULTS / "at_scale.json").read_text())
    assert not at_scale["quick"] and at_scale["setup"]["episodes"] == 10_000
    assert at_scale["results"]["run_cpu_ms_per_turn"] == planner.AT_SCALE_RUN_CPU_MS_PER_TURN
    stage = json.loads((RESULTS / "metrics.json").read_text())["results"]["stage"]
    assert stage["cpu_us_per_event"]["on"] * 1e-6 == pytest.approx(
        planner.STAGE_CPU_S_PER_EVENT)


@pytest.mark.parametrize("source", ["status", "kafka"])
@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: f"{w.task_rate:g}tasks/s")
def test_keda_runs_the_planned_replicas_at_the_planned_load(w: Workload, source: str) -> None:
    w = replace(w, lag_source=source)
    p = plan(w)
    assert 1 <= p.partitions <= 256 and p.partitions & (p.partitions - 1) == 0
    episodes = w.task_rate * w.group_size
    in_flight = {"init": w.task_rate * w.commit_interval_ms / 1000,
                 "run": episodes * w.turns * (w.decode_s + w.tool_s),
                 "eval": episodes * w.eval_s}
    cpu = {"init": (w.task_rate + episodes) * planner.STAGE_CPU_S_PER_EVENT,
           "run": episodes * w.turns * planner.CPU_S_PER_TURN,
           "eval": episodes * planner.STAGE_CPU_S_PER_EVENT}
    assert p.concurrent_episodes == pytest.approx(in_flight["run"], rel=1e-3)
    for s in p.stages:
        lag = max(1, math.ceil(in_flight[s.stage]))  # a stage with work holds some
        if source == "kafka":
            lag += p.partitions  # Kafka's count: + 1 commit marker per partition
        assert s.lag == lag
        keda = min(p.partitions, math.ceil(lag / s.lag_threshold))
        assert keda == s.replicas == keda_replicas(lag, s.lag_threshold, p.partitions)
        assert s.replicas <= p.partitions
        assert s.replicas * FILL >= cpu[s.stage] - 1e-9, s
        if s.stage != "init":
            assert s.replicas * w.max_in_flight * FILL >= in_flight[s.stage] - 1e-9, s
    in_decode = episodes * w.turns * w.decode_s
    assert p.servers * w.server_max_num_seqs * FILL >= in_decode


def test_ten_thousand_concurrent_episodes_fit_256_partitions() -> None:
    p = plan(WORKLOADS[4])
    assert p.concurrent_episodes == pytest.approx(10_000)
    assert p.partitions == 256
    run = next(s for s in p.stages if s.stage == "run")
    assert run.replicas * 64 >= 10_000
    assert run.replicas <= 256


def test_a_workload_beyond_256_partitions_is_refused() -> None:
    with pytest.raises(PlanError, match="more than 256 partitions"):
        plan(Workload(task_rate=2000))
    with pytest.raises(PlanError, match="task_rate must be positive"):
        plan(Workload(task_rate=0))


def test_cli_prints_the_plan_and_one_line_errors() -> None:
    cli = [sys.executable, "-m", "rollstream.cli", "plan"]
    out = subprocess.run([*cli, "--task-rate", "10", "--json"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out)["partitions"] == plan(Workload(task_rate=10)).partitions
    table = subprocess.run([*cli, "--task-rate", "10"], capture_output=True, text=True,
                           check=True).stdout
    assert "lagThreshold" in table and "run" in table
    bad = subprocess.run([*cli, "--task-rate", "5000"], capture_output=True, text=True)
    assert bad.returncode != 0
    assert bad.stderr.strip().count("\n") == 0 and "Traceback" not in bad.stderr
    assert "more than 256 partitions" in bad.stderr


def test_the_lag_source_decides_whether_markers_count() -> None:
    """Rollstream's count (the chart's default) has no commit markers: with 64 partitions,
    Kafka's count puts 64 more events of lag on every stage."""
    w = Workload(task_rate=20, turns=5)
    ours, kafkas = plan(w), plan(replace(w, lag_source="kafka"))
    assert ours.partitions == kafkas.partitions == 64
    for a, b in zip(ours.stages, kafkas.stages, strict=True):
        assert b.lag - a.lag == 64
    with pytest.raises(PlanError, match="lag_source must be one of status, prometheus, kafka"):
        plan(replace(w, lag_source="lag"))
