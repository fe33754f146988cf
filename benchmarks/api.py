"""What the HTTP API (`rollstream api`) adds to a task, and what one API process sustains.

On the real broker, one job's pipeline as processes (INIT, RUN, EVAL; the scripted policy
server; `--commit-interval-ms 100` everywhere) and one `rollstream api` process. Per task
(arithmetic, one sample, one turn), interleaved task by task after a warm-up:

- ``plain``: the task published in a Kafka transaction (a long-lived transactional producer,
  as `rollstream publish` sends), until its scored record is readable (read_committed);
- ``process``: ProRL Agent's `POST /process`, request to response;
- ``submit_poll``: Polar's submit, then `GET /rollout/task/ID` every POLL_S until completed.

overhead = path median - plain median; ratio = path median / plain median. Then one API process
under concurrent clients: submits accepted per second (each a committed task), polls answered
per second, and the tasks completed per second end to end (the pipeline's pace, informative).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import percentiles_ms, print_table, write_result
from producers.publish import validate_task
from rollstream import config
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.cluster.follower import Follower
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.contracts.codec import codec
from rollstream.contracts.events import TASK
from rollstream.dev.processes import ProcessGroup, free_port, wait_http
from rollstream.service import jobs

NAME = "api"
TARGET_MS = 100.0  # /process overhead per task, p50
POLL_S = 0.02
CONCURRENCY = 32


def _instance(i: int) -> dict[str, Any]:
    return {"env": "arithmetic", "prompt": f"{i % 7}+2=", "data": {"answer": str(i % 7 + 2)}}


def _polar(task_id: str, i: int) -> dict[str, Any]:
    instance = _instance(i)
    return {"task_id": task_id, "instruction": instance["prompt"], "num_samples": 1,
            "agent": {"harness": "rollstream", "settings": {"step_limit": 1}},
            "evaluator": {"strategy": "arithmetic", "config": instance["data"]}}


class ScoredClock:
    """When each scored record became readable (perf_counter_ns), read in a thread."""

    def __init__(self, settings: config.Settings) -> None:
        partitions = kafka.whole_topic(settings, settings.topics.scored)
        assert partitions is not None
        self.seen: dict[str, int] = {}
        self._follower = Follower(settings, partitions)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            # One at a time: consume() waits out its timeout unless `limit` records come.
            for msg in self._follower.poll(0.05, limit=1):
                self.seen.setdefault(msg.key().decode(), time.perf_counter_ns())

    def wait(self, key: str, timeout_s: float = 120) -> int:
        deadline = time.monotonic() + timeout_s
        while key not in self.seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{key} not scored in {timeout_s} s")
            time.sleep(0.001)
        return self.seen[key]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._follower.close()


async def _per_task(settings: config.Settings, url: str, token: str, tasks: int,
                    tag: str) -> dict[str, list[int]]:
    producer = kafka.transactional_producer(settings, f"{settings.prefix}.bench-{tag}")
    clock = ScoredClock(settings)
    samples: dict[str, list[int]] = {"plain": [], "process": [], "submit_poll": []}
    headers = {"Authorization": f"Bearer {token}"}

    async def plain(http: aiohttp.ClientSession, i: int) -> int:
        task = validate_task({"task_id": f"plain-{tag}-{i}", **_instance(i), "group_size": 1,
                              "max_turns": 1})
        value = codec().encode(TASK, {**task, "created_at_ms": int(time.time() * 1000)})
        start = time.perf_counter_ns()
        with kafka.transaction(producer):
            kafka.produce(producer, settings.topics.tasks, value, key=task["task_id"])
        return await asyncio.to_thread(clock.wait, f"{task['task_id']}#0") - start

    async def process(http: aiohttp.ClientSession, i: int) -> int:
        start = time.perf_counter_ns()
        async with http.post(url + "/process", json={
                "job_id": f"{tag}-{i}", "instance": {**_instance(i), "max_turns": 1},
                "sampling_params": {}}) as r:
            assert r.status == 200, await r.text()
            await r.json()
        return time.perf_counter_ns() - start

    async def submit_poll(http: aiohttp.ClientSession, i: int) -> int:
        start = time.perf_counter_ns()
        async with http.post(url + "/rollout/task/submit", json=_polar(f"{tag}-{i}", i)) as r:
            assert r.status == 200, await r.text()
        while True:
            async with http.get(f"{url}/rollout/task/{tag}-{i}") as r:
                if (await r.json())["status"] == "completed":
                    return time.perf_counter_ns() - start
            await asyncio.sleep(POLL_S)

    paths = [("plain", plain), ("process", process), ("submit_poll", submit_poll)]
    try:
        async with aiohttp.ClientSession(headers=headers) as http:
            for i in range(tasks + 2):  # the first two warm up
                # Each path first in turn: the stages commit every 100 ms, and where a task
                # falls in that cycle must not favour one path.
                for name, path in paths[i % 3:] + paths[:i % 3]:
                    took = await path(http, i)
                    if i >= 2:
                        samples[name].append(took)
    finally:
        clock.close()
    return samples


async def _load(url: str, token: str, tasks: int, polls: int, tag: str) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {token}"}
    limit = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(headers=headers) as http:
        async def submit(i: int) -> None:
            async with limit, http.post(url + "/rollout/task/submit",
                                        json=_polar(f"{tag}-{i}", i)) as r:
                assert r.status == 200, await r.text()

        async def status(i: int) -> str:
            async with limit, http.get(f"{url}/rollout/task/{tag}-{i}") as r:
                assert r.status == 200, await r.text()
                return (await r.json())["status"]

        start = time.perf_counter()
        await asyncio.gather(*(submit(i) for i in range(tasks)))
        submitted = time.perf_counter() - start
        pending = set(range(tasks))
        while pending:
            done = await asyncio.gather(*(status(i) for i in pending))
            pending = {i for i, s in zip(pending, done, strict=True) if s != "completed"}
            await asyncio.sleep(0.2)
        completed = time.perf_counter() - start
        start = time.perf_counter()
        await asyncio.gather(*(status(i % tasks) for i in range(polls)))
        polled = time.perf_counter() - start
    return {"tasks": tasks, "submits_per_s": round(tasks / submitted, 1),
            "completed_per_s": round(tasks / completed, 1), "polls": polls,
            "polls_per_s": round(polls / polled, 1)}


def run(quick: bool = False) -> dict[str, Any]:
    tasks, load_tasks, polls = (10, 50, 500) if quick else (60, 400, 4000)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or local.start()
    cluster = config.load(bootstrap_servers=bootstrap, prefix=f"bench-api-{uuid.uuid4().hex[:6]}")
    create_topics(bootstrap, cluster.prefix, specs=jobs.CLUSTER_TOPICS)
    job = jobs.new_job("bench", cluster.prefix)
    token, entry = jobs.new_token()
    job["api_tokens"] = [entry]
    create_topics(bootstrap, job["prefix"], 4, specs=jobs.JOB_TOPICS)
    jobs.put(cluster, job)
    settings = jobs.job_settings(cluster, job)
    work = Path(tempfile.mkdtemp(prefix="rollstream-bench-api-"))
    procs = ProcessGroup(work / "logs")
    try:
        script = work / "script.jsonl"
        script.write_text(json.dumps({"match": "", "completions": ["4"]}) + "\n")
        policy_port, api_port = free_port(), free_port()
        procs.start("policy", "serve-scripted", "--port", str(policy_port), "--script",
                    str(script))
        common = ["--bootstrap-servers", bootstrap, "--prefix", job["prefix"],
                  "--commit-interval-ms", "100"]
        procs.start("init", "stage", "init", *common)
        procs.start("eval", "stage", "eval", *common)
        procs.start("run", "stage", "run", *common,
                    "--policy-url", f"http://127.0.0.1:{policy_port}")
        procs.start("api", "api", "--bootstrap-servers", bootstrap, "--prefix", cluster.prefix,
                    "--api-port", str(api_port))
        url = f"http://127.0.0.1:{api_port}"
        wait_http(f"{url}/health", timeout=120, proc=procs.procs["api"])
        raw = asyncio.run(_per_task(settings, url, token, tasks, "t"))
        load = asyncio.run(_load(url, token, load_tasks, polls, "l"))
        procs.check_alive()
    finally:
        procs.stop_all()
        delete_topics(bootstrap, cluster.prefix, whole_namespace=True)
    shutil.rmtree(work)  # kept when the run failed: its processes' logs
    stats = {name: percentiles_ms(values) for name, values in raw.items()}
    plain = stats["plain"]["median_ms"]
    overhead = {name: round(stats[name]["median_ms"] - plain, 2)
                for name in ("process", "submit_poll")}
    doc = {
        "quick": quick,
        "parameters": {
            "tasks_per_path": tasks, "task": "arithmetic, one sample, one turn",
            "pipeline": "INIT, RUN, EVAL and the scripted policy as processes, "
                        "--commit-interval-ms 100; one API process",
            "poll_interval_s": POLL_S, "load_concurrency": CONCURRENCY,
            "timer": "time.perf_counter_ns, sequential, the paths interleaved task by task; "
                     "two warm-up tasks discarded",
        },
        "results": stats,
        "baseline": stats["plain"],
        "overhead_p50_ms": overhead,
        "ratio": {name: round(stats[name]["median_ms"] / plain, 2)
                  for name in ("process", "submit_poll")},
        "ratio_meaning": "path median / plain (publish, scored record readable) median",
        "one_api_process": load,
        "target": {
            "description": f"/process overhead per task (p50) < {TARGET_MS:g} ms",
            "measured_median_ms": overhead["process"],
            "met": overhead["process"] < TARGET_MS,
        },
    }
    path = write_result(NAME, doc)
    print_table("a task through the API vs published straight to the pipeline",
                ["path", "median ms", "p99 ms", "n"],
                [[name, s["median_ms"], s["p99_ms"], s["n"]] for name, s in stats.items()])
    print(f"  overhead p50: {overhead} ms, ratio {doc['ratio']}; one API process: "
          f"{load['submits_per_s']} submits/s, {load['polls_per_s']} polls/s, "
          f"{load['completed_per_s']} tasks/s completed; target: "
          f"{'met' if doc['target']['met'] else 'NOT met'}  -> {path}")
    return doc
