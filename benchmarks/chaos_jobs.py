"""Chaos with jobs: two jobs on one shared fleet on a local 3-node cluster while partition
leaders and every kind of process are SIGKILLed mid-run.

Processes (real OS processes): a scripted policy server (multi-turn `guess_number` episodes,
as in benchmarks/chaos.py) and one `rollstream fleet init|run|eval` process per stage, serving
both jobs (`rollstream jobs create`, topics with replication factor 3). Faults, by
benchmarks.chaos.Chaos, in turn (FAULT_ORDER), every `interval` seconds from the first scored
episode of both jobs and never before both jobs' throughput is back from the last one (or 60 s
passed): a SIGKILL of the broker leading partition 0 of alpha's, then of beta's `episodes`
(restarted after 5 s; a node leads partitions of both jobs, so each kill hits both) between
SIGKILLs of the fleet's INIT, RUN and EVAL processes and of the policy server (each started
again after 1 s, as a supervisor would).

Figures per job, read from its committed `scored` topic by a thread of its own: episodes lost,
duplicated, infra-classed; for each fault the time until the job's scored rate over 5 s is back
to 80% of its rate in the 15 s before (benchmarks.chaos.recovery_s). The bar: 0 lost,
duplicated and infra per job, no process exited unkilled or hung at stop, every job back
within 30 s of every partition-leader kill; the process kills' times are reported, not bounded.

The same workload runs first without faults (ROLLSTREAM_CHAOS_BASELINE=0 skips it): each
job's steady rate there caps the rate a recovery is measured against, as in benchmarks.chaos (a
catch-up burst after a fault is not a rate to recover to). Each job's scored count per 5 s is
kept in the result. `python -m benchmarks chaos_jobs`: 6,000 episodes per job, one round of
FAULT_ORDER, 8 faults (ROLLSTREAM_CHAOS_JOBS_EPISODES; ROLLSTREAM_CHAOS_JOBS_KINDS, kinds
in turn; ROLLSTREAM_CHAOS_JOBS_KILLS, how many faults; `--quick`: 400 episodes and 1
partition-leader kill, no run without faults). tests/e2e/test_chaos.py runs a short version:
a few dozen episodes per job, one fault of each kind.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import print_table, write_result
from benchmarks.chaos import (
    BROKER_KINDS,
    GROUP_SIZE,
    PARTITIONS,
    SETTLE_MAX_S,
    TARGET_S,
    Chaos,
    Pipeline,
    Run,
    broker_kills_back,
    figures,
    follow,
    parse_kinds,
    policy_command,
    tasks,
    three_node_cluster,
    time_recoveries,
)
from producers.publish import publish
from rollstream.cli import main
from rollstream.config import Settings, load
from rollstream.dev.processes import wait_http
from rollstream.service import jobs

NAME = "chaos_jobs"
JOBS = ("alpha", "beta")
STAGES = ("init", "run", "eval")
PROCESS_KINDS = (*STAGES, "policy")
# A leader kill between process kills: each process kill's recovery is timed from a settled
# pipeline, and the leader kills alternate between the jobs' topics.
FAULT_ORDER = ("partition-leader", "init", "partition-leader", "run", "partition-leader",
               "eval", "partition-leader", "policy")


def one_run(bootstrap: str, workdir: Path, episodes: int, kinds: list[str], faults: int,
            interval: float, timeout_s: float, replication_factor: int,
            ceilings: dict[str, float | None], settle_max_s: float = SETTLE_MAX_S,
            grace_s: float = 5.0, turns_per_s: float | None = None) -> dict[str, Any]:
    """Both jobs' episodes through one fleet (under a cluster prefix of their own) on the
    cluster at `bootstrap`, with `faults` faults of `kinds` in turn (benchmarks.chaos.Chaos);
    each job's recovery is measured against a rate of at most its `ceilings` (the rate without
    faults); each job paced at `turns_per_s` when given (its quota)."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = load(bootstrap_servers=bootstrap, prefix=f"cj{uuid.uuid4().hex[:6]}",
                partitions=PARTITIONS)
    settings: dict[str, Settings] = {}
    for job in JOBS:
        assert main(["jobs", "create", job, "--partitions", str(PARTITIONS),
                     "--replication-factor", str(replication_factor),
                     *(["--quota-turns-per-s", str(turns_per_s)] if turns_per_s else []),
                     *base.client_flags()]) == 0
        settings[job] = jobs.job_settings(base, jobs.get(base, job))
    policy, url = policy_command(workdir / "script.jsonl")
    pipeline = Pipeline(workdir / "logs", {
        "policy": policy,
        **{stage: ["fleet", stage, *base.client_flags(),
                   *(["--policy-url", url] if stage == "run" else [])] for stage in STAGES},
    }, {kind: [kind] for kind in PROCESS_KINDS})
    work = {job: tasks(max(1, episodes // GROUP_SIZE), job) for job in JOBS}
    expected = {job: {f"{t['task_id']}#{i}" for t in work[job] for i in range(GROUP_SIZE)}
                for job in JOBS}
    runs = {job: Run(job, len(expected[job])) for job in JOBS}
    chaos = Chaos(pipeline, list(runs.values()), bootstrap, interval, kinds,
                  [settings[job].topics.episodes for job in JOBS], max_faults=faults,
                  ceilings=[ceilings[job] for job in JOBS], settle_max_s=settle_max_s)
    try:
        wait_http(f"{url}/health", proc=pipeline.start("policy"), timeout=120)
        for stage in STAGES:
            pipeline.start(stage)
        started = time.monotonic()
        for run in runs.values():
            run.started = started
        for job in JOBS:
            publish(settings[job], work[job])
        follow([(settings[job], runs[job], expected[job]) for job in JOBS],
               started + timeout_s, chaos.tick, grace_s)
    finally:
        chaos.restart_down()
        hung = pipeline.procs.stop_together()
    per_job = {}
    for job, run in runs.items():
        time_recoveries(run, ceilings[job])
        times = sorted(t for t, _, _ in run.scored)
        per_job[job] = {
            **figures(run, expected[job]),
            "scored_per_5s": [sum(1 for t in times if b * 5 <= t < b * 5 + 5)
                              for b in range(int(run.finished // 5) + 1)],
        }
    return {"jobs": per_job, "processes_exited_unkilled": pipeline.unkilled,
            "processes_hung_at_stop": hung}


def measure(bootstrap: str, workdir: Path, episodes: int, kinds: list[str], faults: int,
            interval: float, timeout_s: float, baseline: bool, replication_factor: int = 3,
            settle_max_s: float = SETTLE_MAX_S, grace_s: float = 5.0,
            turns_per_s: float | None = None) -> dict[str, Any]:
    """On the 3-node cluster at `bootstrap` (benchmarks.chaos.three_node_cluster): without
    faults (when `baseline`: each job's steady rate is then the most its recovery is measured
    against, as in benchmarks.chaos), then with `faults` faults of `kinds` in turn; each job
    paced at `turns_per_s` (a quota) when given."""
    result: dict[str, Any] = {"episodes_per_job": episodes, "partitions": PARTITIONS,
                              "replication_factor": replication_factor,
                              "fault_interval_s": interval, "fault_kinds": kinds}
    ceilings: dict[str, float | None] = dict.fromkeys(JOBS)
    if baseline:
        calm = one_run(bootstrap, workdir / "calm", episodes, [], 0, interval, timeout_s,
                       replication_factor, ceilings, grace_s=grace_s, turns_per_s=turns_per_s)
        result["without_faults"] = calm
        ceilings = {job: r["steady_episodes_per_s"] for job, r in calm["jobs"].items()}
    result["with_faults"] = one_run(bootstrap, workdir / "faults", episodes, kinds, faults,
                                    interval, timeout_s, replication_factor, ceilings,
                                    settle_max_s, grace_s, turns_per_s)
    return result


def run(quick: bool = False, timeout_s: float = 1800) -> dict[str, Any]:
    env = os.environ.get
    episodes = int(env("ROLLSTREAM_CHAOS_JOBS_EPISODES", 400 if quick else 6000))
    kinds = parse_kinds(env("ROLLSTREAM_CHAOS_JOBS_KINDS",
                            "partition-leader" if quick else ",".join(FAULT_ORDER)),
                        PROCESS_KINDS + BROKER_KINDS)
    faults = int(env("ROLLSTREAM_CHAOS_JOBS_KILLS", 1 if quick else len(kinds)))
    baseline = not quick and env("ROLLSTREAM_CHAOS_BASELINE", "1") != "0"
    keep = env("ROLLSTREAM_CHAOS_WORKDIR")  # keeps every process's and node's log
    with (contextlib.nullcontext(keep) if keep
          else tempfile.TemporaryDirectory(prefix="rollstream-chaos-jobs-")) as tmp:
        workdir = Path(tmp)
        with three_node_cluster(workdir / "home") as bootstrap:
            result = measure(bootstrap, workdir, episodes, kinds, faults, 10.0, timeout_s,
                             baseline)
    with_faults = result["with_faults"]
    per_job = with_faults["jobs"].values()
    met = (all(j["lost"] == 0 and j["duplicated"] == 0 and j["infra"] == 0
               and len(j["fault_log"]) == faults and broker_kills_back(j, kinds)
               for j in per_job)
           and not with_faults["processes_exited_unkilled"]
           and not with_faults["processes_hung_at_stop"])
    doc = {"quick": quick, **result, "target": {
        "description": "per job: 0 lost, 0 duplicated, 0 infra; no process (fleet INIT, RUN, "
                       "EVAL, policy server) exited unkilled or hung at stop; each job's full "
                       f"throughput back within {TARGET_S:.0f} s of every partition-leader "
                       "kill. The bound is on broker kills; each process kill's time back "
                       "(the process SIGKILLed and started again 1 s later) is reported, not "
                       "bounded",
        "met": met}}
    write_result(NAME, doc)
    print_table("chaos with jobs", ["run", "job", "episodes", "lost", "duplicated", "infra",
                                    "total s"],
                [[label, job, r["expected"], r["lost"], r["duplicated"], r["infra"],
                  r["total_s"]]
                 for label in ("without_faults", "with_faults") if label in result
                 for job, r in result[label]["jobs"].items()])
    logs = {job: r["fault_log"] for job, r in with_faults["jobs"].items()}
    print_table("time to full throughput after each fault (s)",
                ["fault", "target", "at s", *JOBS],
                [[f["kind"], f["target"], round(f["at"], 1),
                  *(_back(logs[job][i]) for job in JOBS)] for i, f in enumerate(logs[JOBS[0]])])
    return doc


def _back(fault: dict[str, Any]) -> str:
    back = str(fault["recovery_s"] or fault["note"])
    return f"{back}, {fault['infra']} infra" if fault["infra"] else back


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
