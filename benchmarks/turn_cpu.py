"""RUN's CPU per agent turn: what one RUN process spends on each turn of `EPISODES` concurrent
episodes, against an inference server that answers at once, with one job's adapter and with
`JOBS_MANY` jobs' adapters on the same server; and of each of `MANY` x `EPISODES` concurrent
episodes with one job, to show how the cost per turn follows the episodes in flight.

The server (rollstream.dev.simulated, decode steps of no duration, every job's adapters listed)
runs in a child process, so the CPU measured (`time.process_time()` of this process, all its
threads) is RUN's alone: the router and HTTP client, the chat template's prompt, the
environment's step, the Turn record, and each checkpoint and trajectory encoded with the real
codec (what the runtime hands Kafka; the broker round trip itself is the passthrough
benchmark's). Jobs are run the way a shared fleet runs them: one RunStage, with its own router
and adapter, per job, all in one process and one event loop; the episodes are split evenly.
Every turn is checked to name its own job's adapter. The garbage collector is set as a RUN
process sets it before it serves (rollstream.consume.heap).

Each layout plays rounds of `EPISODES` on the same stages: `cold`, the first, opens every
connection to the server (each router has its own pool), and `steady`, the median of the
`STEADY_ROUNDS` after it by CPU per turn, reuses them, as a long-running RUN process does (one
round's figure moved by up to 1.3x from run to run on the same code; every round's is kept).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from multiprocessing.connection import Connection
from typing import Any
from unittest import mock

from benchmarks import print_table, write_result
from benchmarks.environments import Turns
from rollstream.config import Settings
from rollstream.consume import heap
from rollstream.consume.records import Output
from rollstream.contracts.codec import codec
from rollstream.contracts.wire import lora_name
from rollstream.dev.simulated import SimulatedServer
from rollstream.envs import registry
from rollstream.envs.base import StepResult
from rollstream.runtime import EventContext
from stages.run import RunStage

NAME = "turn_cpu"
EPISODES = 1000
MANY = (4, 10)  # the layouts with MANY x EPISODES episodes in flight (one job)
TURNS = 4
JOBS_MANY = 8
STEADY_ROUNDS = 3
TARGET_MS = 1.0  # CPU per turn, every layout
TARGET_AT_4K_MS = 0.5  # CPU per turn with 4,000 episodes in flight, steady
TARGET_GROWTH = 1.2  # at 10,000 episodes over at 4,000


class Instant(Turns):
    """`TURNS` turns, each answered at once: the environment costs (almost) nothing."""

    name = "bench_instant"
    description = "benchmark: TURNS turns, each answered at once"

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        turn = state["turn"] + 1
        return StepResult("ok", turn >= TURNS, None, {"turn": turn})


def job(index: int) -> str:
    return f"job-{index}"


def serve(conn: Connection) -> None:
    """The child process: a server listing every job's adapter, answering at once."""

    async def main() -> None:
        adapters = [lora_name(1, job(j)) for j in range(JOBS_MANY)]
        server = SimulatedServer(version=None, adapters=adapters, max_num_seqs=1 << 20)
        conn.send(await server.start())
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
        await server.stop()

    asyncio.run(main())


def episodes(n: int, round_: int) -> list[dict]:
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 8, "seed": 0}
    return [{"episode_id": f"c{round_}-{i}#0", "sample_index": 0, "created_at_ms": 0,
             "task": {"task_id": f"c{round_}-{i}", "env": Instant.name, "prompt": f"task {i}",
                      "data": "{}", "group_size": 1, "max_turns": TURNS,
                      "sampling": {**sampling, "seed": i}, "metadata": {},
                      "created_at_ms": 0}} for i in range(n)]


async def measure(url: str, jobs: int, n: int) -> dict[str, Any]:
    stages = [RunStage(Settings().override(policy_url=url, adapter=job(j), server_max_in_flight=n,
                                           request_timeout_s=600.0)) for j in range(jobs)]
    for stage in stages:
        await stage.start()
    try:
        cold, *steadies = [await play_round(stages, episodes(n, r))
                           for r in range(1 + STEADY_ROUNDS)]
    finally:
        for stage in stages:
            await stage.close()
    steadies.sort(key=lambda r: r["cpu_ms_per_turn"])
    steady = {**steadies[len(steadies) // 2],
              "cpu_ms_per_turn_rounds": [r["cpu_ms_per_turn"] for r in steadies]}
    return {"jobs": jobs, "episodes": n, "cold": cold, "steady": steady}


async def play_round(stages: list[RunStage], work: list[dict]) -> dict[str, Any]:
    """Every episode of `work` at once, split over the jobs' stages: RUN's CPU per turn."""
    jobs = len(stages)
    encode = codec().encode

    def emit(output: Output) -> None:
        if output.record is not None:
            encode(output.record, output.value)  # what the runtime does before producing

    cpu, started = time.process_time(), time.perf_counter()
    outputs = await asyncio.gather(*(
        stages[i % jobs].handle(e, EventContext(0, i, emit)) for i, e in enumerate(work)))
    for episode_outputs in outputs:  # the checkpoints' tombstones, then the trajectory
        for output in episode_outputs:
            emit(output)
    cpu, elapsed = time.process_time() - cpu, time.perf_counter() - started
    turns = 0
    for i, [*_, output] in enumerate(outputs):
        assert isinstance(output.value, dict)
        named = {t["adapter"] for t in output.value["turns"]}
        assert named == {lora_name(1, job(i % jobs))}, named  # never another job's adapter
        turns += len(output.value["turns"])
    return {"turns": turns, "elapsed_s": round(elapsed, 3), "cpu_s": round(cpu, 3),
            "cpu_ms_per_turn": round(cpu / turns * 1000, 4),
            "turns_per_s": round(turns / elapsed, 1)}


def run(quick: bool = False) -> dict[str, Any]:
    n = 200 if quick else EPISODES
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(child,),
                                                          daemon=True)
    server.start()
    try:
        url = parent.recv()
        with mock.patch.dict(registry._environments(), {Instant.name: Instant}):
            asyncio.run(measure(url, 1, min(n, 100)))  # warm-up: imports, caches
            # The baseline: the largest-but-one layout with CPython's own collector settings.
            unsettled = asyncio.run(measure(url, 1, MANY[0] * n))
            heap.settle()  # as a RUN process does before it serves
            layouts = [(1, n), *((1, k * n) for k in MANY), (JOBS_MANY, n)]
            rows = [asyncio.run(measure(url, jobs, episodes)) for jobs, episodes in layouts]
    finally:
        parent.send("stop")
        server.join(10)
    worst = max(r[phase]["cpu_ms_per_turn"] for r in rows for phase in ("cold", "steady"))
    print_table(f"RUN's CPU per turn, concurrent episodes of {TURNS} turns",
                ["jobs", "episodes", "round", "turns", "CPU s", "CPU ms/turn", "turns/s"],
                [[r["jobs"], r["episodes"], phase, r[phase]["turns"], r[phase]["cpu_s"],
                  r[phase]["cpu_ms_per_turn"], r[phase]["turns_per_s"]]
                 for r in rows for phase in ("cold", "steady")])
    steady = {r["episodes"]: r["steady"]["cpu_ms_per_turn"] for r in rows if r["jobs"] == 1}
    sizes = [n, *(k * n for k in MANY)]
    # How the cost per turn grows with the episodes in flight: each size over each smaller one.
    growth = {f"{big}/{small}": round(steady[big] / steady[small], 3)
              for i, big in enumerate(sizes) for small in sizes[:i]}
    for pair, ratio in growth.items():
        print(f"   one job, steady: CPU per turn at {pair} episodes: {ratio}x")
    at_4k, largest = steady[MANY[0] * n], sizes[-1]
    baseline = unsettled["steady"]["cpu_ms_per_turn"]
    print(f"   one job, steady, {sizes[1]} episodes: CPython's default collector {baseline} ms "
          f"per turn, settled {at_4k}: x{round(baseline / at_4k, 3)}")
    doc = {
        "quick": quick,
        "setup": {"episodes_in_flight": sizes, "turns_per_episode": TURNS,
                  "server": "simulated, in a child process, answering at once",
                  "jobs": "one RunStage (router + adapter) per job in one process"},
        "results": rows,
        "steady_cpu_per_turn_growth": growth,
        "default_collector": {
            "description": f"steady, one job, {sizes[1]} episodes, measured first, with "
                           "CPython's default garbage collector settings (the rows: as "
                           "rollstream.consume.heap sets them)",
            "steady": unsettled["steady"],
            "over_settled": round(baseline / at_4k, 3)},
        "target": {"description": f"RUN's CPU per turn <= {TARGET_MS} ms with 1 and "
                                  f"{JOBS_MANY} jobs, cold and steady",
                   "met": worst <= TARGET_MS,
                   "worst_cpu_ms_per_turn": worst},
        "target_scale": {
            "description": f"steady, one job: <= {TARGET_AT_4K_MS} ms per turn at {sizes[1]} "
                           f"episodes, and at {largest} within {TARGET_GROWTH}x of that",
            "met": at_4k <= TARGET_AT_4K_MS
            and steady[largest] <= TARGET_GROWTH * at_4k,
            "cpu_ms_per_turn": {sizes[1]: at_4k, largest: steady[largest]}},
    }
    write_result(NAME, doc)
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
