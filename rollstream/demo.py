"""`rollstream demo`: the whole pipeline on the embedded defaults, end to end, then a summary.

Starts (or reuses) the broker, creates the topics, starts the policy server and one process per
stage, publishes the sample tasks, follows <p>.scored until every episode is scored, prints a
summary and stops everything it started.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path

from rollstream import config

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"
DEFAULT_TASK_FILES = ["arithmetic.jsonl", "guess_number.jsonl", "reverse.jsonl"]


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo", help="run the whole pipeline on the embedded defaults and print a summary",
        description=__doc__)
    parser.add_argument("--tasks", type=Path, nargs="*", default=None,
                        help="task files (JSONL); default: the samples in examples/tasks")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="give up after this many seconds")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="where process logs go (default: .rollstream/demo-logs)")
    config.add_arguments(parser)
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from producers.publish import load_tasks, publish
    from rollstream.broker import local
    from rollstream.processes import ProcessGroup, free_port, wait_http
    from rollstream.topics import create_topics

    console = Console()
    started_broker = not local.is_running() and not config.load(args).bootstrap_servers
    settings = config.load(args)
    settings = dataclasses.replace(
        settings, bootstrap_servers=local.resolve_bootstrap(settings.bootstrap_servers))
    console.print(f"broker: {settings.bootstrap_servers}")
    create_topics(settings.bootstrap_servers, settings.prefix, settings.partitions)

    run_id = uuid.uuid4().hex[:6]
    tasks = []
    for path in args.tasks or [EXAMPLES / name for name in DEFAULT_TASK_FILES]:
        for task in load_tasks(path):
            task["task_id"] = f"demo-{run_id}/{task['task_id']}"  # this run's episodes only
            tasks.append(task)
    expected = sum(t["group_size"] for t in tasks)

    procs = ProcessGroup(args.log_dir or local.home() / "demo-logs")
    port = free_port()
    policy_url = f"http://127.0.0.1:{port}"
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    try:
        server = procs.start("policy", "serve-policy", "--port", str(port))
        for stage in ("init", "run", "eval"):
            procs.start(stage, "stage", stage, *common, "--policy-url", policy_url)
        wait_http(f"{policy_url}/health", proc=server)
        start_offsets = _end_offsets(settings)
        t0 = time.time()
        sent = publish(settings, tasks)
        console.print(f"published {sent} tasks ({expected} episodes), run {run_id}")
        scored: list[dict] = []
        with Progress(console=console) as progress:
            bar = progress.add_task("scored episodes", total=expected)
            for event in _follow_scored(settings, start_offsets, f"demo-{run_id}/",
                                        deadline=t0 + args.timeout, procs=procs):
                scored.append(event)
                progress.update(bar, completed=len(scored))
                if len(scored) >= expected:
                    break
        elapsed = time.time() - t0
        _print_summary(console, scored, expected, elapsed)
        return 0 if len(scored) == expected else 1
    finally:
        procs.stop_all()
        if started_broker:
            local.stop()


def _end_offsets(settings: config.Settings) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**settings.kafka(), "group.id": "rollstream-demo-offsets"})
    try:
        meta = c.list_topics(settings.topics.scored, timeout=10).topics[settings.topics.scored]
        return {p: c.get_watermark_offsets(TopicPartition(settings.topics.scored, p),
                                           timeout=10)[1] for p in meta.partitions}
    finally:
        c.close()


def _follow_scored(settings: config.Settings, start: dict[int, int], task_prefix: str,
                   deadline: float, procs):
    from confluent_kafka import Consumer, TopicPartition

    from rollstream.codec import codec

    c = Consumer({**settings.kafka(), "group.id": "rollstream-demo-follow",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([TopicPartition(settings.topics.scored, p, o) for p, o in start.items()])
    try:
        while time.time() < deadline:
            procs.check_alive()
            for msg in c.consume(500, timeout=0.5):
                if msg.error() is None:
                    event = codec().decode_as("ScoredTrajectory", msg.value())
                    if event["trajectory"]["task"]["task_id"].startswith(task_prefix):
                        yield event
        raise TimeoutError("demo timed out before every episode was scored")
    finally:
        c.close()


def _print_summary(console, scored: list[dict], expected: int, elapsed: float) -> None:
    from rich.table import Table

    by_env: dict[str, list[dict]] = {}
    for s in scored:
        by_env.setdefault(s["trajectory"]["task"]["env"], []).append(s)
    table = Table(title="Rollstream demo summary")
    for col in ("env", "episodes", "mean reward", "turns/episode", "failure classes"):
        table.add_column(col)
    for env, items in sorted(by_env.items()):
        rewards = [s["reward"] for s in items if s["reward"] is not None]
        classes = Counter(s["failure_class"] for s in items)
        table.add_row(env, str(len(items)),
                      f"{statistics.fmean(rewards):.3f}" if rewards else "-",
                      f"{statistics.fmean(len(s['trajectory']['turns']) for s in items):.2f}",
                      ", ".join(f"{k}={v}" for k, v in sorted(classes.items())))
    console.print(table)
    rewards = [s["reward"] for s in scored if s["reward"] is not None]
    console.print(f"episodes scored: {len(scored)}/{expected} in {elapsed:.1f}s "
                  f"({len(scored) / elapsed:.1f} episodes/s)")
    if rewards:
        console.print(f"mean reward: {statistics.fmean(rewards):.3f}")
    latency = Table(title="per-stage latency (ms)")
    for col in ("stage", "p50", "p99"):
        latency.add_column(col)
    spans = {
        "publish → RUN start (INIT + queue)": [
            t["started_at_ms"] - t["task"]["created_at_ms"]
            for t in (s["trajectory"] for s in scored)],
        "RUN (whole episode)": [t["finished_at_ms"] - t["started_at_ms"]
                                for t in (s["trajectory"] for s in scored)],
        "RUN → scored (EVAL + queue)": [s["scored_at_ms"] - s["trajectory"]["finished_at_ms"]
                                        for s in scored],
    }
    for name, values in spans.items():
        if values:
            q = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
            latency.add_row(name, f"{q[49]:.0f}", f"{q[98]:.0f}")
    console.print(latency)
