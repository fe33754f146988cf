"""Chaos: the whole pipeline on a local 3-node Kafka cluster while its processes and brokers are
SIGKILLed, against the same workload without faults, in the same run.

Processes (real OS processes, `rollstream ...`): a scripted policy server (vLLM's contract,
multi-turn `guess_number` episodes of up to 4 turns), 2 INIT, 2 RUN, 2 EVAL (one of each pair
with `--instance-id`), the trainer's consumer (`rollstream bridge`) and the inference
controller. Faults, in turn, every `interval` seconds from the first scored episode (10 s;
ROLLSTREAM_CHAOS_INTERVAL_S), and never before the last fault's throughput is back (or 60 s
passed): SIGKILL of an INIT, RUN, EVAL, bridge or controller process
(restarted after 1 s, as a supervisor would), of the broker leading a partition of `episodes`,
and of the active KRaft controller (restarted after 5 s); once, when half the episodes are
scored, the whole cluster is SIGKILLed and restarted.

Figures, read from the committed `scored` topic by a thread that times each event when it
becomes readable: episodes lost (never scored), duplicated (scored more than once),
infra-classed; processes that exited without being killed, or hung (did not stop within 45 s
of SIGTERM at the end); for each fault kind the time until the scored rate over a 5 s window
is back to 80% of its rate in the 15 s before the fault (at most 80% of the steady rate
without faults), and the faults after which it never was ("not back"); the total time
against the run without faults. The bar: 0 lost, duplicated, infra, exited or hung, and every
single-broker kill back within 30 s.

`python -m benchmarks chaos`: 30,000 episodes a run, enough for two rounds of every fault kind
where the pipeline runs at ~200 episodes/s (ROLLSTREAM_CHAOS_EPISODES sets it; `--quick`:
400 episodes, partition-leader kills, no baseline; tests/e2e/test_chaos.py runs 200 with one).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import print_table, write_result
from producers.publish import publish, validate_task
from rollstream.broker import cluster, local
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup, free_port, wait_http

NAME = "chaos"
GROUP_SIZE = 4
PARTITIONS = 8
PROCESS_KINDS = ("init", "run", "eval", "trainer", "controller")
BROKER_KINDS = ("partition-leader", "active-controller")
# Broker kills between process kills, so one's recovery is timed before the next broker fault.
FAULT_ORDER = ("init", "partition-leader", "run", "eval", "active-controller", "trainer",
               "controller")
GUESSES = ["5", "2", "7", "9"]  # the scripted policy's answers, turn by turn
WINDOW_S = 5.0  # rate window for "back to full throughput"
SETTLE_MAX_S = 60.0  # the longest the next fault waits for the last one's recovery
TARGET_S = 30.0  # the bar on each single-broker kill's time back to full throughput
RECOVERED = 0.8  # fraction of the pre-fault rate that counts as full throughput
PROCESS_RESTART_S = 1.0  # a killed process is started again after this long, as by a supervisor
BROKER_RESTART_S = 5.0  # the same for a killed node


@dataclass
class Fault:
    kind: str
    at: float  # seconds since the run started
    target: str
    recovery_s: float | None = None
    note: str = ""  # why recovery_s is None
    infra: int = 0  # episodes scored infra-classed from this fault to the next (or the end)


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

    def good_times(self) -> list[float]:
        """When each episode not infra-classed was scored, in order: the throughput a fault
        is to be recovered to (an episode failed as infra is not work done)."""
        return sorted(t for t, _, cls in list(self.scored) if cls != "infra")

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
    """Processes restartable by name; `kinds` names, for each process fault kind, the
    processes it kills, one after another round by round."""

    def __init__(self, log_dir: Path, commands: dict[str, list[str]],
                 kinds: dict[str, list[str]]) -> None:
        self.procs = ProcessGroup(log_dir)
        self.commands = commands
        self.kinds = {kind: [n for n in names if n in commands] for kind, names in kinds.items()}
        self.restarts: Counter[str] = Counter()
        self.unkilled: list[str] = []  # processes that ended without being killed

    def start_all(self) -> None:
        for name in self.commands:
            self.start(name)

    def start(self, name: str) -> subprocess.Popen:
        self.restarts[name] += 1
        return self.procs.start(self.current(name), *self.commands[name])

    def current(self, name: str) -> str:
        return f"{name}.{self.restarts[name]}"

    def kill(self, name: str) -> None:
        self.procs.kill(self.current(name))

    def restart_exited(self) -> None:
        """Start again, as a supervisor would, each process that ended unkilled (a killed
        one has left ProcessGroup.procs), and record it in `unkilled`."""
        gone = [n for n in self.commands
                if (p := self.procs.procs.get(self.current(n))) is not None
                and p.poll() is not None]
        for name in gone:
            self.procs.procs.pop(self.current(name))
            self.unkilled.append(self.current(name))
            self.start(name)


def stage_pipeline(settings: Settings, log_dir: Path, policy_url: str,
                   names: list[str] | None = None) -> Pipeline:
    """The single-job pipeline's processes (`names`: a subset of them; all by default)."""
    common = settings.client_flags()
    policy = ["--policy-url", policy_url]
    commands: dict[str, list[str]] = {
        "init-0": ["stage", "init", *common],
        "init-1": ["stage", "init", *common, "--instance-id", "chaos-init"],
        "run-0": ["stage", "run", *common, *policy],
        "run-1": ["stage", "run", *common, *policy, "--instance-id", "chaos-run"],
        "eval-0": ["stage", "eval", *common],
        "eval-1": ["stage", "eval", *common, "--instance-id", "chaos-eval"],
        "trainer": ["bridge", *common, "--groups-per-batch", "4"],
        "controller": ["controller", *common, *policy],
    }
    if names is not None:
        commands = {n: commands[n] for n in names}
    # INIT, RUN and EVAL: the dynamic member first, the static one the next round.
    kinds = {kind: [f"{kind}-0", f"{kind}-1"] for kind in ("init", "run", "eval")}
    return Pipeline(log_dir, commands, {**kinds, "trainer": ["trainer"],
                                        "controller": ["controller"]})


def policy_command(script: Path) -> tuple[list[str], str]:
    """The scripted policy server's command (its script written to `script`) and its URL."""
    script.write_text(json.dumps({"match": "Guess", "completions": GUESSES}) + "\n")
    port = free_port()
    return (["serve-scripted", "--port", str(port), "--script", str(script)],
            f"http://127.0.0.1:{port}")


def follow(runs: list[tuple[Settings, Run, set[str]]], deadline: float, tick: Any,
           grace_s: float) -> None:
    """Read each run's committed scored events, in a thread of its own so that each is timed
    when it becomes readable (the fault schedule's calls to the cluster block for seconds),
    calling `tick` meanwhile, until every run has every expected episode or the deadline; then
    `grace_s` more, for duplicates."""
    stop = threading.Event()
    done = {run.label: threading.Event() for _, run, _ in runs}

    def read(settings: Settings, run: Run, expected: set[str]) -> None:
        partitions = kafka.whole_topic(settings, settings.topics.scored)
        assert partitions is not None, settings.topics.scored
        reader = kafka.reader(settings, partitions)
        seen: set[str] = set()
        try:
            while not stop.is_set():
                for msg in reader.consume(500, timeout=0.2):
                    if msg.error() is not None:
                        continue
                    scored = codec().decode_as("ScoredTrajectory", msg.value())
                    episode = scored["trajectory"]["episode_id"]
                    run.scored.append((time.monotonic() - run.started, episode,
                                       scored["failure_class"]))
                    seen.add(episode)
                if not done[run.label].is_set() and expected <= seen:
                    run.finished = time.monotonic() - run.started
                    done[run.label].set()
        finally:
            reader.close()

    threads = [threading.Thread(target=read, args=item, name=f"scored-{item[1].label}",
                                daemon=True) for item in runs]
    for thread in threads:
        thread.start()
    try:
        while time.monotonic() < deadline and not all(d.is_set() for d in done.values()):
            tick()
            time.sleep(0.25)
        for _, run, _ in runs:
            if not done[run.label].is_set():
                run.finished = time.monotonic() - run.started
        time.sleep(grace_s)  # a duplicate, if any, arrives after the first copy
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def steady_rate(times: list[float]) -> float | None:
    """Episodes/s between the 10th and the 90th percentile of scoring times: the pipeline's
    rate once started and before its tail."""
    times = sorted(times)
    lo, hi = len(times) // 10, len(times) * 9 // 10
    if hi - lo < 10 or times[hi] <= times[lo]:
        return None
    return (hi - lo) / (times[hi] - times[lo])


def recovery_s(times: list[float], at: float, end: float,
               ceiling: float | None = None) -> float | None:
    """Seconds after `at` until the rate over WINDOW_S is back to RECOVERED x the rate of the
    15 s before (at most `ceiling`, the rate without faults: right after an earlier fault the
    pipeline catches up faster than it can run for long); None when there was no rate before
    (nothing to recover to) or it never is."""
    before = sum(1 for t in times if at - 15 <= t < at) / 15
    if ceiling is not None:
        before = min(before, ceiling)
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
    """The fault schedule: one fault every `interval` s from the first scored episode of every
    run, kinds in turn, and the whole-cluster restart once, after half of each run's episodes
    are scored; no fault before every run's throughput is back from the last one (at most
    `settle_max_s`). Each fault is recorded in every run: the runs (jobs) share the cluster and
    the processes. Partition-leader kills take `leader_topics` in turn (partition 0's leader)."""

    def __init__(self, pipeline: Pipeline, runs: list[Run], bootstrap: str, interval: float,
                 kinds: list[str], leader_topics: list[str], cluster_restart: bool = False,
                 max_faults: int | None = None, ceilings: list[float | None] | None = None,
                 settle_max_s: float = SETTLE_MAX_S) -> None:
        self.pipeline, self.runs, self.bootstrap = pipeline, runs, bootstrap
        self.ceilings = ceilings or [None] * len(runs)
        self.interval, self.kinds, self.leader_topics = interval, kinds, leader_topics
        self.max_faults = max_faults
        self.cluster_restart = cluster_restart
        self.settle_max_s = settle_max_s
        self.next_at: float | None = None  # `interval` after the first scored episodes
        self.turn = 0
        self.leader_kills = 0
        self.down: list[tuple[float, int]] = []  # (restart at, node)

    def now(self) -> float:
        return time.monotonic() - self.runs[0].started

    def tick(self) -> None:
        now = self.now()
        for item in [d for d in self.down if d[0] <= now]:
            self.down.remove(item)
            cluster.start_node(item[1])
        self.pipeline.restart_exited()
        if not self._settled(now):
            return
        if self.cluster_restart and all(len(r.scored) >= r.episodes // 2 for r in self.runs):
            self.cluster_restart = False
            self._whole_cluster()
            self.next_at = self.now() + self.interval
            return
        if self.next_at is None:
            if not all(r.scored for r in self.runs):
                return
            self.next_at = now + self.interval
        if now < self.next_at or self.down or not self.kinds or (
                self.max_faults is not None and self.turn >= self.max_faults):
            return
        kind = self.kinds[self.turn % len(self.kinds)]
        names = self.pipeline.kinds.get(kind, [])
        name = names[self.turn // len(self.kinds) % len(names)] if names else None
        self.turn += 1
        self.next_at = now + self.interval
        if kind in BROKER_KINDS:
            if len(cluster.brokers(self.bootstrap)) < 3:  # the last one still rejoining
                self.turn -= 1
                self.next_at = now + 1
                return
            if kind == "partition-leader":
                topic = self.leader_topics[self.leader_kills % len(self.leader_topics)]
                self.leader_kills += 1
                node = cluster.partition_leader(self.bootstrap, topic)
                target = f"node {node}, leading {topic}[0]"
            else:
                node = cluster.active_controller(self.bootstrap)
                target = f"node {node}"
            cluster.kill_node(node)
            self._record(kind, target)
            self.down.append((self.now() + BROKER_RESTART_S, node))
            return
        if name is None:  # a kind this pipeline runs no process of
            return
        self.pipeline.kill(name)
        self._record(kind, name)
        time.sleep(PROCESS_RESTART_S)
        self.pipeline.start(name)

    def _record(self, kind: str, target: str) -> None:
        at = self.now()
        for run in self.runs:
            run.faults.append(Fault(kind, at, target))

    def _settled(self, now: float) -> bool:
        """Every run's throughput is back from the last fault (or it had none to get back to,
        or `settle_max_s` passed): a fault during another's recovery would blur both figures."""
        faults = self.runs[0].faults
        if not faults or now - faults[-1].at >= self.settle_max_s:
            return True
        at = faults[-1].at
        for run, ceiling in zip(self.runs, self.ceilings, strict=True):
            times = run.good_times()
            if (any(at - 15 <= t < at for t in times)
                    and recovery_s(times, at, now, ceiling) is None):
                return False
        return True

    def _whole_cluster(self) -> None:
        nodes = cluster.running_nodes()
        for node in nodes:
            cluster.kill_node(node)
        self._record("whole-cluster", f"nodes {nodes}")
        for node in nodes:
            cluster.start_node(node)

    def restart_down(self) -> None:
        """Start the nodes still down (the run ended first)."""
        for _, node in self.down:
            cluster.start_node(node)
        self.down.clear()


def one_run(base: Settings, workdir: Path, label: str, episodes: int, faults: bool,
            interval: float, kinds: list[str], timeout_s: float, whole_cluster: bool,
            max_faults: int | None = None, grace_s: float = 5.0,
            processes: list[str] | None = None,
            ceiling: float | None = None) -> tuple[Run, set[str]]:
    settings = replace(base, prefix=f"chaos{label}{uuid.uuid4().hex[:6]}")
    create_topics(settings.bootstrap_servers, settings.prefix, PARTITIONS, replication_factor=3)
    policy = ProcessGroup(workdir / f"{label}-logs")
    command, url = policy_command(workdir / f"{label}-script.jsonl")
    wait_http(f"{url}/health", proc=policy.start("policy", *command), timeout=120)
    pipeline = stage_pipeline(settings, workdir / label / "logs", url, processes)
    work = tasks(max(1, episodes // GROUP_SIZE), label)
    expected = {f"{t['task_id']}#{i}" for t in work for i in range(GROUP_SIZE)}
    run = Run(label, len(expected))
    chaos = Chaos(pipeline, [run], settings.bootstrap_servers, interval, kinds,
                  [settings.topics.episodes], cluster_restart=whole_cluster,
                  max_faults=max_faults, ceilings=[ceiling]) if faults else None
    try:
        pipeline.start_all()
        run.started = time.monotonic()
        publish(settings, work)
        follow([(settings, run, expected)], time.monotonic() + timeout_s,
               tick=chaos.tick if chaos else pipeline.restart_exited, grace_s=grace_s)
    finally:
        if chaos is not None:
            chaos.restart_down()
        run.hung = pipeline.procs.stop_together()  # the names that did not stop (hung)
        run.exited = pipeline.unkilled
        policy.stop_all()
    return run, expected


def time_recoveries(run: Run, ceiling: float | None) -> None:
    """Each fault's time back to full throughput (see recovery_s), or why there is none, and
    the infra-classed episodes scored until the next fault."""
    times = run.good_times()
    # Each fault's infra counted until the next one; a run without faults has none to time.
    ends = [f.at for f in run.faults[1:]] + [float("inf")] if run.faults else []
    for fault, end in zip(run.faults, ends, strict=True):
        fault.infra = sum(1 for t, _, cls in run.scored if cls == "infra" and fault.at <= t < end)
        fault.recovery_s = recovery_s(times, fault.at, run.finished, ceiling)
        if fault.recovery_s is None:
            fault.note = ("no rate before" if not any(fault.at - 15 <= t < fault.at
                                                      for t in times)
                          else "run ended first" if run.finished - fault.at < 30
                          else "not back")


def figures(run: Run, expected: set[str]) -> dict[str, Any]:
    """What a run scored, how fast, and each fault's time back to full throughput (after
    time_recoveries)."""
    by_kind: dict[str, list[float]] = {}
    for f in run.faults:
        if f.recovery_s is not None:
            by_kind.setdefault(f.kind, []).append(f.recovery_s)
    rate = steady_rate([t for t, _, _ in run.scored])
    return {
        **run.counts(expected),
        "total_s": round(run.finished, 1),
        "episodes_per_s": round(len(expected) / run.finished, 2) if run.finished else None,
        "steady_episodes_per_s": round(rate, 2) if rate else None,
        "faults": Counter(f.kind for f in run.faults),
        "recovery_s_by_kind": {k: {"median": statistics.median(v), "max": max(v), "n": len(v)}
                               for k, v in sorted(by_kind.items())},
        "not_back": Counter(f.kind for f in run.faults if f.note == "not back"),
        "fault_log": [vars(f) for f in run.faults],
    }


def summarize(run: Run, expected: set[str]) -> dict[str, Any]:
    return {**figures(run, expected), "processes_exited_unkilled": run.exited,
            "processes_hung_at_stop": run.hung}


def broker_kills_back(result: dict[str, Any], kinds: list[str]) -> bool:
    """The bar on a run's `figures`: every broker kill back within TARGET_S, and each broker
    kind scheduled timed at least once (not only mid-restart or at the run's end)."""
    return (all(v["max"] <= TARGET_S for k, v in result["recovery_s_by_kind"].items()
                if k in BROKER_KINDS)
            and not any(result["not_back"].get(k) for k in BROKER_KINDS)
            and all(k in result["recovery_s_by_kind"] for k in kinds if k in BROKER_KINDS))


def parse_kinds(text: str, known: tuple[str, ...]) -> list[str]:
    """Fault kinds from a comma-separated list (an environment knob), each one of `known`."""
    kinds = [k for k in text.split(",") if k]
    unknown = set(kinds) - set(known)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {known}")
    return kinds


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
        # A throwaway cluster: killed, not shut down in order (that takes seconds per node).
        for node in cluster.running_nodes():
            cluster.kill_node(node)
        if old is None:
            os.environ.pop(local.HOME_ENV, None)
        else:
            os.environ[local.HOME_ENV] = old


def measure(bootstrap: str, episodes: int, interval: float, kinds: list[str], baseline: bool,
            timeout_s: float, workdir: Path, whole_cluster: bool,
            max_faults: int | None = None, grace_s: float = 5.0,
            processes: list[str] | None = None) -> dict[str, Any]:
    """On the 3-node cluster at `bootstrap` (three_node_cluster): without faults (when
    `baseline`), then with; `processes` names a subset of stage_pipeline's (all by default)."""
    base = load(bootstrap_servers=bootstrap, partitions=PARTITIONS)
    result: dict[str, Any] = {"episodes": episodes, "partitions": PARTITIONS,
                              "fault_interval_s": interval, "fault_kinds": kinds}
    ceiling = None
    if baseline:
        run, expected = one_run(base, workdir, "calm", episodes, False, interval, kinds,
                                timeout_s, whole_cluster=False, grace_s=grace_s,
                                processes=processes)
        result["without_faults"] = summarize(run, expected)
        ceiling = steady_rate([t for t, _, _ in run.scored])
    run, expected = one_run(base, workdir, "chaos", episodes, True, interval, kinds,
                            timeout_s, whole_cluster, max_faults, grace_s, processes,
                            ceiling)
    time_recoveries(run, ceiling)
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
    30,000 episodes (quick: 400, partition-leader kills only, no baseline)."""
    env = os.environ.get
    episodes = episodes or int(env("ROLLSTREAM_CHAOS_EPISODES", 400 if quick else 30_000))
    interval = interval or float(env("ROLLSTREAM_CHAOS_INTERVAL_S", 3 if quick else 10))
    default_kinds = "partition-leader" if quick else ",".join(FAULT_ORDER)
    kinds = kinds or parse_kinds(env("ROLLSTREAM_CHAOS_KINDS", default_kinds),
                                 PROCESS_KINDS + BROKER_KINDS)
    if baseline is None:
        baseline = not quick and env("ROLLSTREAM_CHAOS_BASELINE", "1") != "0"
    # ROLLSTREAM_CHAOS_WORKDIR keeps the processes' logs (and the cluster's) for a post-mortem.
    keep = env("ROLLSTREAM_CHAOS_WORKDIR")
    with (contextlib.nullcontext(keep) if keep
          else tempfile.TemporaryDirectory(prefix="rollstream-chaos-")) as tmp:
        workdir = Path(tmp)
        with three_node_cluster(workdir / "home") as bootstrap:
            result = measure(bootstrap, episodes, interval, kinds, baseline, timeout_s,
                             workdir, whole_cluster=not quick)
    faults = result["with_faults"]
    met = (faults["lost"] == 0 and faults["duplicated"] == 0 and faults["infra"] == 0
           and not faults["processes_exited_unkilled"] and not faults["processes_hung_at_stop"]
           and broker_kills_back(faults, kinds))
    doc = {"quick": quick, **result, "target": {
        "description": "0 lost, 0 duplicated, 0 infra, no process exits or hangs, full "
                       "throughput back within 30 s of every broker kill (partition leader, "
                       "active controller; the whole-cluster restart is reported, not "
                       "bounded: it includes three JVM starts)",
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
    print_table("time to full throughput after a fault (s)",
                ["fault", "median", "max", "n", "not back"],
                [[k, v["median"], v["max"], v["n"], faults["not_back"].get(k, 0)]
                 for k, v in faults["recovery_s_by_kind"].items()])
    if "time_ratio_faults_vs_calm" in result:
        print(f"\ntotal time with faults / without: {result['time_ratio_faults_vs_calm']}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
