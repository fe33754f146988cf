"""`rollstream demo`: the whole RL loop on the embedded defaults, live, then a summary and a plot.
With --vllm, on vLLM's CPU build serving a tiny local Hugging Face model instead (docs/vllm.md).

Starts (or reuses) the broker, creates a fresh set of topics for this run, starts the embedded
policy server, the inference controller, INIT, RUN, EVAL and the trainer as separate processes,
publishes `copy_letter` tasks and follows the loop: tasks published, work waiting in each stage,
episodes scored, policy version, mean reward. At the end it prints a summary table, writes a PNG
plot of mean reward per policy version and of throughput over time, and stops everything it
started.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import uuid
from pathlib import Path

from rollstream import config
from rollstream.dev.loop import LoopConfig
from rollstream.inference.chat import sample_count


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from producers.publish import publish
    from rollstream.broker import local
    from rollstream.cluster.topics import create_topics, delete_topics
    from rollstream.dev.loop import ClosedLoop

    console = Console()
    run_id = uuid.uuid4().hex[:6]
    settings = config.load(args)
    started_broker = settings.bootstrap_servers in ("", "local") and not local.is_running()
    prefix = settings.prefix if args.prefix else f"demo-{run_id}"
    settings = dataclasses.replace(
        settings, prefix=prefix, partitions=4,
        bootstrap_servers=local.resolve_bootstrap(settings.bootstrap_servers))
    out = args.out or local.home() / "demo" / prefix
    console.print(f"broker {settings.bootstrap_servers}, topics {prefix}.*, files in {out}")
    create_topics(settings.kafka(), prefix, settings.partitions)
    timeout = args.timeout if args.timeout is not None else (900.0 if args.vllm else 280.0)
    hf_model = None
    if args.vllm:  # the tiny model, made once and reused (rollstream.dev.tiny_model)
        from rollstream.dev import tiny_model

        hf_model = tiny_model.build(local.home() / "tiny-model", seed=args.seed).model
    # On vLLM: small batches and a short window, so versions are trained and served while
    # episodes still run (a CPU server samples a few episodes a second).
    small = {"groups_per_batch": 2, "admission_window": 4, "max_staleness": 2} if args.vllm else {}
    loop = ClosedLoop(settings, out, LoopConfig(tasks=args.tasks, group_size=args.group_size,
                                                seed=args.seed, hf_model=hf_model, **small))
    t0 = time.time()
    try:
        loop.start()
        tasks = loop.tasks()
        publish(settings, tasks)
        expected = len(tasks) * args.group_size
        with Live(console=console, refresh_per_second=4) as live:
            for progress in loop.follow(deadline=t0 + timeout):
                live.update(_live_table(progress, len(tasks), expected, loop, time.time() - t0))
                if len(progress.scored) >= expected:
                    break
        console.print()
        elapsed = time.time() - t0
        plot = out / "demo.png"
        _plot(loop.progress, t0, plot)
        _summary(console, loop.progress, expected, elapsed, plot)
        return 0
    except TimeoutError:
        console.print(f"[red]the loop did not finish within {timeout:.0f}s; logs in "
                      f"{out / 'logs'}[/red]")
        return 1
    finally:
        loop.stop()
        if not args.keep_topics:
            delete_topics(settings.kafka(), prefix)
        if started_broker:
            local.stop()


def _recent_reward(progress, n: int = 200) -> float | None:
    rewards = [s["reward"] for s in progress.scored[-n:] if s["reward"] is not None]
    return statistics.fmean(rewards) if rewards else None


def _live_table(progress, tasks: int, expected: int, loop, elapsed: float):
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    lag = loop.stage_lag()
    table = Table(title=f"Rollstream demo: {elapsed:.0f}s", show_header=False)
    table.add_column(justify="right")
    table.add_column()
    table.add_row("tasks published", str(tasks))
    table.add_row("waiting for INIT / RUN / EVAL",
                  f"{lag['init']} tasks / {lag['run']} episodes / {lag['eval']} trajectories")
    table.add_row("episodes scored",
                  ProgressBar(total=expected, completed=len(progress.scored), width=40))
    table.add_row("", f"{len(progress.scored)}/{expected}")
    version = progress.versions[-1]["version"] if progress.versions else 0
    table.add_row("policy version", str(version))
    recent = _recent_reward(progress)
    table.add_row("mean reward (last 200)", "-" if recent is None else f"{recent:.3f}")
    return table


def _summary(console, progress, expected: int, elapsed: float, plot: Path) -> None:
    from rich.table import Table

    by_version = progress.reward_by_version()
    table = Table(title="mean reward by the policy version that sampled it")
    for col in ("policy version", "episodes", "mean reward"):
        table.add_column(col, justify="right")
    for version, (mean, n) in by_version.items():
        table.add_row(str(version), str(n), f"{mean:.3f}")
    console.print(table)
    rewards = [s["reward"] for s in progress.scored if s["reward"] is not None]
    classes: dict[str, int] = {}
    for s in progress.scored:
        classes[s["failure_class"]] = classes.get(s["failure_class"], 0) + 1
    first = progress.scored[: len(progress.scored) // 5]
    last = progress.scored[-len(progress.scored) // 5:]
    summary = Table(title="summary", show_header=False)
    summary.add_column(justify="right")
    summary.add_column()
    summary.add_row("episodes scored", f"{len(progress.scored)}/{expected} in {elapsed:.1f}s "
                                       f"({len(progress.scored) / elapsed:.1f}/s)")
    summary.add_row("policy versions trained", str(len(progress.versions)))
    summary.add_row("mean reward, first / last fifth of episodes",
                    f"{_mean(first):.3f} → {_mean(last):.3f}")
    summary.add_row("mean reward, all", f"{statistics.fmean(rewards):.3f}" if rewards else "-")
    summary.add_row("failure classes", ", ".join(f"{k}={v}" for k, v in sorted(classes.items())))
    # Each new sample re-sends and trains the whole context: the cost of a template that
    # re-renders history (one per episode when the conversation is append-only).
    samples = [sample_count(s["trajectory"]["turns"]) for s in progress.scored]
    summary.add_row("training samples per episode",
                    f"{statistics.fmean(samples):.2f} ({sum(samples)} in all)" if samples else "-")
    summary.add_row("plot", str(plot))
    console.print(summary)
    console.print(_latency_table(progress.scored))


def _latency_table(scored: list[dict]):
    """Per-stage latency from the events' own timestamps: published → RUN start (INIT and the
    episodes queue, admission control included), RUN, RUN end → scored (EVAL and its queue)."""
    from rich.table import Table

    trajectories = [s["trajectory"] for s in scored]
    spans = {
        "published → RUN start (INIT, queue, admission)":
            [t["started_at_ms"] - t["task"]["created_at_ms"] for t in trajectories],
        "RUN (whole episode)": [t["finished_at_ms"] - t["started_at_ms"] for t in trajectories],
        "RUN end → scored (EVAL, queue)":
            [s["scored_at_ms"] - s["trajectory"]["finished_at_ms"] for s in scored],
    }
    table = Table(title="per-stage latency (ms)")
    for col in ("span", "p50", "p99"):
        table.add_column(col, justify="right")
    for name, values in spans.items():
        if len(values) > 1:
            q = statistics.quantiles(values, n=100)
            table.add_row(name, f"{q[49]:.0f}", f"{q[98]:.0f}")
    return table


def _mean(scored: list[dict]) -> float:
    rewards = [s["reward"] for s in scored if s["reward"] is not None]
    return statistics.fmean(rewards) if rewards else 0.0


def _plot(progress, t0: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    by_version = progress.reward_by_version()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(list(by_version), [m for m, _ in by_version.values()], marker="o")
    left.set(xlabel="policy version", ylabel="mean reward", ylim=(0, 1.05),
             title="reward of the samples each version produced")
    left.grid(alpha=0.3)
    times = [t - t0 for t in progress.scored_times]
    if times:
        width = 5.0
        edges = [i * width for i in range(int(max(times) // width) + 2)]
        counts = [sum(1 for t in times if a <= t < a + width) / width for a in edges[:-1]]
        right.step(edges[:-1], counts, where="post")
    right.set(xlabel="seconds since start", ylabel="episodes scored per second",
              title="throughput")
    right.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
