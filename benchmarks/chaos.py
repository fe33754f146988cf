"""Chaos: the whole pipeline on a local 3-node Kafka cluster while its processes and brokers are
SIGKILLed, against the same workload without faults, in the same run.

Processes (real OS processes, `rollstream ...`): a scripted policy server (vLLM's contract,
multi-turn `guess_number` episodes of up to 4 turns), 2 INIT, 2 RUN, 2 EVAL (one of each pair
with `--instance-id`), the trainer's consumer (`rollstream bridge`) and the inference
controller. Faults, in turn, every `--fault-interval` seconds: SIGKILL of an INIT, RUN, EVAL,
bridge or controller process (restarted after 1 s, as a supervisor would), of the broker
leading a partition of `episodes`, and of the active KRaft controller (restarted after 5 s);
once, mid-run, the whole cluster is SIGKILLed and restarted.

Figures, read from the committed `scored` topic: episodes lost (never scored), duplicated
(scored more than once), infra-classed; processes that exited without being killed, or hung
(did not stop within 45 s of SIGTERM at the end); for each fault kind the time until the scored
rate over a 5 s window is back to 80% of its rate in the 15 s before the fault; the total time
against the run without faults.

`python -m benchmarks chaos`: 10,000 episodes a run (ROLLSTREAM_CHAOS_EPISODES sets it; `--quick`:
400 episodes, one kind of fault, no baseline, as tests/test_chaos.py runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from benchmarks import print_table, write_result
from producers.publish import publish, validate_task
from rollstream import kafka
from rollstream.broker import cluster, local
from rollstream.codec import codec
from rollstream.config import Settings, load
from rollstream.dev.processes import ProcessGroup, free_port, wait_http
from rollstream.topics import create_topics

NAME = "chaos"
GROUP_SIZE = 4
PARTITIONS = 8
PROCESS_KINDS = ("init", "run", "eval", "trainer", "controller")
BROKER_KINDS = ("partition-leader", "active-controller")
GUESSES = ["5", "2", "7", "9"]  # the scripted policy's answers, turn by turn
WINDOW_S = 5.0  # rate window for "back to full throughput"
RECOVERED = 0.8  # fraction of the pre-fault rate that counts as full throughput


@dataclass
class Fault:
    kind: str
    at: float  # seconds since the run started
    target: str
    recovery_s: float | None = None


@dataclass
class Run:
    """One pass of the workload: what was scored when, and what went wrong."""

    label: str
    episodes: int
    started: float = 0.0
    finished: float = 0.0
    scored: list[tuple[float, str, str]] = field(default_factory=list)  # (t, id, class)
    faults: list[Fault] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)

    def counts(self, expected: set[str]) -> dict[str, int]:
        seen = Counter(episode for _, episode, _ in self.scored)
        return {
            "expected": len(expected),
            "scored_once": sum(1 for e in expected if seen[e] == 1),
            "lost": sum(1 for e in expected if seen[e] == 0),
            "duplicated": sum(1 for c in seen.values() if c > 1),
            "infra": sum(1 for _, _, cls in self.scored if cls == "infra"),
        }


def tasks(count: int, tag: str) -> list[dict]:
    return [validate_task({
        "task_id": f"{tag}-{i}", "env": "guess_number", "prompt": f"Guess 0-9 ({tag} {i}).",
        "data": {"secret": i % 10, "low": 0, "high": 9}, "max_turns": len(GUESSES),
        "group_size": GROUP_SIZE,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4,
                     "seed": i}}) for i in range(count)]


class Pipeline:
    """The processes of one run, restartable by name."""

    def __init__(self, settings: Settings, workdir: Path, policy_url: str) -> None:
        self.settings = settings
        self.procs = ProcessGroup(workdir / "logs")
        common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix,
                  "--policy-url", policy_url]
        self.commands: dict[str, list[str]] = {
            "init-0": ["stage", "init", *common],
            "init-1": ["stage", "init", *common, "--instance-id", "chaos-init"],
            "run-0": ["stage", "run", *common],
            "run-1": ["stage", "run", *common, "--instance-id", "chaos-run"],
            "eval-0": ["stage", "eval", *common],
            "eval-1": ["stage", "eval", *common, "--instance-id", "chaos-eval"],
            "trainer": ["bridge", *common, "--groups-per-batch", "4"],
            "controller": ["controller", *common],
        }
        self.restarts: Counter[str] = Counter()

    def start_all(self) -> None:
        for name in self.commands:
            self.start(name)

    def start(self, name: str) -> None:
        self.restarts[name] += 1
        self.procs.start(f"{name}.{self.restarts[name]}", *self.commands[name])

    def current(self, name: str) -> str:
        return f"{name}.{self.restarts[name]}"

    def kill(self, name: str) -> None:
        self.procs.kill(self.current(name))

    def exited(self) -> list[str]:
        """Processes that ended without being killed (each restarted, as a supervisor would)."""
        gone = [n for n in self.commands
                if (p := self.procs.procs.get(self.current(n))) is not None
                and p.poll() is not None]
        for name in gone:
            self.procs.procs.pop(self.current(name))
            self.start(name)
        return gone

    def stop_all(self, timeout: float = 45.0) -> list[str]:
        """SIGTERM everything; the names that did not stop within timeout (hung)."""
        hung = []
        for _name, proc in list(self.procs.procs.items()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, proc in list(self.procs.procs.items()):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(name)
                proc.kill()
                proc.wait()
        self.procs.procs.clear()
        return hung


def _follow(settings: Settings, run: Run, expected: set[str], deadline: float,
            tick: Any = None) -> None:
    """Read committed scored events until every expected episode is there or the deadline."""
    reader = kafka.reader(settings, [TopicPartition(settings.topics.scored, p, 0)
                                     for p in range(PARTITIONS)])
    done: set[str] = set()
    try:
        while time.monotonic() < deadline and not expected <= done:
            for msg in reader.consume(500, timeout=0.5):
                if msg.error() is not None:
                    continue
                scored = codec().decode_as("ScoredTrajectory", msg.value())
                episode = scored["trajectory"]["episode_id"]
                run.scored.append((time.monotonic() - run.started, episode,
                                   scored["failure_class"]))
                done.add(episode)
            if tick is not None:
                tick()
        # A short grace period: duplicates, if any, arrive after the first copy.
        end = time.monotonic() + 5
        while time.monotonic() < end:
            for msg in reader.consume(500, timeout=0.5):
                if msg.error() is None:
                    scored = codec().decode_as("ScoredTrajectory", msg.value())
                    run.scored.append((time.monotonic() - run.started,
                                       scored["trajectory"]["episode_id"],
                                       scored["failure_class"]))
    finally:
        reader.close()


def recovery_s(times: list[float], at: float, end: float) -> float | None:
    """Seconds after `at` until the rate over WINDOW_S is back to RECOVERED x the rate of the
    15 s before; None when there was no rate before (nothing to recover to) or it never is."""
    before = sum(1 for t in times if at - 15 <= t < at) / 15
    if before <= 0:
        return None
    need = RECOVERED * before * WINDOW_S
    start = at
    while start + WINDOW_S <= end:
        if sum(1 for t in times if start <= t < start + WINDOW_S) >= need:
            return round(start + WINDOW_S - at, 1)
        start += 0.5
    return None


class Chaos:
    """The fault schedule: one fault every `interval` s, kinds in turn, and the whole-cluster
    restart once, after half the episodes are scored."""

    def __init__(self, pipeline: Pipeline, run: Run, bootstrap: str, interval: float,
                 kinds: list[str], cluster_restart: bool, max_faults: int | None) -> None:
        self.pipeline, self.run, self.bootstrap = pipeline, run, bootstrap
        self.interval, self.kinds = interval, kinds
        self.max_faults = max_faults
        self.cluster_restart = cluster_restart
        self.next_at = interval
        self.turn = 0
        self.down: list[tuple[float, int]] = []  # (restart at, node)

    def now(self) -> float:
        return time.monotonic() - self.run.started

    def tick(self) -> None:
        now = self.now()
        for item in [d for d in self.down if d[0] <= now]:
            self.down.remove(item)
            cluster.start_node(item[1])
        self.run.exited += self.pipeline.exited()
        if self.cluster_restart and len(self.run.scored) >= self.run.episodes // 2:
            self.cluster_restart = False
            self._whole_cluster()
            self.next_at = self.now() + self.interval
            return
        if now < self.next_at or self.down or not self.kinds or (
                self.max_faults is not None and self.turn >= self.max_faults):
            return
        kind = self.kinds[self.turn % len(self.kinds)]
        self.turn += 1
        self.next_at = now + self.interval
        if kind in BROKER_KINDS:
            if len(cluster.brokers(self.bootstrap)) < 3:  # the last one still rejoining
                self.turn -= 1
                self.next_at = now + 1
                return
            node = (cluster.partition_leader(self.bootstrap, self.pipeline.settings.topics.episodes)
                    if kind == "partition-leader" else cluster.active_controller(self.bootstrap))
            cluster.kill_node(node)
            self.run.faults.append(Fault(kind, self.now(), f"node {node}"))
            self.down.append((self.now() + 5, node))
            return
        name = {"init": "init-0", "run": "run-0", "eval": "eval-0"}.get(kind, kind)
        if kind in ("init", "run", "eval") and self.turn // len(self.kinds) % 2:
            name = name[:-1] + "1"  # every other round, the static member
        self.pipeline.kill(name)
        self.run.faults.append(Fault(kind, self.now(), name))
        time.sleep(1)
        self.pipeline.start(name)

    def _whole_cluster(self) -> None:
        nodes = cluster.running_nodes()
        for node in nodes:
            cluster.kill_node(node)
        self.run.faults.append(Fault("whole-cluster", self.now(), f"nodes {nodes}"))
        for node in nodes:
            cluster.start_node(node)


def one_run(base: Settings, workdir: Path, label: str, episodes: int, faults: bool,
            interval: float, kinds: list[str], timeout_s: float,
            whole_cluster: bool, max_faults: int | None = None) -> tuple[Run, set[str]]:
    settings = replace(base, prefix=f"chaos{label}{uuid.uuid4().hex[:6]}")
    create_topics(settings.bootstrap_servers, settings.prefix, PARTITIONS, replication_factor=3)
    script = workdir / f"{label}-script.jsonl"
    script.write_text(json.dumps({"match": "Guess", "completions": GUESSES}) + "\n")
    policy = ProcessGroup(workdir / f"{label}-logs")
    port = free_port()
    server = policy.start("policy", "serve-scripted", "--port", str(port), "--script", str(script))
    wait_http(f"http://127.0.0.1:{port}/health", proc=server, timeout=120)
    pipeline = Pipeline(settings, workdir / label, f"http://127.0.0.1:{port}")
    work = tasks(max(1, episodes // GROUP_SIZE), label)
    expected = {f"{t['task_id']}#{i}" for t in work for i in range(GROUP_SIZE)}
    run = Run(label, len(expected))
    try:
        pipeline.start_all()
        run.started = time.monotonic()
        publish(settings, work)
        chaos = Chaos(pipeline, run, settings.bootstrap_servers, interval, kinds,
                      cluster_restart=whole_cluster, max_faults=max_faults) if faults else None
        _follow(settings, run, expected, time.monotonic() + timeout_s,
                tick=chaos.tick if chaos else lambda: run.exited.extend(pipeline.exited()))
        run.finished = time.monotonic() - run.started
        if chaos is not None:
            for node in [n for _, n in chaos.down]:
                cluster.start_node(node)
    finally:
        run.hung = pipeline.stop_all()
        policy.stop_all()
    times = sorted(t for t, _, _ in run.scored)
    for fault in run.faults:
        fault.recovery_s = recovery_s(times, fault.at, run.finished)
    return run, expected


def summarize(run: Run, expected: set[str]) -> dict[str, Any]:
    by_kind: dict[str, list[float]] = {}
    for f in run.faults:
        if f.recovery_s is not None:
            by_kind.setdefault(f.kind, []).append(f.recovery_s)
    return {
        **run.counts(expected),
        "total_s": round(run.finished, 1),
        "episodes_per_s": round(len(expected) / run.finished, 2) if run.finished else None,
        "faults": Counter(f.kind for f in run.faults),
        "processes_exited_unkilled": run.exited,
        "processes_hung_at_stop": run.hung,
        "recovery_s_by_kind": {k: {"median": statistics.median(v), "max": max(v), "n": len(v)}
                               for k, v in sorted(by_kind.items())},
        "fault_log": [vars(f) for f in run.faults],
    }


@contextlib.contextmanager
def three_node_cluster(home: Path) -> Any:
    """A 3-node cluster in its own home (the project's fetched jars hard-linked in)."""
    jars = local.libs_dir() if local.jars_ready() else None
    old = os.environ.get(local.HOME_ENV)
    os.environ[local.HOME_ENV] = str(home)
    os.environ.setdefault(local.HEAP_ENV, "384m")
    try:
        if jars is not None and not local.libs_dir().exists():
            shutil.copytree(jars, local.libs_dir(), copy_function=os.link)
        yield cluster.start(3, timeout=300)
    finally:
        cluster.stop(timeout=10)
        if old is None:
            os.environ.pop(local.HOME_ENV, None)
        else:
            os.environ[local.HOME_ENV] = old


def measure(episodes: int, interval: float, kinds: list[str], baseline: bool,
            timeout_s: float, workdir: Path, whole_cluster: bool,
            max_faults: int | None = None) -> dict[str, Any]:
    with three_node_cluster(workdir / "home") as bootstrap:
        base = load(bootstrap_servers=bootstrap, partitions=PARTITIONS)
        result: dict[str, Any] = {"episodes": episodes, "partitions": PARTITIONS,
                                  "fault_interval_s": interval, "fault_kinds": kinds}
        if baseline:
            run, expected = one_run(base, workdir, "calm", episodes, False, interval, kinds,
                                    timeout_s, whole_cluster=False)
            result["without_faults"] = summarize(run, expected)
        run, expected = one_run(base, workdir, "chaos", episodes, True, interval, kinds,
                                timeout_s, whole_cluster, max_faults)
        result["with_faults"] = summarize(run, expected)
    if baseline and result["without_faults"]["total_s"]:
        result["time_ratio_faults_vs_calm"] = round(
            result["with_faults"]["total_s"] / result["without_faults"]["total_s"], 2)
    return result


def run(quick: bool = False, episodes: int | None = None, interval: float | None = None,
        kinds: list[str] | None = None, baseline: bool | None = None,
        timeout_s: float = 3600) -> dict[str, Any]:
    """The benchmark; sizes from the arguments, else the environment (ROLLSTREAM_CHAOS_EPISODES,
    ROLLSTREAM_CHAOS_INTERVAL_S, ROLLSTREAM_CHAOS_KINDS, ROLLSTREAM_CHAOS_BASELINE=0), else
    10,000 episodes (quick: 400, partition-leader kills only, no baseline)."""
    env = os.environ.get
    episodes = episodes or int(env("ROLLSTREAM_CHAOS_EPISODES", 400 if quick else 10_000))
    interval = interval or float(env("ROLLSTREAM_CHAOS_INTERVAL_S", 20))
    default_kinds = "partition-leader" if quick else ",".join(PROCESS_KINDS + BROKER_KINDS)
    kinds = kinds or [k for k in env("ROLLSTREAM_CHAOS_KINDS", default_kinds).split(",") if k]
    unknown = set(kinds) - set(PROCESS_KINDS + BROKER_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: "
                         f"{PROCESS_KINDS + BROKER_KINDS}")
    if baseline is None:
        baseline = not quick and env("ROLLSTREAM_CHAOS_BASELINE", "1") != "0"
    # ROLLSTREAM_CHAOS_WORKDIR keeps the processes' logs (and the cluster's) for a post-mortem.
    keep = env("ROLLSTREAM_CHAOS_WORKDIR")
    with (contextlib.nullcontext(keep) if keep
          else tempfile.TemporaryDirectory(prefix="rollstream-chaos-")) as tmp:
        result = measure(episodes, interval, kinds, baseline, timeout_s, Path(tmp),
                         whole_cluster=not quick)
    faults = result["with_faults"]
    broker_recovery = [v["max"] for k, v in faults["recovery_s_by_kind"].items()
                       if k in (*BROKER_KINDS, "whole-cluster")]
    met = (faults["lost"] == 0 and faults["duplicated"] == 0 and faults["infra"] == 0
           and not faults["processes_exited_unkilled"] and not faults["processes_hung_at_stop"]
           and all(r < 30 for r in broker_recovery))
    doc = {"quick": quick, **result, "target": {
        "description": "0 lost, 0 duplicated, 0 infra, no process exits or hangs, full "
                       "throughput back within 30 s of every broker fault",
        "met": met}}
    write_result(NAME, doc)
    rows = []
    for label in ("without_faults", "with_faults"):
        if label in result:
            r = result[label]
            rows.append([label, r["expected"], r["lost"], r["duplicated"], r["infra"],
                         len(r["processes_exited_unkilled"]), len(r["processes_hung_at_stop"]),
                         r["total_s"]])
    print_table("chaos", ["run", "episodes", "lost", "duplicated", "infra", "exited", "hung",
                          "total s"], rows)
    print_table("time to full throughput after a fault (s)", ["fault", "median", "max", "n"],
                [[k, v["median"], v["max"], v["n"]]
                 for k, v in faults["recovery_s_by_kind"].items()])
    if "time_ratio_faults_vs_calm" in result:
        print(f"\ntotal time with faults / without: {result['time_ratio_faults_vs_calm']}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
