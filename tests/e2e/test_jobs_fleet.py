"""Jobs on one shared fleet, as separate processes on the real broker: one `rollstream fleet`
process per stage serves every running job against one embedded policy server.

Two jobs with different environments and different policies (each its own adapter on the one
server) run at once: each job's scored count is exact (0 lost, 0 duplicated), every scored
record is on its own job's topic, and every turn was sampled by its own job's adapter and
version, through a SIGKILL of the shared RUN process mid-run; a job created while the fleet
runs is picked up without a restart; a cancelled job leaves its stage groups without members
and its topics without an open transaction.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from producers.publish import publish, validate_task
from rollstream.cli import main
from rollstream.cluster import kafka
from rollstream.cluster.topics import delete_topics
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.contracts.graph import STAGES
from rollstream.dev.processes import ProcessGroup
from rollstream.policy_server.model import build_model, save
from rollstream.service import jobs

PARTITIONS = 2
TASKS = 16  # per job
SLOTS = 2  # episodes the policy server takes at once: RUN is mid-run for long enough
GROUP = 2


def tasks_for(job: str, env: str) -> list[dict]:
    """Task ids carry the job's name: a record on another job's topic would show."""
    made = []
    for i in range(TASKS):
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "seed": i}
        task = {"task_id": f"{job}-{i}", "env": env, "group_size": GROUP, "max_turns": 1,
                "sampling": sampling}
        if env == "arithmetic":
            task |= {"prompt": f"{i % 5}+1=", "data": {"answer": str(i % 5 + 1)}}
        else:
            task |= {"prompt": f"Reverse: ab{i}", "data": {"text": f"ab{i}"}}
        made.append(validate_task(task))
    return made


def keys(settings: Settings, topic: str) -> list[str]:
    parts = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    return [m.key().decode() for m in kafka.read_partitions(settings, parts)]


def scored_ids(settings: Settings) -> list[str]:
    return keys(settings, settings.topics.scored)


def stamps(settings: Settings) -> set[tuple[str | None, int]]:
    """The (adapter, policy version) stamps of every scored turn of the job."""
    parts = [TopicPartition(settings.topics.scored, p, 0) for p in range(PARTITIONS)]
    return {(turn["adapter"], turn["policy_version"])
            for m in kafka.read_partitions(settings, parts)
            for turn in codec().decode_as("ScoredTrajectory", m.value())["trajectory"]["turns"]}


def load_adapter(url: str, name: str, path: Path) -> None:
    """vLLM's runtime LoRA call, as the controller makes it."""
    body = json.dumps({"lora_name": name, "lora_path": str(path)}).encode()
    request = urllib.request.Request(f"{url}/v1/load_lora_adapter", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def finished(*jobs: Settings) -> int:
    """Episodes RUN finished (committed trajectories) across the jobs."""
    return sum(len(keys(s, s.topics.trajectories)) for s in jobs)


def all_scored(settings: Settings, count: int) -> Callable[[], bool]:
    return lambda: len(scored_ids(settings)) >= count


def written(*jobs: Settings) -> int:
    """Trajectories written across the jobs, committed or not: a quick look at RUN's progress."""
    probe = Consumer({"bootstrap.servers": jobs[0].bootstrap_servers,
                      "group.id": f"{jobs[0].prefix}.probe"})
    try:
        return sum(probe.get_watermark_offsets(TopicPartition(s.topics.trajectories, p),
                                               timeout=10)[1]
                   for s in jobs for p in range(PARTITIONS))
    finally:
        probe.close()


def open_transactions(settings: Settings) -> list[str]:
    """The job's partitions whose last stable offset is below their end: data of a
    transaction neither committed nor aborted."""
    found = []
    ends = {level: Consumer({"bootstrap.servers": settings.bootstrap_servers,
                             "group.id": f"{settings.prefix}.probe", "isolation.level": level})
            for level in ("read_committed", "read_uncommitted")}
    try:
        for topic in (settings.topics.episodes, settings.topics.episode_state,
                      settings.topics.trajectories, settings.topics.scored, settings.topics.seen):
            for p in range(PARTITIONS):
                tp = TopicPartition(topic, p)
                stable = ends["read_committed"].get_watermark_offsets(tp, timeout=10)[1]
                if stable != ends["read_uncommitted"].get_watermark_offsets(tp, timeout=10)[1]:
                    found.append(f"{topic}[{p}]")
    finally:
        for consumer in ends.values():
            consumer.close()
    return found


def members(settings: Settings, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    return len(admin.describe_consumer_groups([group])[group].result(timeout=10).members)


@pytest.mark.slow
def test_two_jobs_share_one_fleet_exactly_once(settings: Settings, tmp_path: Path) -> None:
    base = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    made: list[str] = []

    def create(name: str, *flags: str) -> Settings:
        assert main(["jobs", "create", name, "--partitions", str(PARTITIONS), *flags,
                     *base]) == 0
        made.append(name)
        return jobs.job_settings(settings, jobs.get(settings, name))

    procs = ProcessGroup(tmp_path / "logs")
    common = [*base, "--commit-interval-ms", "100"]
    try:
        policy = procs.start_policy()
        url = policy.url
        run = ["fleet", "run", *common, "--policy-url", url, "--instance-id", "run-1",
               "--server-max-in-flight", str(SLOTS)]
        policy.ready()
        # Each job's policy: its own weights, as its adapter on the one shared server. Loaded
        # before RUN starts, whose first look at the server then finds them: loaded after, a
        # busy RUN could take an episode before its next look (2 s) and rightly sample the base
        # model, as a job with no version yet does (a suite run: a (None, 0) stamp in alpha).
        for name, seed in (("alpha-lora-v1", 21), ("beta-lora-v2", 22)):
            save(build_model(seed=seed), tmp_path / f"{name}.safetensors", version=seed)
            load_adapter(url, name, tmp_path / f"{name}.safetensors")
        a = create("alpha", "--weight", "1", "--adapter", "alpha-lora")
        b = create("beta", "--weight", "2", "--adapter", "beta-lora")
        procs.start("init", "fleet", "init", *common)
        procs.start("eval", "fleet", "eval", *common)
        procs.start("run", *run)
        assert publish(a, tasks_for("alpha", "arithmetic")) == TASKS
        assert publish(b, tasks_for("beta", "reverse")) == TASKS

        def wait_for(predicate, what: str, timeout: float = 120, interval: float = 0.5) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                procs.check_alive()
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                time.sleep(interval)

        wait_for(lambda: written(a, b) >= 4, "RUN's first episodes", interval=0.1)
        procs.kill("run")  # mid-run: both jobs' open transactions and episodes cut off
        assert finished(a, b) < 2 * TASKS * GROUP  # what is left is the next process's
        procs.start("run-again", *run)

        # A job created while the fleet runs is served without a restart.
        c = create("gamma", "--weight", "1")
        assert publish(c, tasks_for("gamma", "arithmetic")) == TASKS

        for job, settings_of in (("alpha", a), ("beta", b), ("gamma", c)):
            expected = {f"{job}-{i}#{s}" for i in range(TASKS) for s in range(GROUP)}
            wait_for(all_scored(settings_of, len(expected)), f"every episode of {job}")
            time.sleep(1)  # a duplicate would be committed by now
            ids = scored_ids(settings_of)
            assert len(ids) == len(expected) and set(ids) == expected, job  # only its own
        # Sampled by its own policy only: gamma names no adapter, so the base model served it.
        assert stamps(a) == {("alpha-lora-v1", 1)}
        assert stamps(b) == {("beta-lora-v2", 2)}
        assert {adapter for adapter, _ in stamps(c)} == {None}

        # Cancelled: its stages stop, leaving no member and no open transaction behind.
        assert main(["jobs", "cancel", "gamma", *base]) == 0
        groups = [c.topics.group(stage) for stage in STAGES]
        wait_for(lambda: not any(members(c, g) for g in groups), "gamma's groups to empty", 60)
        assert open_transactions(c) == []
        assert "fleet: job gamma stopped" in (tmp_path / "logs" / "run-again.log").read_text()
    finally:
        procs.stop_all()
        for name in made:
            delete_topics(settings.bootstrap_servers, f"{settings.prefix}.{name}")
