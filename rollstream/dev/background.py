"""The embedded policy server (or any app of `rollstream.policy_server.app`) on its own event loop
in a daemon thread, for tests, benchmarks and one-process demos."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rollstream.policy_server.app import serve


class BackgroundServer:
    """The server on its own event loop in a daemon thread, for tests and one-process demos:
    `with BackgroundServer() as url: ...`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **app_kwargs: Any) -> None:
        self._args = (host, port)
        self._app_kwargs = app_kwargs
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="policy-server", daemon=True)
        self.url = ""

    def start(self, timeout_s: float = 30) -> str:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("policy server did not start")
        if self._error is not None:
            raise RuntimeError("policy server failed to start") from self._error
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(url: str) -> None:
                self.url = url
                self._ready.set()

            await serve(*self._args, ready=ready, stop=self._stop, **self._app_kwargs)

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
        finally:
            self._ready.set()
