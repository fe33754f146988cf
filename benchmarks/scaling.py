"""Scaling by partition: RUN and EVAL with 1, 2, 4 and 8 processes on 16 partitions.

The inference servers are simulated (rollstream.dev.simulated: vLLM's HTTP contract, each
decode step `STEP_S`) and the environment's cost is waiting (`TOOL_S` a turn, `SCORE_S` to
score), so the figure measures the pipeline, not the CPU of a model. Each RUN and EVAL process
works on at most `IN_FLIGHT` events at once (`--max-in-flight`), so one process has a rate of
its own and N processes should have N times that: scaling efficiency is rate(N) / (N x rate(1)).

Per count: episodes/s between 10% and 90% of the episodes scored (the steady state, without
start-up and tail), the efficiency, and CPU seconds (user + system) of the RUN and EVAL processes
per episode. Then the join: one RUN process busy with long episodes, a second one started; the
time until it holds its share of the partitions, and how many in-flight
episodes it resumed from their checkpoints (not replayed from turn 0; every trajectory is
checked to hold each turn once).

Workers are `python -m benchmarks.scaling worker run|eval ...`: the stage runtime with the
benchmark's environment registered. `python -m benchmarks scaling`; `--quick`: 1 and 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

from confluent_kafka import TopicPartition

from benchmarks import print_table, script, write_result
from benchmarks.environments import Turns
from producers.publish import validate_task
from rollstream.broker.local import resolve_bootstrap
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, load
from rollstream.consume import heap
from rollstream.contracts.codec import codec
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.envs import registry
from rollstream.envs.base import Score, StepResult

NAME = "scaling"
PARTITIONS = 16
COUNTS = (1, 2, 4, 8)
IN_FLIGHT = 8
TURNS = 3
TOOL_S = 0.5
SCORE_S = 0.2
STEP_S = 0.02
EPISODES_PER_PROCESS = 48
GROUP_SIZE = 4
TARGET_EFFICIENCY = 0.9


class Waiting(Turns):
    """TURNS turns, each answered after TOOL_S of waiting; scored after SCORE_S."""

    name = "bench_waiting"
    description = "benchmark: turns and scoring that cost waiting, not CPU"
    tool_s = TOOL_S

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        await asyncio.sleep(self.tool_s)
        turn = state["turn"] + 1
        return StepResult("ok", turn >= int(task["max_turns"]), None, {"turn": turn})

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        await asyncio.sleep(SCORE_S)
        return Score(1.0, "ok", {})


def worker(argv: list[str]) -> None:
    """One stage process with the benchmark's environment registered."""
    from rollstream.cli.common import log_to_stderr
    from rollstream.runtime import StageRuntime

    parser = argparse.ArgumentParser()
    parser.add_argument("stage", choices=["run", "eval"])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--policy-url", default="")
    parser.add_argument("--tool-s", type=float, default=TOOL_S)
    args = parser.parse_args(argv)
    log_to_stderr()
    settings = load(bootstrap_servers=args.bootstrap_servers, prefix=args.prefix,
                    policy_url=args.policy_url, max_in_flight=IN_FLIGHT,
                    server_max_in_flight=1024, health_interval_s=1.0)
    Waiting.tool_s = args.tool_s
    with mock.patch.dict(registry._environments(), {Waiting.name: Waiting}):
        if args.stage == "run":
            from stages.run import RunStage
            stage: Any = RunStage(settings)
        else:
            from stages.eval import EvalStage
            stage = EvalStage(settings)
        heap.settle()  # as `rollstream stage` does
        StageRuntime(stage, settings).run()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (from /proc; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """A running process's resident memory in MB (from /proc; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return 0.0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


class Workers:
    """Worker processes (`python -m <module> worker <stage> ...`), each logging to a file."""

    def __init__(self, settings: Settings, policy_url: str, logs: Path,
                 module: str = "benchmarks.scaling") -> None:
        self.settings, self.policy_url, self.logs, self.module = settings, policy_url, logs, module
        self.procs: list[tuple[list[str], subprocess.Popen]] = []
        self._killed_cpu_s = 0.0
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, stage: str, *args: str) -> Path:
        return self._spawn([sys.executable, "-m", self.module, "worker", stage,
                            "--bootstrap-servers", self.settings.bootstrap_servers,
                            "--prefix", self.settings.prefix, "--policy-url", self.policy_url,
                            *args])

    def _spawn(self, command: list[str]) -> Path:
        log = self.logs / f"{command[4]}-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append((command, proc))
        return log

    def kill_and_restart(self, index: int) -> Path:
        """SIGKILL worker `index` and start it again with the same arguments (as a supervisor
        would); the new process logs to a new file, returned."""
        command, proc = self.procs[index]
        self._killed_cpu_s += _cpu_s(proc.pid)
        proc.kill()
        proc.wait()
        return self._spawn(command)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the workers, the killed ones' up to their kill."""
        return self._killed_cpu_s + sum(_cpu_s(proc.pid) for _, proc in self.procs
                                        if proc.poll() is None)

    def rss_mb(self) -> list[float]:
        """Resident memory of each running worker, MB."""
        return [rss_mb(proc.pid) for _, proc in self.procs if proc.poll() is None]

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def _tasks(count: int, tag: str, turns: int = TURNS) -> list[dict]:
    with mock.patch.dict(registry._environments(), {Waiting.name: Waiting}):
        return [validate_task({"task_id": f"{tag}-{i}", "env": Waiting.name, "prompt": f"t {i}",
                               "group_size": GROUP_SIZE, "max_turns": turns,
                               "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                            "max_tokens": 4, "seed": i}})
                for i in range(count)]


def publish(settings: Settings, tasks: list[dict]) -> None:
    """Each task's episodes, straight to `episodes` (INIT is not what this measures)."""
    producer = kafka.producer(settings)
    for task in tasks:
        for i in range(GROUP_SIZE):
            episode_id = f"{task['task_id']}#{i}"
            kafka.produce(producer, settings.topics.episodes, codec().encode("Episode", {
                "episode_id": episode_id, "task": task, "sample_index": i,
                "created_at_ms": int(time.time() * 1000)}), key=episode_id)
    producer.flush(60)


def _wait_assigned(logs: list[Path], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.is_file() and "assigned [" in p.read_text() for p in logs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers not assigned after {timeout} s: {logs}")
        time.sleep(0.5)


def _scored_times(settings: Settings, expected: int, timeout: float) -> list[float]:
    reader = kafka.reader(settings, [TopicPartition(settings.topics.scored, p, 0)
                                     for p in range(PARTITIONS)])
    times: list[float] = []
    deadline = time.monotonic() + timeout
    try:
        while len(times) < expected and time.monotonic() < deadline:
            for msg in reader.consume(500, timeout=0.5):
                if msg.error() is None:
                    times.append(time.monotonic())
    finally:
        reader.close()
    return times


def _fresh(base: Settings) -> Settings:
    settings = load(bootstrap_servers=base.bootstrap_servers,
                    prefix=f"scale{uuid.uuid4().hex[:8]}", partitions=PARTITIONS)
    create_topics(settings.bootstrap_servers, settings.prefix, PARTITIONS)
    return settings


def measure_count(base: Settings, fleet: Fleet, n: int, workdir: Path) -> dict[str, Any]:
    settings = _fresh(base)
    workers = Workers(settings, ",".join(fleet.urls), workdir / f"n{n}")
    try:
        logs = [workers.start(stage) for stage in ("run", "eval") for _ in range(n)]
        _wait_assigned(logs)
        episodes = EPISODES_PER_PROCESS * n
        cpu0 = workers.cpu_s()
        publish(settings, _tasks(episodes // GROUP_SIZE, f"n{n}"))
        times = _scored_times(settings, episodes, timeout=120 + 10 * episodes)
        cpu = workers.cpu_s() - cpu0
    finally:
        workers.stop()
        delete_topics(settings.bootstrap_servers, settings.prefix)
    lo, hi = times[len(times) // 10], times[len(times) * 9 // 10]
    steady = (len(times) * 9 // 10 - len(times) // 10) / (hi - lo) if hi > lo else None
    return {"processes": n, "episodes": episodes, "scored": len(times),
            "episodes_per_s": round(steady, 2) if steady else None,
            "cpu_s_per_episode": round(cpu / max(len(times), 1), 4)}


def measure_join(base: Settings, fleet: Fleet, workdir: Path) -> dict[str, Any]:
    """A second RUN process joins one busy with long episodes (8 turns of 2 s)."""
    settings = _fresh(base)
    workers = Workers(settings, ",".join(fleet.urls), workdir / "join")
    turns, tool_s = 8, 2.0
    try:
        slow = ("--tool-s", str(tool_s))
        first = workers.start("run", *slow)
        _wait_assigned([first, workers.start("eval", *slow)])
        work = _tasks(IN_FLIGHT * 2 // GROUP_SIZE, "join", turns)
        publish(settings, work)
        time.sleep(4 * tool_s)  # every episode of the first process a few turns in
        joined = time.monotonic()
        second = workers.start("run", *slow)
        assigned_s = None
        expected = len(work) * GROUP_SIZE
        reader = kafka.reader(settings, [TopicPartition(settings.topics.trajectories, p, 0)
                                         for p in range(PARTITIONS)])
        trajectories = []
        deadline = time.monotonic() + 300
        while len(trajectories) < expected and time.monotonic() < deadline:
            text = second.read_text() if second.is_file() else ""
            if assigned_s is None and "assigned [" in text:
                assigned_s = time.monotonic() - joined
            for msg in reader.consume(100, timeout=0.5):
                if msg.error() is None:
                    trajectories.append(codec().decode_as("Trajectory", msg.value()))
        reader.close()
        log = second.read_text()
    finally:
        workers.stop()
        delete_topics(settings.bootstrap_servers, settings.prefix)
    resumed = re.findall(r"resuming (\S+) at turn (\d+)", log)
    whole = all([t["index"] for t in tr["turns"]] == list(range(turns)) for tr in trajectories)
    return {"seconds_to_assignment": round(assigned_s, 1) if assigned_s else None,
            "in_flight_resumed_by_joiner": len(resumed),
            "resumed_at_turns": sorted(int(turn) for _, turn in resumed),
            "trajectories": len(trajectories), "expected": expected,
            "every_turn_once": whole}


def run(quick: bool = False) -> dict[str, Any]:
    base = load(bootstrap_servers=resolve_bootstrap(os.environ.get("KAFKA_BOOTSTRAP_SERVERS",
                                                                   "")))
    counts = COUNTS[:2] if quick else COUNTS
    servers = [SimulatedServer(step_s=lambda running: STEP_S, max_num_seqs=1024)
               for _ in range(2)]
    results = []
    with Fleet(servers) as fleet, tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        for n in counts:
            results.append(measure_count(base, fleet, n, Path(tmp)))
            print(f"   {n} processes: {results[-1]}", flush=True)
        join = measure_join(base, fleet, Path(tmp))
    one = results[0]["episodes_per_s"]
    for r in results:
        r["efficiency"] = (round(r["episodes_per_s"] / (r["processes"] * one), 3)
                           if one and r["episodes_per_s"] else None)
    print_table("scaling (RUN and EVAL processes each)",
                ["processes", "episodes", "episodes/s", "efficiency", "CPU s/episode"],
                [[r["processes"], r["episodes"], r["episodes_per_s"], r["efficiency"],
                  r["cpu_s_per_episode"]] for r in results])
    print(f"   join: {join}")
    top = results[-1]
    doc = {"quick": quick, "parameters": {
        "partitions": PARTITIONS, "max_in_flight_per_process": IN_FLIGHT, "turns": TURNS,
        "tool_s": TOOL_S, "score_s": SCORE_S, "decode_step_s": STEP_S,
        "episodes_per_process": EPISODES_PER_PROCESS,
        "rate": "episodes scored per second between 10% and 90% of the episodes"},
        "results": results, "join": join,
        "baseline": {"one_process_episodes_per_s": one},
        "target": {"description": f"efficiency at {top['processes']} processes >= "
                                  f"{TARGET_EFFICIENCY}",
                   "measured": top["efficiency"],
                   "met": bool(top["efficiency"] and top["efficiency"] >= TARGET_EFFICIENCY)}}
    write_result(NAME, doc)
    return doc


if __name__ == "__main__":
    script(run, worker)
