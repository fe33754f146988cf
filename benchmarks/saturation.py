"""Keeping GPU servers saturated: RUN's asynchronous episodes against the synchronous batch loop
(generate all, then step all) that most RL stacks run, in the same run, against the same servers.

The servers are simulated (rollstream.dev.simulated): vLLM's HTTP contract with a GPU's cost
model, continuous batching of at most `max_num_seqs` requests, each decode step taking
`STEP_S + STEP_PER_SEQ_S * running` (latency grows with concurrency; throughput saturates).
Completions are 8-48 tokens, tool calls (the environment step) 100-500 ms, 4 turns an episode,
all drawn from fixed seeds, so both designs get the same work.

- rollstream: RunStage.handle on every episode, `IN_FLIGHT` at a time (the runtime's
  max_in_flight), through the router: each episode moves on as soon as its own turn is back.
- sync: batches of `IN_FLIGHT` episodes, RUN's own concurrency (a smaller batch would leave the
  servers idle for want of requests, not for the loop's design); each turn every episode's
  request is sent at once (round-robin over servers; the servers queue what is past their
  `max_num_seqs`), the batch waits for the slowest, then every environment steps at once and the
  batch waits for the slowest again.

Utilization: the fraction of time a server had `max_num_seqs` requests decoding (a full batch:
the GPU doing all it can), averaged over servers. For rollstream it is measured while episodes
were still waiting to start (a stream's steady state; the drain at the end is reported apart);
every sync batch is alike, so its whole run is its steady state.

Real vLLM beside it (when `make vllm-deps` has installed vLLM's CPU build): the same two designs
against one real server (the tiny local model, rollstream.dev.tiny_model, `--max-num-seqs`
REAL_MAX_NUM_SEQS) on this machine's CPUs. Its utilization is the fraction of /metrics polls
(every POLL_S) at which `vllm:num_requests_running` was REAL_MAX_NUM_SEQS. Completions run to
max_tokens or the model's own end token, so their lengths are the model's, the same for both.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

from benchmarks import print_table, write_result
from benchmarks.environments import Turns
from rollstream.config import Settings
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.envs import registry
from rollstream.envs.base import StepResult
from rollstream.inference.client import InferenceClient
from rollstream.runtime import EventContext
from stages.run import RunStage

NAME = "saturation"
SERVERS = 2
MAX_NUM_SEQS = 32
STEP_S = 0.008
STEP_PER_SEQ_S = 0.0004
TOKENS = (8, 48)
TOOL_S = (0.1, 0.5)
TURNS = 4
IN_FLIGHT = 192
TARGET_UTILIZATION = 0.9
REAL_MAX_NUM_SEQS = 16  # two CPU cores
REAL_IN_FLIGHT = 2 * REAL_MAX_NUM_SEQS
POLL_S = 0.1


def completion_length(prompt_ids: list[int], seed: int) -> int:
    return random.Random(f"{len(prompt_ids)}/{seed}").randint(*TOKENS)


def script(prompt_ids: list[int], body: dict[str, Any]) -> tuple[list[int], str]:
    n = completion_length(prompt_ids, int(body.get("seed") or 0))
    return [ord("a")] * (n - 1) + list(body["stop_token_ids"][:1]), "a" * (n - 1)


def tool_seconds(task: dict, turn: int) -> float:
    return random.Random(f"{task['task_id']}/{turn}").uniform(*TOOL_S)


class ToolCalls(Turns):
    """A fixed number of turns, each answered after a tool call's latency."""

    name = "bench_tool_calls"
    description = "benchmark: TURNS turns, each a tool call of 100-500 ms"

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        await asyncio.sleep(tool_seconds(task, state["turn"]))
        turn = state["turn"] + 1
        return StepResult("ok", turn >= TURNS, None, {"turn": turn})


def episodes(n: int) -> list[dict]:
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": TOKENS[1] + 1,
                "seed": 0}
    tasks = [{"task_id": f"b{i}", "env": ToolCalls.name, "prompt": f"task {i}", "data": "{}",
              "group_size": 1, "max_turns": TURNS, "sampling": {**sampling, "seed": i},
              "metadata": {}, "created_at_ms": 0} for i in range(n)]
    return [{"episode_id": f"{t['task_id']}#0", "task": t, "sample_index": 0,
             "created_at_ms": 0} for t in tasks]


class Utilization:
    """Full-batch time of the fleet's servers between `start()` and `stop()`."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def _busy(self) -> list[float]:
        return [s.busy_time(MAX_NUM_SEQS) for s in self.fleet.servers]

    def start(self) -> None:
        self._t0, self._b0 = time.perf_counter(), self._busy()

    def stop(self) -> float:
        elapsed = time.perf_counter() - self._t0
        busy = [b - b0 for b, b0 in zip(self._busy(), self._b0, strict=True)]
        return sum(busy) / len(busy) / elapsed


class PolledUtilization:
    """Full-batch time of real servers: the share of /metrics polls between `start()` and
    `stop()` at which every server had REAL_MAX_NUM_SEQS requests running."""

    samples: list[tuple[float, bool]] = []

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        window = [full for t, full in self.samples if t >= self._t0]
        return sum(window) / len(window) if window else 0.0

    @classmethod
    async def poll(cls, clients: list[InferenceClient]) -> None:
        while True:
            loads = await asyncio.gather(*(c.load() for c in clients))
            cls.samples.append((time.perf_counter(), all(
                load.get("running", 0) >= REAL_MAX_NUM_SEQS for load in loads)))
            await asyncio.sleep(POLL_S)


@dataclass
class Target:
    """The servers a design runs against, and how it reads their utilization."""

    urls: list[str]
    utilization: Callable[[], Any]
    in_flight: int  # RUN's episodes in flight, and the synchronous loop's batch
    tokenizer_path: str = ""  # a real model's: RUN renders its template
    stop_ids: tuple[int, ...] = (0,)
    # The synchronous loop's first prompt (RUN renders its own template's).
    first_prompt: Callable[[str], list[int]] = lambda text: [ord(c) for c in text]


async def run_rollstream(target: Target, work: list[dict]) -> dict[str, Any]:
    settings = Settings().override(policy_url=",".join(target.urls), health_interval_s=0.5,
                                   server_max_in_flight=target.in_flight, request_timeout_s=600.0,
                                   tokenizer_path=target.tokenizer_path)
    stage = RunStage(settings)
    await stage.start()
    limit = asyncio.Semaphore(target.in_flight)
    steady, whole = target.utilization(), target.utilization()
    admitted = 0
    steady_value: float | None = None

    async def one(episode: dict) -> None:
        nonlocal admitted, steady_value
        async with limit:
            admitted += 1
            if admitted == target.in_flight:
                steady.start()  # the servers have all the work a stream would give them
            if admitted == len(work):
                steady_value = steady.stop()
            await stage.handle(episode, EventContext(0, 0, lambda out: None))

    whole.start()
    started = time.perf_counter()
    await asyncio.gather(*(one(e) for e in work))
    elapsed = time.perf_counter() - started
    assert stage.router is not None
    result = {"episodes": len(work), "elapsed_s": round(elapsed, 3),
              "episodes_per_s": round(len(work) / elapsed, 3),
              "utilization": round(steady_value or 0.0, 4),
              "utilization_with_ramp_and_drain": round(whole.stop(), 4),
              "migrations": stage.router.migrations}
    await stage.close()
    return result


async def run_sync(target: Target, work: list[dict]) -> dict[str, Any]:
    clients = [InferenceClient(url, timeout_s=600) for url in target.urls]
    env = ToolCalls()
    batch_size = target.in_flight  # equal concurrency
    util = target.utilization()
    util.start()
    started = time.perf_counter()
    for at in range(0, len(work), batch_size):
        batch = work[at:at + batch_size]
        contexts = [target.first_prompt(e["task"]["prompt"]) for e in batch]
        states = [await env.reset(e["task"]) for e in batch]
        for turn in range(TURNS):
            done = await asyncio.gather(*(
                clients[i % len(clients)].complete(
                    ctx, {**e["task"]["sampling"], "seed": e["task"]["sampling"]["seed"] + turn},
                    target.stop_ids)
                for i, (e, ctx) in enumerate(zip(batch, contexts, strict=True))))
            steps = await asyncio.gather(*(
                env.step(e["task"], s, c.text) for e, s, c in zip(batch, states, done,
                                                                  strict=True)))
            for i, (c, step) in enumerate(zip(done, steps, strict=True)):
                contexts[i] += c.token_ids + [ord(ch) for ch in step.observation or ""]
                states[i] = step.state
    elapsed = time.perf_counter() - started
    utilization = util.stop()
    for client in clients:
        await client.close()
    return {"episodes": len(work), "elapsed_s": round(elapsed, 3),
            "episodes_per_s": round(len(work) / elapsed, 3),
            "utilization": round(utilization, 4), "batch_size": batch_size}


def measure(design: str, n: int) -> dict[str, Any]:
    servers = [SimulatedServer(script=script, max_num_seqs=MAX_NUM_SEQS,
                               step_s=lambda running: STEP_S + STEP_PER_SEQ_S * running)
               for _ in range(SERVERS)]
    with Fleet(servers) as fleet:
        runner = run_rollstream if design == "rollstream" else run_sync
        target = Target(fleet.urls, lambda: Utilization(fleet), IN_FLIGHT)
        return asyncio.run(runner(target, episodes(n)))


def measure_real(n: int) -> dict[str, Any] | str:
    """Both designs on one real vLLM server, or why it cannot run here."""
    from rollstream.broker.local import project_root
    from rollstream.dev import tiny_model, vllm_launch
    from rollstream.dev.processes import ProcessGroup, free_port, wait_http
    from rollstream.inference.hf_template import HFChatTemplate

    root = project_root()
    if not (vllm_launch.venv(root) / ".installed").is_file():
        return "vLLM's CPU build is not installed (`make vllm-deps`)"
    model = tiny_model.build(root / ".rollstream" / "tiny-model").model
    port = free_port()
    procs = ProcessGroup(root / ".rollstream" / "bench-logs")
    argv, env = vllm_launch.serve_command(root, model, port, "--max-num-seqs",
                                          str(REAL_MAX_NUM_SEQS))
    server = procs.start_program("vllm", argv, env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=300, proc=server)
        template = HFChatTemplate(model)
        target = Target([url], PolledUtilization, REAL_IN_FLIGHT, str(model),
                        tuple(template.stop_token_ids), template.first_prompt)

        async def both() -> dict[str, Any]:
            clients = [InferenceClient(url)]
            poller = asyncio.create_task(PolledUtilization.poll(clients))
            try:
                return {"rollstream": await run_rollstream(target, episodes(n)),
                        "sync": await run_sync(target, episodes(n))}
            finally:
                poller.cancel()
                await clients[0].close()

        return asyncio.run(both())
    finally:
        procs.stop_all()


def run(quick: bool = False) -> dict[str, Any]:
    n = 256 if quick else 768
    # The benchmark's environment, visible to RunStage's registry lookup for this run only.
    with mock.patch.dict(registry._environments(), {ToolCalls.name: ToolCalls}):
        results = {design: measure(design, n) for design in ("rollstream", "sync")}
        real = measure_real(32 if quick else 96)
    ours, sync = results["rollstream"], results["sync"]
    ratio = round(ours["episodes_per_s"] / sync["episodes_per_s"], 3)
    met = ours["utilization"] >= TARGET_UTILIZATION
    print_table(f"saturation ({n} episodes, {SERVERS} servers x {MAX_NUM_SEQS} seqs)",
                ["design", "episodes/s", "utilization", "elapsed s"],
                [[d, r["episodes_per_s"], r["utilization"], r["elapsed_s"]]
                 for d, r in results.items()])
    print(f"   rollstream / sync episode throughput: {ratio}x")
    if isinstance(real, str):
        print(f"   real vLLM: skipped, {real}")
    else:
        print_table(f"saturation on real vLLM (CPU build, 1 server x {REAL_MAX_NUM_SEQS} seqs)",
                    ["design", "episodes/s", "utilization", "elapsed s"],
                    [[d, r["episodes_per_s"], r["utilization"], r["elapsed_s"]]
                     for d, r in real.items()])
    doc = {
        "quick": quick,
        "parameters": {
            "servers": SERVERS, "max_num_seqs": MAX_NUM_SEQS,
            "step_s": f"{STEP_S} + {STEP_PER_SEQ_S} * running",
            "completion_tokens": list(TOKENS), "tool_call_s": list(TOOL_S), "turns": TURNS,
            "episodes": n, "rollstream_in_flight": IN_FLIGHT, "sync_batch": IN_FLIGHT,
            "utilization": f"fraction of time with {MAX_NUM_SEQS} requests decoding, mean over "
                           "servers; rollstream: while episodes still waited to start",
        },
        "results": results,
        "real_vllm": real if isinstance(real, str) else {
            "server": f"vLLM's CPU build, the tiny local model, --max-num-seqs "
                      f"{REAL_MAX_NUM_SEQS}, rollstream in flight {REAL_IN_FLIGHT}",
            "utilization": f"share of /metrics polls every {POLL_S} s with "
                           f"{REAL_MAX_NUM_SEQS} requests running",
            "results": real,
            "ratio": round(real["rollstream"]["episodes_per_s"]
                           / real["sync"]["episodes_per_s"], 3)},
        "baseline": {"sync_episodes_per_s": sync["episodes_per_s"],
                     "sync_utilization": sync["utilization"]},
        "ratio": ratio,
        "ratio_meaning": "rollstream episodes/s over the synchronous batch loop's at the same "
                         "concurrency (higher: rollstream faster)",
        "target": {"description": f"rollstream server utilization >= {TARGET_UTILIZATION}",
                   "measured": ours["utilization"], "met": met},
    }
    write_result(NAME, doc)
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
