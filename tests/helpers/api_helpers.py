"""For the HTTP API tests (tests/api): a cluster with two jobs and their tokens, job alpha's
pipeline as processes, `rollstream api` as a process, a callback receiver, an event-stream
reader, and what the log holds."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from confluent_kafka import Message

from rollstream import config
from rollstream.broker.secure import Material
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup, free_port
from rollstream.service import jobs

PARTITIONS = 2


def cli(bootstrap: str, prefix: str, *args: str) -> str:
    """`rollstream ARGS` as a process; its stdout (stderr joins the failure message)."""
    done = subprocess.run([sys.executable, "-m", "rollstream.cli", *args, "--bootstrap-servers",
                           bootstrap, "--prefix", prefix], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Cluster:
    bootstrap: str
    prefix: str
    tokens: dict[str, str] = field(default_factory=dict)  # job -> a token of it
    outputs: list[str] = field(default_factory=list)  # every CLI output, for the token grep

    @property
    def settings(self) -> Settings:
        return config.load(bootstrap_servers=self.bootstrap, prefix=self.prefix,
                           partitions=PARTITIONS)

    def job_settings(self, name: str) -> Settings:
        return jobs.job_settings(self.settings, jobs.get(self.settings, name))

    def create_job(self, name: str) -> None:
        job = jobs.new_job(name, self.prefix)
        create_topics(self.bootstrap, job["prefix"], PARTITIONS, specs=jobs.JOB_TOPICS)
        jobs.put(self.settings, job)

    def token(self, name: str, action: str = "create") -> str:
        out = cli(self.bootstrap, self.prefix, "jobs", "token", action, name)
        self.outputs.append(out)
        return out.strip()

    def revoke(self, name: str, token_id: str) -> str:
        out = cli(self.bootstrap, self.prefix, "jobs", "token", "revoke", name, token_id)
        self.outputs.append(out)
        return out.strip()


def new_cluster(bootstrap: str) -> Cluster:
    found = Cluster(bootstrap, f"t{uuid.uuid4().hex[:8]}")
    create_topics(bootstrap, found.prefix, specs=jobs.CLUSTER_TOPICS)
    return found


class Api:
    """`rollstream api` processes of one cluster, in a ProcessGroup, on one port."""

    def __init__(self, procs: ProcessGroup, cluster: Cluster, *extra: str,
                 tls: Material | None = None) -> None:
        """`tls`: serve HTTPS with the secured broker's certificate (trusting its CA here)."""
        self.procs, self.cluster, self.extra = procs, cluster, extra
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.context = ssl.create_default_context(cafile=tls.ca) if tls else None
        if tls is not None:
            self.extra += ("--tls-cert", str(tls.keystore), "--tls-key", str(tls.keystore))
        self.starts = 0

    @property
    def name(self) -> str:
        """Its process's name in the group (each start and each port another)."""
        return f"api-{self.port}-{self.starts}"

    def start(self) -> None:
        self.starts += 1
        self.procs.start(self.name, "api", "--bootstrap-servers", self.cluster.bootstrap,
                         "--prefix", self.cluster.prefix, "--api-port", str(self.port),
                         "--metrics-port", str(free_port()), *self.extra)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.procs.check_alive()
            try:
                if self.call("GET", "/health", None, timeout=2)[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"{self.url} not serving after 120 s")

    def kill(self) -> None:
        self.procs.kill(self.name)

    def stop(self) -> None:
        assert self.procs.stop(self.name) == 0, self.procs.log_tail(self.name)

    def call(self, method: str, path: str, token: str | None, payload: Any = None,
             timeout: float = 300) -> tuple[int, Any]:
        """(status, JSON body) of one request."""
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout,
                                        context=self.context) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


class Receiver:
    """A trainer's callback listener (as Polar's slime bridge binds one): records each POST's
    result id header and body, answers 200 (or 500 for the first `fail_first` calls)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                failing = receiver.fail_first > 0
                receiver.fail_first -= 1
                if not failing:
                    receiver.calls.append((self.headers.get("X-Rollstream-Result-Id", ""), body))
                self.send_response(500 if failing else 200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"ok": true}')

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/callback/task_result"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ids(self) -> set[str]:
        return {result_id for result_id, _ in self.calls}

    def close(self) -> None:
        self.server.shutdown()


class EventReader:
    """Reads `GET /events` (server-sent events) in a thread; `events` is every frame so far."""

    def __init__(self, url: str, token: str) -> None:
        self.events: list[dict] = []
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        self.stream = urllib.request.urlopen(request, timeout=300)
        self.content_type = self.stream.headers["Content-Type"]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.stream:
                if line.startswith(b"data: "):
                    self.events.append(json.loads(line[6:]))
        except (OSError, ValueError, AttributeError):
            pass  # closed (http.client reads from a None socket once closed)

    def of(self, task_id: str) -> list[dict]:
        return [e for e in self.events if e["data"].get("task_id") == task_id]

    def close(self) -> None:
        self.stream.close()


def records(settings: Settings, topic: str) -> list[Message]:
    partitions = kafka.whole_topic(settings, topic)
    assert partitions is not None, f"{topic} is missing"
    return list(kafka.read_partitions(settings, partitions))


def scored(settings: Settings) -> dict[str, list[dict]]:
    """Episode id -> every scored record of it (a second rollout shows as a second record)."""
    found: dict[str, list[dict]] = {}
    for m in records(settings, settings.topics.scored):
        found.setdefault(m.key().decode(), []).append(
            codec().decode_as("ScoredTrajectory", m.value()))
    return found


def wait_until(predicate: Callable[[], bool], what: str, procs: ProcessGroup,
               timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        procs.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def pipeline(procs: ProcessGroup, settings: Settings) -> list[str]:
    """A job's INIT, RUN and EVAL as processes, with the embedded policy server; RUN's
    arguments (to start it again)."""
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix,
              "--commit-interval-ms", "100"]
    policy = procs.start_policy()
    run = [*common, "--policy-url", policy.url]
    procs.start("init", "stage", "init", *common)
    procs.start("eval", "stage", "eval", *common)
    procs.start("run", "stage", "run", *run)
    policy.ready()
    return run
