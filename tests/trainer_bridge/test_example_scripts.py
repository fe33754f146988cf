"""The trainer recipes of docs/training.md as their users run them: each script of
examples/trainers/ as a process, on the CPU, with the real trainer packages, against the test
session's broker; each starts its own pipeline (INIT, RUN with the embedded policy server, EVAL)
under a fresh prefix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollstream.cluster.topics import delete_topics
from rollstream.config import load
from tests.helpers import vllm_server
from tests.helpers.trainers_env import committed_versions, use_trainers

use_trainers()
pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "examples" / "trainers"
BOUND_S = 480  # each script on a busy 2-core machine; they take 10-80 s alone


@pytest.fixture
def prefix(bootstrap: str) -> Iterator[str]:
    """The script's job prefix; its topics (the off-policy script's run 2 and replay ones too)
    are deleted after."""
    name = f"t{uuid.uuid4().hex[:8]}"
    yield name
    for namespace in (name, f"{name}-run2", f"{name}-run2-replay"):
        delete_topics(bootstrap, namespace, whole_namespace=True)


def run(script: str, bootstrap: str, prefix: str, tmp_path: Path, *args: str,
        env: dict[str, str] | None = None) -> str:
    """Run a script as a user would (no PYTHONPATH set: it finds the trainers itself); its
    output, once it exited 0."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--bootstrap-servers", bootstrap,
         "--prefix", prefix, "--work-dir", str(tmp_path), *args], capture_output=True,
        text=True, timeout=BOUND_S, cwd=tmp_path, env={**environ, **(env or {})})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
    return done.stdout


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.py")
                                          if p.name != "common.py"))
def test_every_script_says_what_it_does(script: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--bootstrap-servers" in done.stdout and "--prefix" in done.stdout


@pytest.mark.parametrize("script", ["trl_grpo.py", "trl_async_grpo.py"])
def test_trl_scripts_train_and_commit_a_version_per_step(
        script: str, bootstrap: str, prefix: str, tmp_path: Path) -> None:
    out = run(script, bootstrap, prefix, tmp_path, "--steps", "2")
    assert f"published versions [1, 2] on {prefix}.policy" in out
    job = load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)
    versions = committed_versions(job)
    assert [v["version"] for v in versions] == [1, 2]
    assert all(Path(v["uri"]).exists() for v in versions)  # the weights each version names


@pytest.mark.vllm
def test_trl_script_on_vllm_has_the_server_serve_the_versions_it_publishes(
        bootstrap: str, prefix: str, tmp_path: Path) -> None:
    reason = vllm_server.impossible()
    if reason is not None:
        pytest.skip(reason)
    out = run("trl_grpo.py", bootstrap, prefix, tmp_path, "--steps", "2", "--vllm")
    assert "published versions [1, 2]" in out
    assert re.search(r"http://\S+ serves version 2\n", out), out[-2000:]


def test_offpolicy_script_replays_whole_groups_once_and_trains_on_them(
        bootstrap: str, prefix: str, tmp_path: Path) -> None:
    # The random tiny policy rewards about one group in ten at all: 64 tasks give some.
    out = run("offpolicy_replay.py", bootstrap, prefix, tmp_path, "--tasks", "64",
              "--min-reward", "0.01")
    copied, again = map(int, re.search(r"replayed (\d+) samples .* copied (\d+)", out).groups())
    assert copied > 0 and copied % 8 == 0 and again == 0  # whole groups of 8, copied once
    # Each replayed group has a rewarded sample, so reward variance: one step each.
    versions = re.search(r"committed versions \[([\d, ]*)\]", out).group(1)
    assert [int(v) for v in versions.split(",")] == list(range(1, copied // 8 + 1))


def test_verl_script_returns_a_group_per_row(bootstrap: str, prefix: str,
                                             tmp_path: Path) -> None:
    out = run("verl_agent_loop.py", bootstrap, prefix, tmp_path, "--rows", "2", "--n", "4")
    rows = re.findall(r"row \d+ .*: 4 samples, .* episodes \[(.*)\]", out)
    assert len(rows) == 2
    for row in rows:
        episodes = [e.strip(" '") for e in row.split(",")]
        assert len(set(episodes)) == 4 and len({e.split("#")[0] for e in episodes}) == 1


def test_tinker_script_builds_tinker_data_for_each_batch(bootstrap: str, prefix: str,
                                                        tmp_path: Path) -> None:
    out = run("tinker_train.py", bootstrap, prefix, tmp_path, "--steps", "2",
              env={"TINKER_API_KEY": ""})
    assert "dry run" in out
    assert len(re.findall(r"step \d: 8 Tinker datums", out)) == 2


def test_slime_script_names_the_flags(bootstrap: str, prefix: str, tmp_path: Path) -> None:
    out = run("slime_rollout.py", bootstrap, prefix, tmp_path)
    assert f"ROLLSTREAM_PREFIX={prefix} " in out
    assert "--rollout-function-path trainer_bridge.adapters.slime_adapter.generate_rollout" in out
    assert "--eval-function-path slime.rollout.sglang_rollout.generate_rollout" in out
