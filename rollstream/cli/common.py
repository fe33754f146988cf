"""What every command shares: its settings (flags, environment, file; the bundled broker when
none is named), the log format of long-running processes, and how a service stops on a signal."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from rollstream import config, metrics
from rollstream.broker import with_broker
from rollstream.config import Settings


def settings(args: argparse.Namespace) -> Settings:
    """The command's settings, resolved as `config.load` does, with a broker to talk to."""
    return with_broker(config.load(args))


def log_to_stderr() -> None:
    """The log format of every long-running Rollstream process."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


def start_service(args: argparse.Namespace) -> Settings:
    """A long-running process's start: logs to stderr, its settings, /metrics, /health and
    /ready (on by default: see rollstream.metrics)."""
    log_to_stderr()
    resolved = settings(args)
    metrics.serve(resolved.metrics_port)
    return resolved


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
