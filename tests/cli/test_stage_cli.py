"""`rollstream stage run` warns at start when a server is not the embedded policy and no
--tokenizer-path names the model's tokenizer."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollstream.cli.stage import warn_without_tokenizer
from rollstream.config import load


def _models_server(owned_by: str) -> ThreadingHTTPServer:
    """A server answering /v1/models as vLLM (owned_by "vllm") or the embedded policy does."""
    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [
                {"id": "Qwen/Qwen3-4B", "object": "model", "owned_by": owned_by}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[dict[str, str]]:
    made = {kind: _models_server(kind) for kind in ("vllm", "rollstream")}
    yield {kind: f"http://127.0.0.1:{s.server_address[1]}" for kind, s in made.items()}
    for s in made.values():
        s.shutdown()


def test_run_warns_on_a_real_server_without_tokenizer_path(
        servers: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rollstream")
    warn_without_tokenizer(load(policy_url=f"{servers['vllm']},{servers['rollstream']}"))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert servers["vllm"] in warned[0] and "--tokenizer-path" in warned[0]


@pytest.mark.parametrize("case", ["embedded", "tokenizer given", "down"])
def test_run_does_not_warn_otherwise(servers: dict[str, str], caplog: pytest.LogCaptureFixture,
                                     case: str) -> None:
    caplog.set_level(logging.WARNING, logger="rollstream")
    settings = {"embedded": load(policy_url=servers["rollstream"]),
                "tokenizer given": load(policy_url=servers["vllm"], tokenizer_path="/m"),
                "down": load(policy_url="http://127.0.0.1:9")}[case]
    warn_without_tokenizer(settings)
    assert caplog.records == []


def test_a_stage_on_a_missing_input_topic_says_so_every_30_s(bootstrap: str) -> None:
    """Not ready, naming the topic, and said again every 30 s rather than once."""
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request
    import uuid

    from rollstream.dev.processes import free_port

    port = free_port()
    prefix = f"missing-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream.cli", "stage", "eval", "--bootstrap-servers",
         bootstrap, "--prefix", prefix, "--metrics-port", str(port)],
        stderr=subprocess.PIPE, text=True)
    said: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while len(said) < 2 and time.monotonic() < deadline:
            line = proc.stderr.readline() if proc.stderr else ""
            if f"input topic {prefix}.trajectories does not exist" in line:
                said.append(time.monotonic())
        assert len(said) == 2, "said fewer than twice in 120 s"
        assert 25 < said[1] - said[0] < 45
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5)
            raise AssertionError("ready on a missing input topic")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
            assert f"{prefix}.trajectories does not exist" in exc.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
