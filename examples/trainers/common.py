"""What the trainer examples share: the pinned trainers on sys.path, a broker and a fresh job's
topics, and the pipeline (INIT, RUN with the embedded policy server, EVAL) as processes.

Each example runs on its own: `python examples/trainers/<name>.py --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from rollstream.config import Settings

ROOT = Path(__file__).resolve().parents[2]
# Where `make trainer-deps` installs the trainers these examples are tested with.
TRAINERS = Path(os.environ.get("ROLLSTREAM_TRAINERS_PATH") or ROOT / ".rollstream" / "trainers")


def use_trainers() -> None:
    """Put the pinned trainers first on sys.path (they need newer huggingface_hub and click
    than the project's virtualenv has), or stop saying how to install them."""
    if not (TRAINERS / ".installed").is_file():
        sys.exit(f"the trainers are not installed under {TRAINERS}: run `make trainer-deps` "
                 "(or set ROLLSTREAM_TRAINERS_PATH to where they are)")
    if str(TRAINERS) not in sys.path:
        sys.path.insert(0, str(TRAINERS))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # The processes started here (the pipeline's stages) import the trainers too.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TRAINERS), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                   help="the Kafka broker (default: KAFKA_BOOTSTRAP_SERVERS, else the bundled "
                        "broker, started if it is not running)")
    p.add_argument("--prefix", default=None,
                   help="the job's topic prefix (default: a fresh one, its topics created)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="checkpoints, the tiny model and the processes' logs (default: a "
                        "temporary directory)")
    return p


def settings_for(args: argparse.Namespace) -> Settings:
    """The job's settings: the broker named or the bundled one, a fresh prefix's topics."""
    from rollstream.broker import local
    from rollstream.cluster.topics import create_topics
    from rollstream.config import load

    bootstrap = args.bootstrap_servers or local.start()
    prefix = args.prefix or f"example-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, prefix, partitions=4)  # existing topics are kept
    return load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)


@contextmanager
def work_dir(args: argparse.Namespace) -> Iterator[Path]:
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        yield args.work_dir
        return
    with tempfile.TemporaryDirectory(prefix="rollstream-example-") as tmp:
        yield Path(tmp)


@contextmanager
def pipeline(settings: Settings, log_dir: Path, vllm_model: Path | None = None) -> Iterator[str]:
    """INIT, RUN and EVAL as processes; yields the inference server's URL. Everything is
    stopped on the way out. RUN samples from the embedded policy server (byte-level token ids
    below 261, which the tiny Qwen2 takes as its own ids), or with `vllm_model` from vLLM's CPU
    build serving that Hugging Face model (`make vllm-deps`), with `rollstream controller`
    applying the job's versions to it and the model served as version 0 to start with."""
    from rollstream.dev import vllm_launch
    from rollstream.dev.processes import ProcessGroup, free_port, wait_http

    procs = ProcessGroup(log_dir)
    common = [*settings.client_flags(), "--commit-interval-ms", "100"]
    try:
        if vllm_model is None:
            policy = procs.start_policy()
            url, run_args = policy.url, []
        else:
            if not (vllm_launch.venv(ROOT) / ".installed").is_file():
                sys.exit("vLLM's CPU build is not installed: run `make vllm-deps`")
            port = free_port()
            argv, env = vllm_launch.serve_command(ROOT, vllm_model, port)
            server = procs.start_program("policy", argv, env)
            url, run_args = f"http://127.0.0.1:{port}", ["--tokenizer-path", str(vllm_model)]
            procs.start("controller", "controller", *settings.client_flags(), "--policy-url", url)
        procs.start("init", "stage", "init", *common)
        procs.start("run", "stage", "run", *common, "--policy-url", url, *run_args)
        procs.start("eval", "stage", "eval", *common)
        if vllm_model is None:
            policy.ready()
        else:
            wait_http(f"{url}/health", timeout=600, proc=server)  # minutes on a busy CPU
            serve(url, 0, vllm_model)
        print(f"pipeline up (logs in {log_dir}); inference server {url}", flush=True)
        yield url
    finally:
        procs.stop_all()


def serve(url: str, version: int, model: Path) -> None:
    """Have the server at `url` serve `model` as `version`, through the controller's path."""
    from rollstream.controller.apply import apply_policy

    event = {"version": version, "kind": "full", "uri": str(model), "step_id": "base",
             "metrics": {}, "created_at_ms": 0}
    [applied] = asyncio.run(apply_policy(event, [url]))
    if not applied.ok:
        sys.exit(f"{url} could not serve {model} as version {version}: {applied.detail}")


def served_version(url: str, wanted: int, timeout_s: float = 300.0) -> int | None:
    """The version the server reports once it is `wanted` (the controller applies it), or the
    last it reported when `timeout_s` passed."""
    from rollstream.controller.apply import current_version

    async def poll() -> int | None:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + timeout_s
            while True:
                version = await current_version(session, url)
                if version == wanted or time.monotonic() > deadline:
                    return version
                await asyncio.sleep(1)

    return asyncio.run(poll())


def committed_versions(settings: Settings) -> list[int]:
    """The policy versions committed on the job's policy topic, in order."""
    from rollstream import policy_versions
    from rollstream.cluster import kafka

    return [v["version"] for v in policy_versions.newer(
        kafka.read_partitions(settings, policy_versions.partitions(settings)))]


def scored_count(settings: Settings) -> int:
    """How many scored trajectories the job's scored topic holds (committed ones)."""
    from rollstream.cluster import kafka

    return sum(1 for _ in kafka.read_partitions(
        settings, kafka.whole_topic(settings, settings.topics.scored) or []))
