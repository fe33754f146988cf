"""What RUN's recording gateway adds to one LLM call of a harness: the latency of a chat
completion through the gateway vs the same prompt sent straight to the inference server.

Both paths hit the same server (the scripted policy, vLLM's contract, on its own event loop in
a thread) and are timed in the same run, interleaved call by call:

- ``gateway``: an aiohttp client POSTs /v1/chat/completions with the whole conversation so far
  (system, task, then each assistant message with its tool call and the tool's answer), as a
  harness does. The gateway renders it with the chat template, continues the episode's sample,
  routes through RUN's router and retry loop, records the Turn and checkpoints the trajectory
  (encoded with the Avro codec, as the runtime does when a checkpoint is emitted).
- ``direct``: the same token ids the gateway sent, to the server's /v1/completions through
  RUN's InferenceClient (what RUN's own loop does per turn, without the gateway).

overhead = gateway median - direct median (p50), target < 5 ms per call.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from benchmarks import percentiles_ms, print_table, write_result
from rollstream.config import Settings
from rollstream.contracts.codec import codec, unpack_ids
from rollstream.contracts.tool_calls import ToolCall, hermes
from rollstream.dev.background import BackgroundServer
from rollstream.dev.scripted import Script, create_app
from rollstream.inference.client import InferenceClient
from rollstream.runtime import EventContext, Output
from stages.run import RunStage

NAME = "gateway"
TARGET_MS = 5.0
TURNS = 8
TASK = "Fix the bug in wrap(): the last line of text is lost."
ANSWER = "THOUGHT: look at the file.\n" + hermes(ToolCall("bash", {"command": "cat wordwrap.py"}))
TOOL_OUTPUT = "<returncode>0</returncode>\n<output>\n" + "def wrap(text, width):\n" * 20 + \
    "</output>"


def _task() -> dict[str, Any]:
    return {"task_id": "bench", "env": "harness", "prompt": "", "data": "{}",
            "max_turns": TURNS, "group_size": 1,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 256,
                         "seed": None}}


async def _measure(url: str, episodes: int) -> dict[str, list[int]]:
    stage = RunStage(Settings().override(policy_url=url))
    await stage.start()
    gateway = stage.gateway
    await gateway.start()
    direct = InferenceClient(url)
    stops = stage.template.stop_token_ids
    samples: dict[str, list[int]] = {"gateway": [], "direct": []}

    def emit(out: Output) -> None:  # what the runtime does with a checkpoint
        codec().encode(out.record, out.value)

    try:
        async with aiohttp.ClientSession() as http:
            for e in range(episodes + 1):  # the first episode warms up
                trajectory = {"episode_id": f"b#{e}", "task": _task(), "sample_index": 0,
                              "turns": [], "termination": "RUNNING", "termination_detail": "",
                              "env_state": "{}", "started_at_ms": 0, "finished_at_ms": 0}
                stage.router.pin(trajectory["episode_id"])
                episode = gateway.open(trajectory, EventContext(0, 0, emit), None,  # type: ignore[arg-type]
                                       {}, None)
                headers = {"Authorization": f"Bearer {episode.key}"}
                messages: list[dict[str, Any]] = [{"role": "system", "content": "An agent."},
                                                  {"role": "user", "content": TASK}]
                for _ in range(TURNS):
                    start = time.perf_counter_ns()
                    async with http.post(gateway.base_url + "/v1/chat/completions",
                                         json={"model": "m", "messages": messages},
                                         headers=headers) as r:
                        body = await r.json()
                    through_gateway = time.perf_counter_ns() - start
                    message = body["choices"][0]["message"]
                    turn = trajectory["turns"][-1]
                    ids = episode.sample[:len(episode.sample)
                                         - len(unpack_ids(turn["completion_ids"]))]
                    start = time.perf_counter_ns()
                    await direct.complete(ids, _task()["sampling"], stops)
                    straight = time.perf_counter_ns() - start
                    if e:
                        samples["gateway"].append(through_gateway)
                        samples["direct"].append(straight)
                    messages += [message, {"role": "tool", "content": TOOL_OUTPUT,
                                           "tool_call_id": message["tool_calls"][0]["id"]}]
                gateway.close_episode(episode)
                stage.router.release(trajectory["episode_id"])
    finally:
        await direct.close()
        await stage.close()
    return samples


def run(quick: bool = False) -> dict[str, Any]:
    episodes = 5 if quick else 40
    with BackgroundServer(app=create_app([Script("", [ANSWER] * TURNS)])) as url:
        raw = asyncio.run(_measure(url, episodes))
    stats = {name: percentiles_ms(values) for name, values in raw.items()}
    overhead = round(stats["gateway"]["median_ms"] - stats["direct"]["median_ms"], 4)
    doc = {
        "quick": quick,
        "parameters": {
            "episodes": episodes,
            "calls_per_episode": TURNS,
            "conversation": "system + task, then per call one assistant message with a bash "
                            "tool call and a ~500-byte tool answer (the request grows each call)",
            "template": "the embedded policy's (byte-level)",
            "server": "scripted policy over vLLM's HTTP contract, in a thread of this process",
            "timer": "time.perf_counter_ns around each awaited call, sequential, interleaved; "
                     "one warm-up episode discarded",
        },
        "results": stats,
        "baseline": stats["direct"],
        "overhead_p50_ms": overhead,
        "ratio": round(stats["gateway"]["median_ms"] / stats["direct"]["median_ms"], 2),
        "ratio_meaning": "gateway call median / direct server call median",
        "target": {
            "description": f"gateway overhead per call (p50) < {TARGET_MS:g} ms",
            "measured_median_ms": overhead,
            "met": overhead < TARGET_MS,
        },
    }
    path = write_result(NAME, doc)
    print_table("chat completion through the gateway vs the same prompt sent directly",
                ["path", "median ms", "p99 ms", "n"],
                [[name, s["median_ms"], s["p99_ms"], s["n"]] for name, s in stats.items()])
    print(f"  overhead p50: {overhead} ms (ratio {doc['ratio']}x); target < {TARGET_MS:g} ms: "
          f"{'met' if doc['target']['met'] else 'NOT met'}  -> {path}")
    return doc
