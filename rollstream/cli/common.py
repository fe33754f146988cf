"""What every command shares: its settings (flags, environment, file; the bundled broker when
none is named), the log format of long-running processes, and how a service stops on a signal."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from rollstream import config
from rollstream.cluster.kafka_errors import (
    EX_CONFIG,
    EX_NOPERM,
    AccessDenied,
    KafkaProblem,
    check_broker,
)
from rollstream.config import Settings
from rollstream.contracts.events import Job
from rollstream.service import jobs
from rollstream.telemetry import health, metrics

NO_BROKER = ("no Kafka broker is configured: name one with --bootstrap-servers HOST:PORT, "
             "KAFKA_BOOTSTRAP_SERVERS, or bootstrap.servers in a client properties file "
             "(--kafka-config FILE, ROLLSTREAM_KAFKA_CONFIG); `--bootstrap-servers local` "
             "starts the bundled broker")


def broker_settings(args: argparse.Namespace) -> Settings:
    """The command's settings with a broker named (`named_broker`)."""
    return named_broker(config.load(args))


def named_broker(resolved: Settings) -> Settings:
    """`resolved`, which must name a broker: `local` starts the bundled one (a broker is never
    started unasked: a mistyped variable must not give an empty private one)."""
    from rollstream.broker import local

    if not resolved.bootstrap_servers:
        raise KafkaProblem(NO_BROKER, EX_CONFIG)
    if resolved.bootstrap_servers == "local":
        resolved = replace(resolved, bootstrap_servers=local.start())
    return resolved


def settings(args: argparse.Namespace, *topics: str) -> Settings:
    """A one-shot command's settings, once the broker answered within --timeout with these
    credentials (and shows the named topics, suffixes of the prefix's graph)."""
    return checked(broker_settings(args), *topics)


def checked(resolved: Settings, *topics: str) -> Settings:
    """`resolved` once its broker answered within its timeout (see `settings`)."""
    names = tuple(getattr(resolved.topics, t.replace("-", "_")) for t in topics)
    check_broker(resolved.kafka(), resolved.timeout_s, names)
    return resolved


def check_rights(resolved: Settings, *topics: str) -> None:
    """A started process's principal refused one of `topics` (suffixes of the prefix's graph)
    stops it now (AccessDenied, exit 77) with the topic named, instead of an unclear error at
    its first read; a topic not there yet is left to the process."""
    try:
        checked(resolved, *topics)
    except KafkaProblem as exc:
        if exc.exit_code == EX_NOPERM:
            raise AccessDenied(str(exc)) from None


def add_job_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--job", metavar="NAME", default=None,
                        help=f"{what} of this job (`rollstream jobs`): its prefix comes from "
                             "the cluster's jobs topic, --prefix being the cluster's")


def for_job(settings: Settings, name: str | None) -> tuple[Settings, Job | None]:
    """The settings under job `name`'s prefix, with the job (`settings` as they are when no
    job is named); a job that is not there ends the command saying which jobs are."""
    if name is None:
        return settings, None
    try:
        check_rights(settings, "jobs")
    except AccessDenied as exc:
        exc.message += (f"; a job's principal needs `rollstream acl grant PRINCIPAL --role "
                        f"jobs-reader --prefix {settings.prefix}` for --job, or names the job's "
                        "prefix with --prefix")
        raise
    try:
        job = jobs.get(settings, name)
    except jobs.JobError as exc:
        raise SystemExit(f"rollstream: {exc}") from None
    return jobs.job_settings(settings, job), job


def log_to_stderr() -> None:
    """The log format of every long-running Rollstream process."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


def start_service(args: argparse.Namespace, parts: Sequence[str] = ()) -> Settings:
    """A long-running process's start: logs to stderr, its settings, /metrics, /health and
    /ready (on by default: see rollstream.telemetry.metrics), and the broker reached: an
    unreachable one is waited for (logged every few seconds, and /ready says so), refused
    credentials or TLS trust stop the process (AccessDenied, exit 77).

    `parts`: the readiness components the process reports once it runs (its consumer, say),
    unready from the start, so /ready never answers 200 with the broker alone reached."""
    log_to_stderr()
    resolved = broker_settings(args)
    logging.getLogger("rollstream").info(
        "Kafka at %s, prefix %s, client properties %s", resolved.bootstrap_servers,
        resolved.prefix, config.redacted(resolved.kafka_properties) or "(none)")
    for part in parts:
        health.component(part)
    metrics.serve(resolved.service.metrics_port)
    wait_for_broker(resolved)
    return resolved


def wait_for_broker(settings: Settings, every_s: float = 5.0) -> None:
    reached = health.component("kafka", f"connecting to {settings.bootstrap_servers}")
    while True:
        try:
            check_broker(settings.kafka(), every_s)
            reached.ready()
            return
        except KafkaProblem as exc:
            if exc.exit_code == EX_NOPERM:
                raise AccessDenied(str(exc)) from None
            reached.not_ready(str(exc))
            logging.getLogger("rollstream").warning("%s; retrying", exc)


def run_async(main: Coroutine[Any, Any, None], on_signal: Callable[[], None] | None = None
              ) -> int:
    """Run `main` to its end. With `on_signal`, SIGTERM and SIGINT call it (the service then
    stops itself cleanly); without, Ctrl-C ends the command quietly and SIGTERM as by default."""

    async def run() -> None:
        if on_signal is not None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
        await main

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0
