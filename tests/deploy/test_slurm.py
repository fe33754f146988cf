"""deploy/slurm/rollstream.sbatch on a real Slurm: munged, slurmctld and slurmd started here on
this host with a generated slurm.conf, the recipe submitted against the test's broker. It scores
a task file end to end; `scancel` makes its stages drain and stop on SIGTERM; resubmitted, it
resumes from the log with nothing lost and nothing scored twice; `squeue --steps` shows its
steps. Accounting is off (no slurmdbd): `sacct` then has no step records, so the job's record
is checked through the job-completion log (`sacct --completion`)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.dev.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "deploy" / "slurm" / "rollstream.sbatch"
GROUP = 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="munged, slurmctld and slurmd are started as root here"),
]


def free_block(n: int) -> int:
    """The first of n consecutive free ports below the ephemeral range: the recipe's steps
    serve on METRICS_BASE + i, and ports next to an ephemeral one are taken by outgoing
    connections at any time (a step once failed to bind one)."""
    first, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for base in range(20000, first - n, n):
        sockets = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports below {first}")


class Slurm:
    """A one-host Slurm cluster of its own (ports, state, munge socket) in a directory."""

    def __init__(self, root: Path) -> None:
        for daemon in ("munged", "slurmctld", "slurmd"):
            if shutil.which(daemon) is None:
                pytest.fail(f"{daemon} is missing: run `make slurm-deps` as root")
        self.root = root
        self.procs: list[subprocess.Popen] = []
        (root / "state").mkdir(parents=True)
        (root / "spool").mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket = root / "munge.socket"
        node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
        hostname = re.search(r"NodeName=(\S+)", node).group(1)
        self.conf = root / "slurm.conf"
        self.conf.write_text("\n".join([
            "ClusterName=rollstream",
            f"SlurmctldHost={hostname}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={socket}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "KillWait=60",  # SIGTERM, then this long to drain before SIGKILL
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={root / 'jobcomp.txt'}",
            f"{node.split(' UpTime')[0]} NodeAddr=127.0.0.1 State=UNKNOWN",
            f"PartitionName=local Nodes={hostname} Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._start(["munged", "-F", "--force", f"--socket={socket}", f"--key-file={key}",
                     f"--log-file={root / 'munged.log'}", f"--pid-file={root / 'munged.pid'}",
                     f"--seed-file={root / 'munged.seed'}"])
        self._wait(lambda: socket.exists(), "munged's socket")
        self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._start(["slurmd", "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%T", check=False).strip() == "idle",
                   "the node idle in sinfo")

    def _start(self, argv: list[str]) -> None:
        log = open(self.root / f"{argv[0]}.out", "ab")  # noqa: SIM115 - owned by the process
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           env=self.env))
        log.close()

    def _wait(self, predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            for p in self.procs:
                assert p.poll() is None, f"{p.args[0]} exited: see {self.root}"
            assert time.monotonic() < deadline, f"timed out waiting for {what} ({self.root})"
            time.sleep(0.5)

    def run(self, *argv: str, check: bool = True) -> str:
        result = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)
        if check:
            assert result.returncode == 0, f"{argv}: {result.stderr}"
        return result.stdout

    def close(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[Slurm]:
    cluster = Slurm(tmp_path / "slurm")
    try:
        yield cluster
    finally:
        cluster.close()


def tasks(prefix: str, n: int) -> list[dict]:
    """Multi-turn guesses: episodes stay in flight a while, so a scancel meets some."""
    return [validate_task({
        "task_id": f"{prefix}{i}", "env": "guess_number", "prompt": "Guess 0-9.",
        "data": {"secret": i % 10, "low": 0, "high": 9}, "max_turns": 4, "group_size": GROUP,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 6, "seed": i},
    }) for i in range(n)]


def scored_keys(settings: Settings) -> list[str]:
    parts = [TopicPartition(settings.topics.scored, p, 0) for p in range(settings.partitions)]
    return [m.key().decode() for m in kafka.read_partitions(settings, parts)]


def test_recipe_scores_drains_on_scancel_and_resumes(slurm: Slurm, settings: Settings,
                                                     tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    env_args = {
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "ROLLSTREAM_PREFIX": settings.prefix,
        "ROLLSTREAM": str(Path(sys.executable).with_name("rollstream")),
        "RUN_PROCESSES": "2",
        "POLICY_PORT": str(free_port()),
        "METRICS_BASE": str(free_block(8)),
        "LOG_DIR": str(logs),
    }

    def submit() -> str:
        out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}",
                              f"--output={tmp_path}/job-%j.out", str(RECIPE)],
                             capture_output=True, text=True, timeout=60,
                             env={**slurm.env, **env_args})
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def wait_scored(n: int, job: str, timeout: float = 400) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(keys := scored_keys(settings)) < n:
            state = slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
            assert state in {"RUNNING", "PENDING", "CONFIGURING"}, (
                f"job {job} is {state!r}: {(tmp_path / f'job-{job}.out').read_text()}")
            assert time.monotonic() < deadline, f"{len(keys)} of {n} scored"
            time.sleep(1)
        return keys

    def wait_gone(job: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while slurm.run("squeue", "-h", "-j", job, check=False).strip():
            assert time.monotonic() < deadline, f"job {job} still listed after scancel"
            time.sleep(1)

    first = tasks("a", 6)
    publish(settings, first)
    job = submit()
    wait_scored(len(first) * GROUP, job)
    steps = slurm.run("squeue", "-h", "--steps", "-j", job, "-o", "%i %j")
    names = {line.split()[1] for line in steps.splitlines()}
    assert {"policy", "init-1", "eval-2", "run-3", "run-4"} <= names, steps

    second = tasks("b", 100)
    publish(settings, second)
    # Some of them scored: the scancel meets the stages busy, episodes in flight.
    wait_scored(len(first) * GROUP + 1, job)
    slurm.run("scancel", job)
    wait_gone(job)
    for name in ("init-1", "eval-2", "run-3", "run-4"):
        stage = name.split("-")[0]
        log = (logs / f"{name}-{job}.log").read_text()
        assert f"stage {stage} stopped" in log, f"{name} did not drain:\n{log[-2000:]}"
        if stage == "run":  # its server stopped too: its episodes are handed back at once
            assert "in-flight events cannot progress" in log, log[-2000:]
    completion = slurm.run("sacct", "--completion", "-j", job, "-n", "-o", "JobID,State",
                           check=False)
    assert "CANCELLED" in completion, completion
    total = (len(first) + len(second)) * GROUP
    left = total - len(scored_keys(settings))
    assert left > 0, "everything was scored before the scancel: nothing to resume"

    again = submit()
    wait_scored(total, again)
    time.sleep(3)  # anything scored twice would arrive by now
    keys = scored_keys(settings)
    assert len(keys) == len(set(keys)) == total
    slurm.run("scancel", again)
    wait_gone(again)
