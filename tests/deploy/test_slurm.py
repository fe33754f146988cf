"""deploy/slurm/rollstream.sbatch on a real Slurm of two compute nodes: munged, slurmctld and two
slurmd (Debian's Slurm is built with multiple-slurmd support: `slurmd -N node1`, `-N node2`,
each with its own port, spool and log) started on this host with a generated slurm.conf, the
recipe submitted as a heterogeneous job against the test's broker: component 0 on node1 runs the
inference server (the embedded policy server standing in for vLLM on the GPU node), the
controller and the trainer; component 1 on node2 runs the stages. It scores a task file end to
end with every step on its component's node; before the time limit Slurm signals the script,
which drains the steps and requeues the job, which resumes; `scancel` makes the stages drain and
stop on SIGTERM; resubmitted, it resumes from the log with nothing lost and nothing scored twice,
and the trainer's policy versions reached the policy topic. The recipe also runs on one
allocation, fails at once when a step exits before it is ready, and (marked vllm) runs vLLM's
CPU build on the GPU component, whose weights the controller reloads from the trainer's
checkpoints. Accounting is off (no slurmdbd):
`sacct` then has no step records, so the job's record is checked through the job-completion log
(`sacct --completion`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.dev import tiny_model, vllm_launch
from rollstream.dev.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "deploy" / "slurm" / "rollstream.sbatch"
GROUP = 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="munged, slurmctld and slurmd are started as root here"),
]


NODES = ("node1", "node2")


class Slurm:
    """A Slurm cluster of its own (ports, state, munge socket) in a directory: one controller
    and a slurmd per node name, all on this host (they share its CPUs: each node declares 8
    CPUs and 8000 MB, which slurmd accepts with SlurmdParameters=config_overrides)."""

    def __init__(self, root: Path, nodes: tuple[str, ...] = NODES) -> None:
        for daemon in ("munged", "slurmctld", "slurmd"):
            if shutil.which(daemon) is None:
                pytest.fail(f"{daemon} is missing: run `make slurm-deps` as root")
        self.root = root
        self.procs: list[subprocess.Popen] = []
        (root / "state").mkdir(parents=True)
        # The sockets (munge's, each step's under the spool) in a short path of their own: a
        # Unix socket's path holds at most 108 bytes, and one under a test's temporary folder
        # went over (slurmd: launch failed, the job held and requeued until pytest's timeout).
        self.sockets = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
        for node in nodes:
            (self.sockets / node).mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket = self.sockets / "munge.socket"
        hostname = subprocess.run(["hostname", "-s"], capture_output=True, text=True,
                                  check=True).stdout.strip()
        self.conf = root / "slurm.conf"
        self.conf.write_text("\n".join([
            "ClusterName=rollstream",
            f"SlurmctldHost={hostname}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={socket}",
            f"StateSaveLocation={root / 'state'}",
            # %n: the node's name, so that each slurmd has its own.
            f"SlurmdSpoolDir={self.sockets / '%n'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",  # steps' --mem counts
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=bf_interval=1",  # heterogeneous jobs start from backfill
            "ReturnToService=2",
            "KillWait=60",  # SIGTERM, then this long to drain before SIGKILL
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={root / 'jobcomp.txt'}",
            *(f"NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={free_port()} "
              "CPUs=8 RealMemory=8000 State=UNKNOWN" for node in nodes),
            f"PartitionName=local Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._start(["munged", "-F", "--force", f"--socket={socket}", f"--key-file={key}",
                     f"--log-file={root / 'munged.log'}", f"--pid-file={root / 'munged.pid'}",
                     f"--seed-file={root / 'munged.seed'}"])
        self._wait(lambda: socket.exists(), "munged's socket")
        self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in nodes:
            self._start(["slurmd", "-D", "-N", node, "-f", str(self.conf)], node)
        self._wait(lambda: self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).split()
                   == [w for node in nodes for w in (node, "idle")], "both nodes idle in sinfo")

    def _start(self, argv: list[str], name: str = "") -> None:
        log = open(self.root / f"{argv[0]}{name}.out", "ab")  # noqa: SIM115 - owned by the process
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
        """Cancel every job the test left (a failed one included) and wait until it is gone,
        then stop the daemons: a slurmstepd outlives its slurmd, and so would its steps."""
        jobs = self.run("squeue", "-h", "-o", "%A", check=False).split()
        if jobs:
            self.run("scancel", *sorted(set(jobs)), check=False)
            deadline = time.monotonic() + 150  # KillWait (60 s), then SIGKILL
            while (self.run("squeue", "-h", check=False).strip()
                   and time.monotonic() < deadline):
                time.sleep(1)
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.sockets, ignore_errors=True)


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


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def hetjob(gpu_component: list[str]) -> list[str]:
    """sbatch's options for a heterogeneous job: component 0 (the "GPU" node: inference
    server, controller, trainer) on node1, component 1 (INIT, EVAL and two RUN processes, 1 CPU
    and 400 MB each, STAGE_MEM) on node2."""
    return ["-w", "node1", *gpu_component, ":", "-w", "node2", "-c", "4", "--mem=2000M"]


class Recipe:
    """The recipe submitted with sbatch's `components` options and `env` over the test's
    settings."""

    def __init__(self, slurm: Slurm, settings: Settings, tmp_path: Path,
                 components: list[str], **env: str) -> None:
        self.slurm, self.settings, self.dir = slurm, settings, tmp_path
        self.logs = tmp_path / "logs"
        self.components = components
        self.env = {
            **slurm.env,
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "ROLLSTREAM_PREFIX": settings.prefix,
            "ROLLSTREAM_PARTITIONS": str(settings.partitions),
            "ROLLSTREAM": str(Path(sys.executable).with_name("rollstream")),
            "PYTHON": sys.executable,
            "RUN_PROCESSES": "2",
            "LOG_DIR": str(self.logs),
            "CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
            "TRAIN_ARGS": "--groups-per-batch 2",
            "STAGE_MEM": "400M", "CONTROLLER_MEM": "256M",
            **env,
        }

    def submit(self, *options: str) -> str:
        out = subprocess.run(["sbatch", "--parsable", f"--chdir={self.dir}",
                              f"--output={self.dir}/job-%j.out", *options, *self.components,
                              str(RECIPE)],
                             capture_output=True, text=True, timeout=60, env=self.env)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0].split("+")[0]

    def output(self, job: str) -> str:
        path = self.dir / f"job-{job}.out"
        return path.read_text() if path.exists() else ""

    def state(self, job: str) -> set[str]:
        """The states of the job's components (empty: gone)."""
        return set(self.slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).split())

    def wait_scored(self, n: int, job: str, timeout: float = 400) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(keys := scored_keys(self.settings)) < n:
            state = self.state(job)
            assert state and state <= {
                "RUNNING", "PENDING", "CONFIGURING", "REQUEUED", "COMPLETING"}, (
                f"job {job} is {state!r}: {self.output(job)}")
            reasons = self.slurm.run("squeue", "-h", "-j", job, "-o", "%r", check=False)
            assert "launch failed" not in reasons, (
                f"job {job}: {reasons.strip()} (the slurmd logs in {self.slurm.root} say why)")
            assert time.monotonic() < deadline, f"{len(keys)} of {n} scored: {self.output(job)}"
            time.sleep(1)
        return keys

    def placed_on(self, gpu: tuple[str, ...], gpu_node: str, cpu_node: str) -> None:
        # Every step of the cluster (the job's components have job ids of their own).
        steps = self.slurm.run("squeue", "-h", "--steps", "-o", "%j %N")
        placed = dict(line.split() for line in steps.splitlines())
        cpu = ("init-1", "eval-2", "run-3", "run-4")
        assert {name: placed.get(name) for name in gpu + cpu} == {
            **dict.fromkeys(gpu, gpu_node), **dict.fromkeys(cpu, cpu_node)}, steps

    def drained(self, job: str, times: int) -> None:
        for name in ("init-1", "eval-2", "run-3", "run-4"):
            stage = name.split("-")[0]
            log = (self.logs / f"{name}-{job}.log").read_text()
            assert log.count(f"stage {stage} stopped") == times, (
                f"{name} did not drain:\n{log[-2000:]}")

    def cancel(self, job: str) -> None:
        self.slurm.run("scancel", job)
        wait_for(lambda: not self.state(job), f"job {job} gone after scancel", timeout=120)


def policy_versions(settings: Settings) -> list:
    return list(kafka.read_partitions(settings, [TopicPartition(settings.topics.policy, 0, 0)]))


@pytest.mark.timeout(1200)
def test_recipe_on_two_nodes_drains_before_its_time_limit_on_scancel_and_resumes(
        slurm: Slurm, settings: Settings, tmp_path: Path) -> None:
    # The embedded policy server on the "GPU" node: 3 CPUs, 2.3 GB with the trainer and
    # controller.
    recipe = Recipe(slurm, settings, tmp_path, hetjob(["-c", "3", "--mem=2500M"]),
                    INFERENCE_CPUS="1", INFERENCE_MEM="1G", TRAINER_CPUS="1", TRAINER_MEM="1G")
    first = tasks("a", 6)
    publish(settings, first)
    # A 4-minute limit, signalled 2-3 minutes in (Slurm may signal up to 60 s early).
    job = recipe.submit("--time=4", "--signal=B:USR1@120")
    recipe.wait_scored(len(first) * GROUP, job)
    recipe.placed_on(("policy", "controller", "trainer"), "node1", "node2")

    # A trickle of tasks until the limit's signal (its time is not exact): the steps drain
    # with work in flight, the job requeues itself and starts again.
    published, deadline = len(first), time.monotonic() + 240
    while "drained before the time limit; requeued" not in recipe.output(job):
        assert time.monotonic() < deadline, f"no drain before the limit: {recipe.output(job)}"
        publish(settings, tasks(f"b{published}-", 4))
        published += 4
        time.sleep(2)
    # The stages drained: the episodes in flight finished (or went back) before they stopped;
    # tasks published since wait for the requeued job.
    at_requeue = len(scored_keys(settings))
    recipe.drained(job, 1)
    # Slurm holds a requeued job for two minutes (its BeginTime); release it now.
    wait_for(lambda: "PENDING" in recipe.state(job), "the job pending again")
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    wait_for(lambda: recipe.output(job).count("stages ready") == 2, "the requeued job's stages")
    assert "(restart 1)" in recipe.output(job)
    third = tasks("c", 150)
    publish(settings, third)
    published += len(third)
    recipe.wait_scored(at_requeue + 1, job)

    recipe.cancel(job)
    recipe.drained(job, 2)
    log = (recipe.logs / f"run-3-{job}.log").read_text()
    # Its server stopped too: its episodes are handed back at once.
    assert "in-flight events cannot progress" in log, log[-2000:]
    completion = slurm.run("sacct", "--completion", "-j", job, "-n", "-o", "JobID,State",
                           check=False)
    assert "CANCELLED" in completion, completion
    total = published * GROUP
    left = total - len(scored_keys(settings))
    assert left > 0, "everything was scored before the scancel: nothing to resume"

    again = recipe.submit()
    recipe.wait_scored(total, again)
    time.sleep(3)  # anything scored twice would arrive by now
    keys = scored_keys(settings)
    assert len(keys) == len(set(keys)) == total
    # The loop closed on Slurm: the trainer published policy versions the controller read.
    assert policy_versions(settings), "the trainer published no policy version"
    recipe.cancel(again)


def test_recipe_on_one_allocation(slurm: Slurm, settings: Settings, tmp_path: Path) -> None:
    """Without a hetjob every step shares the one allocation (--overlap), on its node."""
    recipe = Recipe(slurm, settings, tmp_path, ["-w", "node2", "-c", "2", "--mem=3000M"],
                    TRAIN="0")
    batch = tasks("o", 6)
    publish(settings, batch)
    job = recipe.submit()
    keys = recipe.wait_scored(len(batch) * GROUP, job)
    recipe.placed_on(("policy", "controller"), "node2", "node2")
    assert "trainer" not in recipe.slurm.run("squeue", "-h", "--steps", "-o", "%j")
    recipe.cancel(job)
    recipe.drained(job, 1)
    assert len(keys) == len(set(keys))


def test_a_step_that_exits_before_it_is_ready_fails_the_job_naming_it(
        slurm: Slurm, settings: Settings, tmp_path: Path) -> None:
    recipe = Recipe(slurm, settings, tmp_path, ["-w", "node1", "-c", "2", "--mem=3000M"],
                    TRAIN_ARGS="--no-such-flag")
    job = recipe.submit()
    # At once, not after the readiness checks' 300 s.
    wait_for(lambda: not recipe.state(job), f"job {job} to fail", timeout=90)
    log = tmp_path / "logs" / f"trainer-{job}.log"
    assert (f"rollstream: step trainer exited before it was ready: {log}"
            in recipe.output(job)), recipe.output(job)
    assert "--no-such-flag" in log.read_text()


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_recipe_with_vllm_on_the_gpu_component(slurm: Slurm, settings: Settings,
                                               tmp_path: Path) -> None:
    """INFERENCE=vllm: vLLM's CPU build stands in on the "GPU" node, serving the tiny model;
    RUN renders its chat template (--tokenizer-path), the trainer trains it (--hf-model) and
    the controller has vLLM reload each version from the checkpoint directory."""
    if not (vllm_launch.venv(ROOT) / "bin" / "python").exists():
        pytest.fail("vLLM's CPU build is missing: run `make vllm-deps`")
    model = tiny_model.build(ROOT / ".rollstream" / "tiny-model").model
    # The recipe's `vllm` command: the CPU build through its launcher (its CPU environment).
    python = vllm_launch.venv(ROOT) / "bin" / "python"
    launcher = tmp_path / "vllm"
    launcher.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {python} -m "
                        "rollstream.dev.vllm_launch \"$@\"\n")
    launcher.chmod(0o755)
    recipe = Recipe(slurm, settings, tmp_path, hetjob(["-c", "4", "--mem=6000M"]),
                    INFERENCE="vllm", VLLM=str(launcher), VLLM_MODEL=str(model),
                    VLLM_ARGS=" ".join(vllm_launch.SERVE_ARGS), INFERENCE_CPUS="2",
                    INFERENCE_MEM="4G", TRAINER_CPUS="1", TRAINER_MEM="1500M",
                    # The tiny model's groups mostly score alike: train on them all the same,
                    # so that versions are published and reloaded.
                    TRAIN_ARGS="--groups-per-batch 2 --keep-zero-variance")
    batch = tasks("v", 8)
    publish(settings, batch)
    job = recipe.submit()
    keys = recipe.wait_scored(len(batch) * GROUP, job, timeout=600)
    recipe.placed_on(("vllm", "controller", "trainer"), "node1", "node2")
    vllm_log = (recipe.logs / f"vllm-{job}.log").read_text()
    assert "'enable_prefix_caching': True" in vllm_log, vllm_log[:3000]
    # A version the trainer published, reloaded into vLLM (a failure logs "... failed: ...").
    controller = recipe.logs / f"controller-{job}.log"
    applied = re.compile(r"policy v[1-9]\d* on http://127\.0\.0\.1:\d+: ")
    wait_for(lambda: bool(applied.search(controller.read_text())),
             "the controller applying a trained version to vLLM", timeout=300)
    assert policy_versions(settings)
    assert len(keys) == len(set(keys))
    recipe.cancel(job)
