"""The compose stack for real: brought up with the local-image override (host networking, images
from `make images`), it closes the RL loop (the demo's tasks scored, the trainer publishes a
policy version, Prometheus scrapes every process), then is torn down, also on failure."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sysconfig
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream import config
from rollstream.cluster import kafka
from rollstream.contracts.codec import codec
from rollstream.contracts.events import POLICY_VERSION
from rollstream.contracts.wire import VERSION_PATH
from rollstream.envs.copy_letter import demo_tasks

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("rollstream/app:local", "rollstream/kafka:local", "rollstream/prometheus:local")
SERVICES = ("kafka", "topics", "policy", "init", "run", "eval", "train", "controller",
            "prometheus-local")
SCRAPED = {"init", "run", "eval", "train", "controller"}  # `status` is not started here
TASKS = 4  # groups of 8


def _compose_cli() -> list[str] | None:
    for cli in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cli[0]) is None:
            continue
        try:
            subprocess.run([*cli, "version"], check=True, capture_output=True, timeout=30)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            continue
        return cli
    return None


def _missing() -> str | None:
    """Why the stack cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker engine reachable"
    if _compose_cli() is None:
        return "neither `docker compose` nor `docker-compose` (make deps installs it as root)"
    absent = [i for i in IMAGES if subprocess.run(["docker", "image", "inspect", i],
                                                  capture_output=True).returncode != 0]
    return f"local images not built ({', '.join(absent)}): make images" if absent else None


def _free_prefix() -> str:
    """A three-digit port prefix P whose ports P00-P99 are all free on 127.0.0.1 (the override
    listens on P11, P41-P46, P66, P90, P92, P93), below the ephemeral range."""
    for _ in range(50):
        prefix = str(uuid.uuid4().int % 120 + 200)  # 20000-31999
        socks = []
        try:
            for n in range(100):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", int(f"{prefix}{n:02d}")))
            return prefix
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of 100 ports")


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_compose_stack_closes_the_rl_loop() -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    cli = _compose_cli()
    assert cli is not None
    ports = _free_prefix()
    project = f"rs{uuid.uuid4().hex[:8]}"
    compose = [*cli, "-p", project, "-f", str(ROOT / "docker-compose.yml"),
               "-f", str(ROOT / "docker-compose.local.yml"),
               "-f", str(ROOT / "tests" / "fixtures" / "compose.test.yml")]
    env = {**os.environ, "ROLLSTREAM_PORTS": ports,
           "ROLLSTREAM_SITE_PACKAGES": sysconfig.get_paths()["purelib"]}

    def run(*args: str, timeout: float = 180) -> str:
        done = subprocess.run([*compose, *args], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=ROOT)
        assert done.returncode == 0, f"compose {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    settings = config.load(None, bootstrap_servers=f"127.0.0.1:{ports}92", prefix="rollstream")
    seen = {settings.topics.scored: 0, settings.topics.policy: 0, settings.topics.dlq: 0}
    try:
        run("up", "-d", "--no-build", *SERVICES)
        # The policy server must answer before RUN takes episodes (else they end as `infra`).
        deadline = time.monotonic() + 120
        while _get_json(f"http://127.0.0.1:{ports}11/v1/models") is None:
            assert time.monotonic() < deadline, "the policy service never answered"
            time.sleep(1)
        publish(settings, [validate_task(t) for t in demo_tasks(TASKS, 8, seed=0)])
        # What the loop produced, read from the topics themselves.
        topics = settings.topics
        reader = kafka.reader(settings, [TopicPartition(topics.policy, 0, 0),
                                         *(TopicPartition(topics.scored, p, 0) for p in range(8)),
                                         *(TopicPartition(topics.dlq, p, 0) for p in range(8))])
        try:
            while not (seen[topics.scored] and seen[topics.policy] >= 1):
                assert time.monotonic() < deadline + 120, f"the loop did not close: {seen}"
                for msg in reader.consume(100, timeout=1):
                    if msg.error() is not None:
                        continue
                    if msg.topic() == topics.policy:
                        version = codec().decode_as(POLICY_VERSION, msg.value())["version"]
                        seen[msg.topic()] = max(seen[msg.topic()], version)
                    else:
                        seen[msg.topic()] += 1
        finally:
            reader.close()
        # The controller loaded a trainer's version into the policy server.
        served = None
        while not (served and (served.get("version") or 0) >= 1):
            assert time.monotonic() < deadline + 150, f"the policy server serves {served}"
            time.sleep(1)
            served = _get_json(f"http://127.0.0.1:{ports}11{VERSION_PATH}")
        # Prometheus (scraping every 5 s) sees every process that serves metrics.
        up: dict[str, str] = {}
        while set(up) != SCRAPED or set(up.values()) != {"1"}:
            assert time.monotonic() < deadline + 150, f"Prometheus targets: {up}"
            time.sleep(1)
            answer = _get_json(f"http://127.0.0.1:{ports}90/api/v1/query?query=up") or {}
            up = {r["metric"]["service"]: r["value"][1]
                  for r in answer.get("data", {}).get("result", [])
                  if r["metric"]["service"] in SCRAPED}
    except BaseException:
        logs = subprocess.run([*compose, "logs", "--tail", "20"], capture_output=True,
                              text=True, env=env, timeout=60, cwd=ROOT).stdout
        print(logs[-8000:])
        raise
    finally:
        subprocess.run([*compose, "down", "-v", "--remove-orphans", "-t", "3"],
                       capture_output=True, timeout=120, env=env, cwd=ROOT)
        left = subprocess.run(["docker", "ps", "-aq", "--filter",
                               f"label=com.docker.compose.project={project}"],
                              capture_output=True, text=True, timeout=30).stdout.split()
        assert not left, f"containers left behind: {left}"
    assert seen[settings.topics.dlq] == 0
