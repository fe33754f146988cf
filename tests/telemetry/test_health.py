"""/health and /ready of real processes: on by default on a free port (logged), /ready 503
until the group assigned partitions, 200 then, 503 again once another process with the same
instance id fences this one."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup, free_port

PORT_LINE = re.compile(r"serving /metrics, /health and /ready on port (\d+)")


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def port_of(procs: ProcessGroup, log: Path, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while not (m := PORT_LINE.search(log.read_text() if log.exists() else "")):
        procs.check_alive()
        assert time.monotonic() < deadline, f"no probe port logged in {log}"
        time.sleep(0.2)
    return int(m.group(1))


def wait_status(procs: ProcessGroup, port: int, want: int, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while (got := probe(port, "/ready"))[0] != want:
        procs.check_alive()
        assert time.monotonic() < deadline, f"/ready stayed {got}, wanted {want}"
        time.sleep(0.2)
    return got[1]


def test_stage_ready_after_assignment_and_unready_when_fenced(
        bootstrap: str, tmp_path: Path) -> None:
    prefix = f"h{time.monotonic_ns() % 10**8}"
    args = ["stage", "eval", "--bootstrap-servers", bootstrap, "--prefix", prefix,
            "--instance-id", "same"]
    procs = ProcessGroup(tmp_path)
    try:
        # Its input topic does not exist yet: the group cannot assign it anything.
        procs.start("first", *args)
        first = port_of(procs, tmp_path / "first.log")
        assert probe(first, "/health") == (200, "ok\n")
        deadline = time.monotonic() + 60
        while "kafka" not in (components := json.loads(probe(first, "/ready")[1])["components"]) \
                or components["kafka"] != "ready":  # the broker reached first
            assert time.monotonic() < deadline, components
            time.sleep(0.1)
        status, body = probe(first, "/ready")
        assert status == 503
        # Before the topics exist the stage is joining its group, or has already found its
        # input topic missing: either way not ready (which one is a matter of timing).
        assert json.loads(body)["components"] in (
            {"kafka": "ready", "stage eval": f"not ready: joining group {prefix}.eval"},
            {"kafka": "ready", "stage eval": f"not ready: input topic {prefix}.trajectories "
                                             "does not exist"})
        assert "rollstream_events_consumed_total" in probe(first, "/metrics")[1]

        create_topics(bootstrap, prefix, partitions=2)
        body = wait_status(procs, first, 200)
        assert json.loads(body) == {"ready": True,
                                    "components": {"kafka": "ready", "stage eval": "ready"}}

        # A second process with the same --instance-id: the broker fences one of the two.
        procs.start("second", *args)
        second = port_of(procs, tmp_path / "second.log")
        assert second != first
        deadline = time.monotonic() + 90
        fenced = None
        while fenced is None:
            for port in (first, second):
                try:
                    status, body = probe(port, "/ready")
                except urllib.error.URLError:
                    continue  # stopped (IdInUse) right after a fence
                if status == 503 and "fenced" in body:
                    fenced = json.loads(body)
            assert time.monotonic() < deadline, "neither process reported a fence on /ready"
            time.sleep(0.1)
        assert fenced["components"]["stage eval"].startswith("not ready: fenced: ")
    finally:
        procs.stop_all()
        delete_topics(bootstrap, prefix)


def test_every_other_service_is_ready_once_it_reads(settings: Settings, tmp_path: Path) -> None:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    procs = ProcessGroup(tmp_path)
    # (process, its command, the readiness components it reports)
    services = [
        ("bridge", ["bridge"], {"kafka": "ready", "bridge": "ready"}),
        ("train", ["train", "--checkpoint-dir", str(tmp_path / "ckpt")],
         {"kafka": "ready", "bridge": "ready"}),
        ("controller", ["controller", "--policy-url", "http://127.0.0.1:9"],
         {"kafka": "ready", "controller": "ready"}),
        ("stats", ["stats", "--web-port", str(free_port()), "--datadir", str(tmp_path / "stats")],
         {"stats": "ready"}),
        ("status", ["status", "--watch", "--json", "--interval", "1"], {"status": "ready"}),
    ]
    try:
        for name, args, _ in services:
            procs.start(name, *args, *common)
        for name, _, components in services:
            port = port_of(procs, tmp_path / f"{name}.log", timeout=120)
            assert probe(port, "/health")[0] == 200, name
            body = wait_status(procs, port, 200)
            assert json.loads(body)["components"] == components, name
    finally:
        procs.stop_all()
