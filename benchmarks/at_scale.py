"""Ten thousand concurrent long-horizon episodes over several RUN processes on a 3-node cluster.

The workload is a SWE-style agent's: `EPISODES` episodes of `TURNS` turns, all in flight at
once, split over `PROCESSES` RUN processes (each `--max-in-flight` its share, static membership
by `--instance-id`) on `PARTITIONS` partitions replicated 3 ways. Each episode's first prompt is
`PROMPT_TOKENS` tokens, each turn adds `COMPLETION_TOKENS` sampled and `OBSERVATION_TOKENS` of
tool output, so the context grows to about 32k tokens. Inference is `SERVERS` simulated vLLM
servers in a child process (rollstream.dev.simulated: vLLM's HTTP contract, the whole prompt
sent and echoed every turn, continuous batching of `SERVER_SEQS` sequences whose decode step
takes longer as the batch fills, `decode_step_s`); each tool call waits a long-tailed time
(log-normal, median 1 s, capped at `TOOL_CAP_S`). INIT and EVAL are not in it: the episodes are
published to `episodes` and the run ends with every trajectory on `trajectories`.

When the `episode-state` offsets reach `KILL_AT` of all turns (commit markers take offsets
too), RUN process 0 (holding its quarter of the episodes,
about 2,500 in the full run) is SIGKILLed and started again at once with the same instance id,
as a supervisor does: the figure is the time from the kill until every episode it held has
resumed from its turn checkpoints (the "resuming <episode> at turn <n>" lines of the RUN logs).

Figures: episodes/s and turns/s over the run and between 10% and 90% of the trajectories (the
episodes start together, so that window is their final burst), RUN's CPU per turn
(user + system of every RUN process, the killed one's up to its kill), checkpoint bytes per turn
(the `episode-state` topic's log segments on the brokers, one replica's worth, tombstones
included) against the trajectory bytes per turn (the `trajectories` topic's, the same way:
what the turn adds to the trajectory), the bytes the brokers took in and sent out on their
listeners per turn (every TCP connection on a broker's ports, sampled with `ss`: produce,
fetch and replication), the decode batch's fill, and exactness: every trajectory once, and the
resumed episodes' trajectories holding each turn once. `rollstream plan` sizes RUN with its CPU
per turn (rollstream/deploy/plan.py).

`python -m benchmarks at_scale` (an hour and a half on 2 cores; ROLLSTREAM_AT_SCALE_EPISODES and
ROLLSTREAM_AT_SCALE_TURNS change the size); `--quick`: 400 episodes of 10 turns, 2 processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import re
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from unittest import mock

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from benchmarks import print_table, script, write_result
from benchmarks.chaos import steady_rate, three_node_cluster
from benchmarks.environments import Turns
from benchmarks.scaling import GROUP_SIZE, Workers, _wait_assigned, publish, rss_mb
from producers.publish import validate_task
from rollstream.broker import cluster
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics
from rollstream.config import Settings, load
from rollstream.consume import heap
from rollstream.contracts.codec import codec, unpack_ids
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.envs import registry
from rollstream.envs.base import StepResult

NAME = "at_scale"
PARTITIONS = 16
SERVERS = 8
SERVER_SEQS = 256
COMPLETION_TOKENS = 300
OBSERVATION_TOKENS = 300
TOOL_MEDIAN_S = 1.0
TOOL_SIGMA = 1.0  # log-normal: mean 1.65 s, p99 10 s
TOOL_CAP_S = 60.0
KILL_AT = 0.4
TARGET_CHECKPOINT_RATIO = 1.5  # checkpoint bytes per turn over the trajectory's


@dataclass(frozen=True)
class Size:
    episodes: int
    turns: int
    processes: int
    prompt_tokens: int

    @property
    def total_turns(self) -> int:
        return self.episodes * self.turns


FULL = Size(episodes=10_000, turns=50, processes=4, prompt_tokens=2_000)
QUICK = Size(episodes=400, turns=10, processes=2, prompt_tokens=500)


def decode_step_s(running: int) -> float:
    """A decode step's time with `running` sequences: 12 ms alone, 22 ms with a full batch."""
    return 0.012 + 0.01 * running / SERVER_SEQS


def _text(rng: random.Random, n: int) -> str:
    """n printable characters (n tokens of the embedded byte tokenizer): as little redundancy
    for the codec as a real trajectory's token ids have, not a repeated string."""
    return bytes(rng.randrange(32, 127) for _ in range(n)).decode()


def completion(prompt_ids: list[int], body: dict[str, Any]) -> tuple[list[int], str]:
    """`max_tokens - 1` tokens, then the first stop token."""
    text = _text(random.Random(int(body.get("seed") or 0) * 65_537 + len(prompt_ids)),
                 int(body["max_tokens"]) - 1)
    return [*text.encode(), *(body.get("stop_token_ids") or [])[:1]], text


class LongTail(Turns):
    """`max_turns` turns, each tool call waiting a log-normal time; every episode scores 1."""

    name = "bench_long_tail"
    description = "benchmark: long episodes whose tool calls wait a long-tailed time"

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        turn = state["turn"] + 1
        wait = random.lognormvariate(0.0, TOOL_SIGMA) * TOOL_MEDIAN_S
        await asyncio.sleep(min(TOOL_CAP_S, wait))
        done = turn >= int(task["max_turns"])
        observation = None if done else _text(random.Random(), OBSERVATION_TOKENS)
        return StepResult(observation, done, None, {"turn": turn})


def worker(argv: list[str]) -> None:
    """One RUN process with the benchmark's environment registered."""
    from rollstream.cli.common import log_to_stderr
    from rollstream.runtime import StageRuntime
    from stages.run import RunStage

    parser = argparse.ArgumentParser()
    parser.add_argument("stage", choices=["run"])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--policy-url", required=True)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--max-in-flight", type=int, required=True)
    args = parser.parse_args(argv)
    log_to_stderr()
    servers = len(args.policy_url.split(","))
    settings = load(bootstrap_servers=args.bootstrap_servers, prefix=args.prefix,
                    policy_url=args.policy_url, instance_id=args.instance_id,
                    max_in_flight=args.max_in_flight, request_timeout_s=600.0,
                    # Every server's batch full with room to spare, over the RUN processes.
                    server_max_in_flight=max(SERVER_SEQS, 2 * args.max_in_flight // servers))
    with mock.patch.dict(registry._environments(), {LongTail.name: LongTail}):
        stage = RunStage(settings)
        heap.settle()  # as `rollstream stage run` does
        StageRuntime(stage, settings).run()


def servers(n: int) -> list[SimulatedServer]:
    return [SimulatedServer(script=completion, step_s=decode_step_s, max_num_seqs=SERVER_SEQS,
                            keep=False) for _ in range(n)]


def decoded(fleet: Fleet) -> float:
    """Sequence-seconds the fleet's servers decoded so far (read on their own loop)."""

    async def total() -> float:
        return sum(s.sequence_seconds() for s in fleet.servers)

    return fleet.call(total())


def serve(conn: Connection) -> None:
    """The child process: the simulated servers; answers `decoded` until told to stop."""
    heap.trim_every()  # thousands of requests' contexts come and go, as in RUN
    with Fleet(servers(SERVERS)) as fleet:
        conn.send(fleet.urls)
        while conn.recv() == "decoded":
            conn.send(decoded(fleet))


def tasks(size: Size, tag: str) -> list[dict]:
    prompt = _text(random.Random(0), size.prompt_tokens)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                "max_tokens": COMPLETION_TOKENS + 1}
    with mock.patch.dict(registry._environments(), {LongTail.name: LongTail}):
        return [validate_task({"task_id": f"{tag}-{i}", "env": LongTail.name, "prompt": prompt,
                               "group_size": GROUP_SIZE, "max_turns": size.turns,
                               "sampling": {**sampling, "seed": i}})
                for i in range(size.episodes // GROUP_SIZE)]


class BrokerTraffic:
    """Bytes the brokers received and sent on their ports, from every TCP connection's counters
    (`ss -tin`), sampled: a connection's last sample counts (one closed between samples loses
    at most its last interval)."""

    def __init__(self, ports: list[int]) -> None:
        self.filter = " or ".join(f"sport = :{p}" for p in ports)
        self.seen: dict[str, tuple[int, int]] = {}

    def sample(self) -> None:
        try:
            out = subprocess.run(["ss", "-tinH", "state", "established", f"( {self.filter} )"],
                                 capture_output=True, text=True, timeout=30).stdout
        except subprocess.TimeoutExpired:  # a machine short of memory: the next sample counts
            return
        # A connection's line ("local peer"), then its counters on the next one.
        for conn, info in re.findall(r"(\S+\s+\S+)\s*\n\s+(.*?bytes_acked:\d+.*)", out):
            sent = int(re.search(r"bytes_acked:(\d+)", info).group(1))  # type: ignore[union-attr]
            got = re.search(r"bytes_received:(\d+)", info)
            self.seen[conn] = (int(got.group(1)) if got else 0, sent)

    def totals(self) -> tuple[int, int]:
        return (sum(r for r, _ in self.seen.values()), sum(s for _, s in self.seen.values()))


def topic_bytes(topic: str) -> int:
    """One replica's worth of a topic's log segments: every node's, over the 3 replicas."""
    total = 0
    for node in cluster.running_nodes():
        for segment in (cluster.node_dir(node) / "data").glob(f"{topic}-*/*.log"):
            total += segment.stat().st_size
    return total // 3


class Memory:
    """Resident memory, sampled: the RUN processes' (each, and together) and the servers'
    process's peaks, and a progress line every `PRINT_S`."""

    PRINT_S = 30.0

    def __init__(self, workers: Workers, server_pid: int) -> None:
        self.workers, self.server_pid = workers, server_pid
        self.run_each = self.run_total = self.servers = 0.0
        self.started = self.printed = time.monotonic()

    def sample(self, turns: int) -> None:
        run, servers = self.workers.rss_mb(), rss_mb(self.server_pid)
        self.run_each = max(self.run_each, *run, 0.0)
        self.run_total = max(self.run_total, sum(run))
        self.servers = max(self.servers, servers)
        if time.monotonic() - self.printed >= self.PRINT_S:
            self.printed = time.monotonic()
            print(f"   {self.printed - self.started:5.0f} s: {turns:,} turns checkpointed; RUN "
                  f"{' '.join(f'{m:,.0f}' for m in run)} MB, servers {servers:,.0f} MB",
                  flush=True)

    def peaks(self) -> dict[str, float]:
        return {"run_process_mb": round(self.run_each), "run_processes_mb": round(self.run_total),
                "servers_mb": round(self.servers)}


@dataclass
class Kill:
    at: float  # wall clock, as the RUN logs' timestamps
    held: set[str]  # unfinished episodes on the killed process's partitions, as the reader saw
    offsets: dict[Path, int]  # where each RUN log stood at the kill


class Follower:
    """Reads `trajectories` (committed only) while the run goes on: when each episode's
    trajectory became readable, and which came twice."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        topic = settings.topics.trajectories
        self.reader = kafka.reader(settings, [TopicPartition(topic, p, 0)
                                              for p in range(PARTITIONS)])
        self.times: list[float] = []
        self.ids: Counter[str] = Counter()
        self.first: dict[str, float] = {}  # wall clock, when each trajectory became readable

    def poll(self, seconds: float) -> None:
        for msg in self.reader.consume(1000, timeout=seconds):
            if msg.error() is None and msg.value() is not None:
                episode = msg.key().decode()
                self.ids[episode] += 1
                self.times.append(time.monotonic())
                self.first.setdefault(episode, time.time())

    def checkpointed(self) -> int:
        """Records on `episode-state` so far: turn checkpoints (and, at the end, tombstones)."""
        topic = self.settings.topics.episode_state
        return sum(self.reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(PARTITIONS))

    def close(self) -> None:
        self.reader.close()


def _assigned(log: Path) -> list[int]:
    """The partitions a RUN process holds, from its log: assignments are incremental
    (cooperative-sticky), so every assigned, revoked and lost line counts."""
    held: set[int] = set()
    for change, parts in re.findall(r": (assigned|revoked|lost) \[([\d, ]*)\]", log.read_text()):
        numbers = {int(p) for p in parts.split(",") if p.strip()}
        held = held | numbers if change == "assigned" else held - numbers
    return sorted(held)


def _episodes_on(settings: Settings, partitions: list[int]) -> set[str]:
    topic = settings.topics.episodes
    return {msg.key().decode() for msg in kafka.read_partitions(
        settings, [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])}


def kill_one(workers: Workers, logs: list[Path], settings: Settings, follower: Follower) -> Kill:
    """SIGKILL RUN process 0 and start it again; the episodes it held that had not finished."""
    partitions = _assigned(logs[0])
    offsets = {log: log.stat().st_size for log in logs}
    at = time.time()
    logs.append(workers.kill_and_restart(0))
    offsets[logs[-1]] = 0
    return Kill(at, _episodes_on(settings, partitions) - set(follower.ids), offsets)


# An episode whose trajectory was committed just before the kill reaches the reader after it.
COMMITTED_BEFORE_S = 3.0


def resumes(kill: Kill, first: dict[str, float]) -> dict[str, Any]:
    """From the RUN logs since the kill: when the first and the last of the held episodes
    resumed from their checkpoints, and at which turns. Held episodes that were neither resumed
    nor replayed are those whose trajectory was committed before the kill (readable within
    COMMITTED_BEFORE_S of it)."""
    found: dict[str, tuple[float, int]] = {}
    line = re.compile(r"^(\S+ \S+) .*resuming (\S+) at turn (\d+)$", re.MULTILINE)
    for log, offset in kill.offsets.items():
        with open(log, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        for stamp, episode, turn in line.findall(text):
            when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found[episode] = (when - kill.at, int(turn))
    finished = {e for e in kill.held - set(found)
                if first.get(e, float("inf")) - kill.at < COMMITTED_BEFORE_S}
    held = kill.held - finished
    resumed = sorted(found[e] for e in held & set(found))
    turns = sorted(turn for _, turn in resumed)
    return {"episodes_held": len(held), "resumed": len(resumed),
            "not_resumed": len(held) - len(resumed),
            "first_resumed_s": round(resumed[0][0], 1) if resumed else None,
            "all_resumed_s": (round(resumed[-1][0], 1) if resumed and len(resumed) == len(held)
                              else None),
            "median_resumed_at_turn": turns[len(turns) // 2] if turns else None}


def every_turn_once(settings: Settings, ids: set[str], turns: int) -> dict[str, Any]:
    """Re-read the trajectories of `ids` (the resumed episodes): each holds turns 0..turns-1 once;
    and the context the last turn saw."""
    topic = settings.topics.trajectories
    checked, bad, context = 0, 0, 0
    for msg in kafka.read_partitions(settings, [TopicPartition(topic, p, OFFSET_BEGINNING)
                                                for p in range(PARTITIONS)], timeout_s=1800):
        if msg.value() is None or msg.key().decode() not in ids:
            continue
        trajectory = codec().decode_as("Trajectory", msg.value())
        checked += 1
        bad += [t["index"] for t in trajectory["turns"]] != list(range(turns))
        context = max(context, sum(len(unpack_ids(t["prompt_ids"]))
                                   + len(unpack_ids(t["completion_ids"]))
                                   for t in trajectory["turns"]))
    return {"checked": checked, "not_whole": bad, "context_tokens_at_end": context}


def measure(size: Size, workdir: Path, bootstrap: str, urls: list[str], server_pid: int,
            sequence_s: Callable[[], float], timeout_s: float) -> dict[str, Any]:
    """The run on the cluster at `bootstrap` with the servers at `urls` (served by process
    `server_pid`); `sequence_s()` is the sequence-seconds they decoded so far (`decoded`)."""
    settings = load(bootstrap_servers=bootstrap, prefix=f"big{uuid.uuid4().hex[:8]}",
                    partitions=PARTITIONS)
    create_topics(bootstrap, settings.prefix, PARTITIONS, replication_factor=3)
    workers = Workers(settings, ",".join(urls), workdir / "logs", module="benchmarks.at_scale")
    # Room for a process whose partitions hash more than its share (each holds its all).
    per_process = -(-size.episodes * 6 // (5 * size.processes))
    ports = [n["port"] for n in cluster.state()["nodes"]]  # type: ignore[index]
    traffic = BrokerTraffic(ports)
    follower = Follower(settings)
    memory = Memory(workers, server_pid)
    kill: Kill | None = None
    try:
        logs = [workers.start("run", "--instance-id", f"run-{i}",
                              "--max-in-flight", str(per_process))
                for i in range(size.processes)]
        _wait_assigned(logs)
        traffic.sample()
        before = traffic.totals()
        cpu0, started, decoded0 = workers.cpu_s(), time.monotonic(), sequence_s()
        publish(settings, tasks(size, settings.prefix))
        deadline, next_sample = started + timeout_s, 0.0
        while len(follower.ids) < size.episodes and time.monotonic() < deadline:
            follower.poll(1.0)
            if time.monotonic() >= next_sample:
                traffic.sample()
                next_sample = time.monotonic() + 2
                checkpointed = follower.checkpointed()
                memory.sample(checkpointed)
                if kill is None and checkpointed >= KILL_AT * size.total_turns:
                    kill = kill_one(workers, logs, settings, follower)
                    print(f"   killed RUN 0 holding {len(kill.held)} episodes", flush=True)
        traffic.sample()
        elapsed, cpu = time.monotonic() - started, workers.cpu_s() - cpu0
        batch = (sequence_s() - decoded0) / (len(urls) * SERVER_SEQS * elapsed)
    finally:
        workers.stop()
        follower.close()
    got, sent = (now - then for now, then in zip(traffic.totals(), before, strict=True))
    turns = size.turns * len(follower.ids)  # the turns the trajectories hold
    checkpoint = topic_bytes(settings.topics.episode_state)
    trajectory = topic_bytes(settings.topics.trajectories)
    resumed = (every_turn_once(settings, kill.held, size.turns) if kill else {"checked": 0})
    rate = steady_rate(follower.times)
    return {
        "episodes": size.episodes, "trajectories": len(follower.ids),
        "duplicated": sum(1 for n in follower.ids.values() if n > 1),
        "lost": size.episodes - len(follower.ids),
        "elapsed_s": round(elapsed, 1),
        # Episodes that start together end together: the 10-90% window is the final burst.
        "episodes_per_s": round(rate, 2) if rate else None,
        "turns_per_s": round(rate * size.turns, 1) if rate else None,
        "episodes_per_s_overall": round(len(follower.ids) / elapsed, 2),
        "turns_per_s_overall": round(turns / elapsed, 1),
        "run_cpu_s": round(cpu, 1),
        "run_cpu_ms_per_turn": round(1000 * cpu / max(turns, 1), 3),
        "checkpoint_bytes_per_turn": round(checkpoint / max(turns, 1)),
        "trajectory_bytes_per_turn": round(trajectory / max(turns, 1)),
        "checkpoint_over_trajectory": round(checkpoint / trajectory, 3) if trajectory else None,
        "broker_bytes_in_per_turn": round(got / max(turns, 1)),
        "broker_bytes_out_per_turn": round(sent / max(turns, 1)),
        "decode_batch": round(batch, 3),
        "peak_rss": memory.peaks(),
        "kill": None if kill is None else resumes(kill, follower.first),
        "resumed_trajectories": resumed,
    }


def _size(quick: bool) -> Size:
    size = QUICK if quick else FULL
    env = os.environ.get
    return replace(size, episodes=int(env("ROLLSTREAM_AT_SCALE_EPISODES", size.episodes)),
                   turns=int(env("ROLLSTREAM_AT_SCALE_TURNS", size.turns)))


def run(quick: bool = False, timeout_s: float = 4 * 3600) -> dict[str, Any]:
    size = _size(quick)
    parent, child = multiprocessing.Pipe()
    fleet = multiprocessing.get_context("spawn").Process(target=serve, args=(child,), daemon=True)
    fleet.start()

    def sequence_s() -> float:
        parent.send("decoded")
        return parent.recv()

    try:
        urls = parent.recv()
        # ROLLSTREAM_AT_SCALE_WORKDIR keeps the RUN logs (and the cluster's) for a post-mortem.
        keep = os.environ.get("ROLLSTREAM_AT_SCALE_WORKDIR")
        with (contextlib.nullcontext(keep) if keep
              else tempfile.TemporaryDirectory(prefix="rollstream-at-scale-") as tmp,
              three_node_cluster(Path(tmp) / "home") as bootstrap):
            result = measure(size, Path(tmp), bootstrap, urls, fleet.pid, sequence_s,
                             timeout_s)
    finally:
        with contextlib.suppress(OSError):
            parent.send("stop")
        fleet.join(30)
        if fleet.is_alive():
            fleet.kill()
    ratio = result["checkpoint_over_trajectory"]
    kill = result["kill"] or {}
    exact = (result["lost"] == 0 and result["duplicated"] == 0
             and result["resumed_trajectories"].get("not_whole") == 0
             and kill.get("all_resumed_s") is not None)
    print_table(f"{size.episodes:,} episodes of {size.turns} turns on {size.processes} RUN "
                "processes", ["figure", "value"], [
                    [k, v] for k, v in result.items() if not isinstance(v, dict)])
    print(f"   kill: {kill}\n   resumed: {result['resumed_trajectories']}")
    doc = {"quick": quick, "setup": {
        **asdict(size), "partitions": PARTITIONS, "replication_factor": 3, "servers": SERVERS,
        "server_max_num_seqs": SERVER_SEQS, "completion_tokens": COMPLETION_TOKENS,
        "observation_tokens": OBSERVATION_TOKENS, "tool_s": f"log-normal, median "
        f"{TOOL_MEDIAN_S}, sigma {TOOL_SIGMA}, at most {TOOL_CAP_S}",
        "decode_step_s": "0.012 + 0.01 x running / max_num_seqs", "kill_at_turns": KILL_AT},
        "results": result,
        "target": {"description": "every episode once, the killed process's episodes resumed "
                                  "whole; checkpoint bytes per turn <= "
                                  f"{TARGET_CHECKPOINT_RATIO}x the trajectory's",
                   "met": bool(exact and ratio is not None
                               and ratio <= TARGET_CHECKPOINT_RATIO)}}
    write_result(NAME, doc)
    return doc


if __name__ == "__main__":
    script(run, worker)
