"""A checkpoint the server refuses as the wrong kind stops the controller with one message
naming which server loads which checkpoint; before, it asked again every health check, forever
(45 refusals in 90 s)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.dev import tiny_model
from rollstream.dev.background import BackgroundServer
from tests.helpers.controller_helpers import policy_event

# The controller reads the topic, asks the server once and stops; Python's start on a busy
# machine is most of this.
BOUND_S = 90


def test_a_hugging_face_checkpoint_on_the_embedded_server_stops_the_controller(
        settings: Settings, tmp_path: Path) -> None:
    checkpoint = tiny_model.build(tmp_path / "tiny").model  # a save_pretrained directory
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.policy,
                  codec().encode("PolicyVersion", policy_event(1, str(checkpoint))),
                  key="policy", partition=0)
    producer.flush(10)
    with BackgroundServer() as embedded:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "rollstream.cli", "controller", "--bootstrap-servers",
             settings.bootstrap_servers, "--prefix", settings.prefix, "--policy-url", embedded,
             "--health-interval-s", "0.3"],
            capture_output=True, text=True, timeout=BOUND_S)
    assert time.monotonic() - started < BOUND_S
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.count("is the embedded policy server, which loads Rollstream policy "
                             "checkpoints") == 1, done.stderr[-3000:]
    assert f"{checkpoint} is not one" in done.stderr
    assert "is loaded by vLLM" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
