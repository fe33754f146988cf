"""Chaos with jobs: two jobs on one shared fleet on a local 3-node cluster while the broker
leading a partition of a job's `episodes` topic is SIGKILLed mid-run (restarted after 5 s).

Processes (real OS processes): a scripted policy server (multi-turn `guess_number` episodes,
as in benchmarks/chaos.py) and one `rollstream fleet init|run|eval` process per stage, serving
both jobs (`rollstream jobs create`, topics with replication factor 3). The kills alternate
between the leader of alpha's and of beta's `episodes` partition 0, every `interval` seconds
from the first scored episode of both jobs and never before both jobs' throughput is back
from the last kill (or 60 s passed). A node leads partitions of both jobs, so each kill hits
both.

Figures per job, read from its committed `scored` topic by a thread of its own: episodes lost,
duplicated, infra-classed; for each kill the time until the job's scored rate over 5 s is back
to 80% of its rate in the 15 s before (benchmarks.chaos.recovery_s). The bar: 0 lost,
duplicated and infra per job, no fleet process exited or hung, every job back within 30 s of
every kill.

The same workload runs first without faults (ROLLSTREAM_CHAOS_BASELINE=0 skips it): each
job's steady rate there caps the rate a recovery is measured against, as in benchmarks.chaos (a
catch-up burst after a kill is not a rate to recover to). Each job's scored count per 5 s is
kept in the result. `python -m benchmarks chaos_jobs`: 2,000 episodes per job, 2 kills
(ROLLSTREAM_CHAOS_JOBS_EPISODES, ROLLSTREAM_CHAOS_JOBS_KILLS; `--quick`: 400 and 1, no run
without faults).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import print_table, write_result
from benchmarks.chaos import (
    GROUP_SIZE,
    GUESSES,
    PARTITIONS,
    SETTLE_MAX_S,
    Fault,
    Run,
    recovery_s,
    steady_rate,
    tasks,
    three_node_cluster,
)
from producers.publish import publish
from rollstream import jobs, kafka
from rollstream.broker import cluster
from rollstream.cli import main
from rollstream.codec import codec
from rollstream.config import Settings, load
from rollstream.dev.processes import ProcessGroup, free_port, wait_http

NAME = "chaos_jobs"
JOBS = ("alpha", "beta")
STAGES = ("init", "run", "eval")
RESTART_S = 5.0  # a killed node is started again after this long
TARGET_S = 30.0


def _follow(settings: Settings, run: Run, stop: threading.Event) -> threading.Thread:
    """Time each committed scored event of the job as it becomes readable, until `stop`."""
    def read() -> None:
        partitions = kafka.whole_topic(settings, settings.topics.scored)
        assert partitions is not None, settings.topics.scored
        reader = kafka.reader(settings, partitions)
        try:
            while not stop.is_set():
                for msg in reader.consume(500, timeout=0.2):
                    if msg.error() is None:
                        scored = codec().decode_as("ScoredTrajectory", msg.value())
                        run.scored.append((time.monotonic() - run.started,
                                           scored["trajectory"]["episode_id"],
                                           scored["failure_class"]))
        finally:
            reader.close()

    thread = threading.Thread(target=read, name=f"scored-{run.label}", daemon=True)
    thread.start()
    return thread


class Kills:
    """The fault schedule: a partition-leader kill every `interval` s, alternating between the
    jobs' episodes topics, never while a node is down or a job is still recovering."""

    def __init__(self, bootstrap: str, runs: dict[str, Run], topics: dict[str, str],
                 interval: float, count: int, started: float,
                 ceilings: dict[str, float | None]) -> None:
        self.bootstrap, self.runs, self.topics = bootstrap, runs, topics
        self.ceilings = ceilings
        self.interval, self.count, self.started = interval, count, started
        self.faults: list[Fault] = []
        self.down: list[tuple[float, int]] = []  # (restart at, node)
        self.next_at: float | None = None

    def now(self) -> float:
        return time.monotonic() - self.started

    def tick(self) -> None:
        now = self.now()
        for item in [d for d in self.down if d[0] <= now]:
            self.down.remove(item)
            cluster.start_node(item[1])
        if self.next_at is None:
            if all(run.scored for run in self.runs.values()):
                self.next_at = now + self.interval
            return
        if (len(self.faults) >= self.count or self.down or now < self.next_at
                or not self._settled(now) or len(cluster.brokers(self.bootstrap)) < 3):
            return
        job = JOBS[len(self.faults) % len(JOBS)]
        node = cluster.partition_leader(self.bootstrap, self.topics[job])
        cluster.kill_node(node)
        self.faults.append(Fault("partition-leader", self.now(),
                                 f"node {node}, leading {job}'s episodes[0]"))
        self.down.append((self.now() + RESTART_S, node))
        self.next_at = self.now() + self.interval

    def _settled(self, now: float) -> bool:
        if not self.faults or now - self.faults[-1].at >= SETTLE_MAX_S:
            return True
        at = self.faults[-1].at
        for job, run in self.runs.items():
            times = sorted(t for t, _, _ in list(run.scored))
            if (any(at - 15 <= t < at for t in times)
                    and recovery_s(times, at, now, self.ceilings[job]) is None):
                return False
        return True

    def restart_down(self) -> None:
        for _, node in self.down:
            cluster.start_node(node)
        self.down.clear()


def one_run(bootstrap: str, workdir: Path, episodes: int, kills: int, interval: float,
            timeout_s: float, replication_factor: int,
            ceilings: dict[str, float | None]) -> dict[str, Any]:
    """Both jobs' episodes through one fleet (under a cluster prefix of their own) on the
    cluster at `bootstrap`, with `kills` partition-leader kills; each job's recovery is
    measured against a rate of at most its `ceilings` (the rate without faults)."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = load(bootstrap_servers=bootstrap, prefix=f"cj{uuid.uuid4().hex[:6]}",
                partitions=PARTITIONS)
    settings: dict[str, Settings] = {}
    for job in JOBS:
        assert main(["jobs", "create", job, "--partitions", str(PARTITIONS),
                     "--replication-factor", str(replication_factor),
                     *base.client_flags()]) == 0
        settings[job] = jobs.job_settings(base, jobs.get(base, job))
    script = workdir / "script.jsonl"
    script.write_text(json.dumps({"match": "Guess", "completions": GUESSES}) + "\n")
    procs = ProcessGroup(workdir / "logs")
    port = free_port()
    server = procs.start("policy", "serve-scripted", "--port", str(port), "--script", str(script))
    wait_http(f"http://127.0.0.1:{port}/health", proc=server, timeout=120)
    commands = {stage: ["fleet", stage, *base.client_flags(),
                        *(["--policy-url", f"http://127.0.0.1:{port}"] if stage == "run"
                          else [])] for stage in STAGES}
    current = {stage: stage for stage in STAGES}  # the process's name: a restart is another
    for stage in STAGES:
        procs.start(stage, *commands[stage])
    work = {job: tasks(max(1, episodes // GROUP_SIZE), job) for job in JOBS}
    expected = {job: {f"{t['task_id']}#{i}" for t in work[job] for i in range(GROUP_SIZE)}
                for job in JOBS}
    started = time.monotonic()
    runs = {job: Run(job, len(expected[job]), started=started) for job in JOBS}
    stop = threading.Event()
    readers = [_follow(settings[job], runs[job], stop) for job in JOBS]
    schedule = Kills(bootstrap, runs, {j: settings[j].topics.episodes for j in JOBS},
                     interval, kills, started, ceilings)
    exited: list[str] = []
    try:
        for job in JOBS:
            publish(settings[job], work[job])
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            schedule.tick()
            for stage in STAGES:  # a fleet process that ended unkilled, restarted
                if procs.procs[current[stage]].poll() is not None:
                    exited.append(current[stage])
                    current[stage] = f"{stage}.{len(exited)}"
                    procs.start(current[stage], *commands[stage])
            for job, run in runs.items():
                if not run.finished and expected[job] <= {e for _, e, _ in list(run.scored)}:
                    run.finished = time.monotonic() - started
            if all(run.finished for run in runs.values()):
                break
            time.sleep(0.25)
        time.sleep(5)  # a duplicate, if any, arrives after the first copy
    finally:
        stop.set()
        for reader in readers:
            reader.join(10)
        schedule.restart_down()
        hung = procs.stop_together()
    per_job = {}
    for job, run in runs.items():
        end = run.finished or time.monotonic() - started
        times = sorted(t for t, _, _ in run.scored)
        rate = steady_rate(times)
        per_job[job] = {
            **run.counts(expected[job]), "total_s": round(end, 1),
            "steady_episodes_per_s": round(rate, 2) if rate else None,
            "recovery_s": [recovery_s(times, f.at, end, ceilings[job])
                           for f in schedule.faults],
            "scored_per_5s": [sum(1 for t in times if b * 5 <= t < b * 5 + 5)
                              for b in range(int(end // 5) + 1)],
        }
    return {"faults": [vars(f) for f in schedule.faults], "jobs": per_job,
            "processes_exited_unkilled": exited, "processes_hung_at_stop": hung}


def measure(bootstrap: str, workdir: Path, episodes: int, kills: int, interval: float,
            timeout_s: float, baseline: bool, replication_factor: int = 3) -> dict[str, Any]:
    """Without faults (when `baseline`: each job's steady rate is then the most its recovery
    is measured against, as in benchmarks.chaos), then with `kills`."""
    result: dict[str, Any] = {"episodes_per_job": episodes, "partitions": PARTITIONS,
                              "replication_factor": replication_factor,
                              "fault_interval_s": interval}
    ceilings: dict[str, float | None] = dict.fromkeys(JOBS)
    if baseline:
        calm = one_run(bootstrap, workdir / "calm", episodes, 0, interval, timeout_s,
                       replication_factor, ceilings)
        result["without_faults"] = calm
        ceilings = {job: r["steady_episodes_per_s"] for job, r in calm["jobs"].items()}
    result["with_faults"] = one_run(bootstrap, workdir / "faults", episodes, kills, interval,
                                    timeout_s, replication_factor, ceilings)
    return result


def run(quick: bool = False, timeout_s: float = 1800) -> dict[str, Any]:
    env = os.environ.get
    episodes = int(env("ROLLSTREAM_CHAOS_JOBS_EPISODES", 400 if quick else 2000))
    kills = int(env("ROLLSTREAM_CHAOS_JOBS_KILLS", 1 if quick else 2))
    baseline = not quick and env("ROLLSTREAM_CHAOS_BASELINE", "1") != "0"
    keep = env("ROLLSTREAM_CHAOS_WORKDIR")  # keeps every process's and node's log
    with (contextlib.nullcontext(keep) if keep
          else tempfile.TemporaryDirectory(prefix="rollstream-chaos-jobs-")) as tmp:
        workdir = Path(tmp)
        with three_node_cluster(workdir / "home") as bootstrap:
            result = measure(bootstrap, workdir, episodes, kills, 10.0, timeout_s, baseline)
    faults = result["with_faults"]
    recoveries = [r for job in faults["jobs"].values() for r in job["recovery_s"]]
    met = (all(j["lost"] == 0 and j["duplicated"] == 0 and j["infra"] == 0
               for j in faults["jobs"].values())
           and len(faults["faults"]) == kills
           and not faults["processes_exited_unkilled"] and not faults["processes_hung_at_stop"]
           and all(r is not None and r <= TARGET_S for r in recoveries))
    doc = {"quick": quick, **result, "target": {
        "description": "per job: 0 lost, 0 duplicated, 0 infra; no fleet process exited or "
                       f"hung; each job's full throughput back within {TARGET_S:.0f} s of "
                       "every partition-leader kill",
        "met": met}}
    write_result(NAME, doc)
    print_table("chaos with jobs", ["run", "job", "episodes", "lost", "duplicated", "infra",
                                    "total s", "back after each kill (s)"],
                [[label, job, r["expected"], r["lost"], r["duplicated"], r["infra"],
                  r["total_s"], ", ".join(str(x) for x in r["recovery_s"])]
                 for label in ("without_faults", "with_faults") if label in result
                 for job, r in result[label]["jobs"].items()])
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
