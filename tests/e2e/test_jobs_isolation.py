"""Isolation between two jobs on one shared fleet, on the secured broker (SASL_SSL, SCRAM, the
authorizer denying what no ACL allows).

Each job has a principal of its own holding only the grants `rollstream jobs create` prints;
one `rollstream fleet` process per stage, logged in as the fleet's principal (the `stage` role
on the cluster's prefix), serves both. Job alpha's principal reads alpha's scored episodes
(the bridge API, `rollstream train --job alpha`) and is refused, with exit 77 or AccessDenied
and the resource named, beta's scored topic, beta's tasks topic and beta's policy topic. Then
alpha breaks (poison events on its tasks topic, its inference server dead) and beta's next
episodes are still scored exactly once, while alpha's poison goes to alpha's dead letters only.
A third job whose prefix the fleet's principal has no grant for fails alone: the fleet goes on.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import Message

from producers.publish import publish, validate_task
from rollstream import config
from rollstream.broker.secure import Material
from rollstream.cli import main
from rollstream.cluster import kafka
from rollstream.cluster.kafka_errors import EX_NOPERM, AccessDenied
from rollstream.cluster.topics import delete_topics
from rollstream.config import Settings
from rollstream.consume.records import Output
from rollstream.contracts import events
from rollstream.contracts.codec import codec
from rollstream.dev.processes import ProcessGroup, free_port
from tests.helpers.secure_helpers import cli, one_line_error, principal
from trainer_bridge.bridge import TrainerBridge
from trainer_bridge.groups import GroupPolicy

PARTITIONS = 2
TASKS = 4  # per job and round
GROUP = 2
POISON = 3  # undecodable records on alpha's tasks topic


def tasks(job: str, start: int) -> list[dict]:
    """Task ids carry the job's name: a record on another job's topic would show."""
    return [validate_task({
        "task_id": f"{job}-{i}", "env": "arithmetic", "prompt": f"{i % 5}+1=",
        "data": {"answer": str(i % 5 + 1)}, "group_size": GROUP, "max_turns": 1,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 6, "seed": i}})
        for i in range(start, start + TASKS)]


def episodes(job: str, start: int) -> set[str]:
    return {f"{job}-{i}#{s}" for i in range(start, start + TASKS) for s in range(GROUP)}


def records(settings: Settings, topic: str) -> list[Message]:
    partitions = kafka.whole_topic(settings, topic)
    assert partitions is not None, f"{topic} is missing"
    return list(kafka.read_partitions(settings, partitions))


def scored(settings: Settings, prefix: str) -> dict[str, list[str]]:
    """Episode id -> the failure class of each scored record of it (a duplicate shows)."""
    found: dict[str, list[str]] = {}
    for m in records(settings, f"{prefix}.scored"):
        found.setdefault(m.key().decode(), []).append(
            codec().decode_as("ScoredTrajectory", m.value())["failure_class"])
    return found


def wait(predicate: Callable[[], bool], what: str, procs: ProcessGroup,
         timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        procs.check_alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def granted(created: str, admin: Path) -> list[str]:
    """Run the `rollstream acl grant` lines `jobs create` printed, as the administrator."""
    lines = [shlex.split(line, comments=True) for line in created.splitlines()
             if line.strip().startswith("rollstream acl grant")]
    for line in lines:
        assert main([*line[1:], "--kafka-config", str(admin)]) == 0
    return [" ".join(line) for line in lines]


@pytest.mark.slow
def test_jobs_on_one_fleet_are_isolated(secured: tuple[str, Material], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap, material = secured
    cluster = f"iso{uuid.uuid4().hex[:6]}"
    admin = tmp_path / "admin.properties"
    admin.write_text("".join(f"{k}={v}\n" for k, v in material.admin_conf(bootstrap).items()))
    as_admin = config.load(kafka_config=str(admin), prefix=cluster, partitions=PARTITIONS)
    fleet, _ = principal(bootstrap, material, tmp_path, cluster, "stage")
    props: dict[str, Path] = {}
    for job in ("alpha", "beta"):
        props[job], _ = principal(bootstrap, material, tmp_path, cluster)  # no rights yet
        capsys.readouterr()
        assert main(["jobs", "create", job, "--principal", f"User:{props[job].stem}",
                     "--partitions", str(PARTITIONS), "--kafka-config", str(admin),
                     "--prefix", cluster]) == 0
        grants = granted(capsys.readouterr().out, admin)
        assert grants == [
            f"rollstream acl grant User:{props[job].stem} --role trainer --prefix {cluster}.{job}",
            f"rollstream acl grant User:{props[job].stem} --role jobs-reader --prefix {cluster}"]

    # A job whose prefix lies outside the cluster's, which the fleet's principal has no grant
    # for: the fleet is refused its topics, and that job fails alone.
    rogue = f"other{uuid.uuid4().hex[:6]}"
    assert main(["jobs", "create", "rogue", "--job-prefix", rogue, "--partitions",
                 str(PARTITIONS), "--kafka-config", str(admin), "--prefix", cluster]) == 0

    def as_job(job: str, prefix: str | None = None) -> Settings:
        """Job `job`'s principal, on its own prefix or on `prefix`."""
        return config.load(kafka_config=str(props[job]), prefix=prefix or f"{cluster}.{job}",
                           partitions=PARTITIONS)

    alpha, beta = as_job("alpha"), as_job("beta")
    procs = ProcessGroup(tmp_path / "logs")
    kafka_fleet = ["--kafka-config", str(fleet), "--prefix", cluster, "--commit-interval-ms",
                   "100"]
    try:
        policy = procs.start_policy()
        url = policy.url
        procs.start("init", "fleet", "init", *kafka_fleet)
        procs.start("eval", "fleet", "eval", *kafka_fleet)
        procs.start("run", "fleet", "run", *kafka_fleet, "--policy-url", url)
        policy.ready()
        t0 = time.monotonic()
        # Each job publishes as its own principal.
        assert publish(alpha, tasks("alpha", 0)) == TASKS
        assert publish(beta, tasks("beta", 0)) == TASKS
        # Alpha's principal against beta's topics, as commands (started now: each is a process
        # start; the trainer waits for alpha's groups) and through the bridge API below: its
        # own rights and nothing more.
        kafka_alpha = ["--kafka-config", str(props["alpha"]), "--prefix", cluster]
        train = ["train", "--checkpoint-dir", str(tmp_path / "ckpt"), "--groups-per-batch",
                 str(TASKS), "--keep-zero-variance", "--max-steps", "1", "--metrics-port", "0"]
        (tmp_path / "b.jsonl").write_text("".join(json.dumps(t) + "\n"
                                                  for t in tasks("beta", 100)))
        pool = ThreadPoolExecutor(3)
        trained = pool.submit(cli, *train, "--job", "alpha", *kafka_alpha, timeout=180)
        refused = {what: pool.submit(cli, *args, timeout=120) for what, args in (
            ("scored", [*train, "--job", "beta", *kafka_alpha]),
            ("tasks", ["publish", str(tmp_path / "b.jsonl"), *kafka_alpha[:2],
                       "--prefix", f"{cluster}.beta"]))}
        for job in ("alpha", "beta"):
            wait(lambda j=job: len(scored(as_admin, f"{cluster}.{j}")) == 2 * TASKS,
                 f"{job}'s first episodes", procs)
        print(f"first round scored in {time.monotonic() - t0:.1f} s")

        # The bridge API as alpha on beta's prefix: its transactional id is refused.
        with pytest.raises(AccessDenied) as opened:
            TrainerBridge(as_job("alpha", f"{cluster}.beta"))
        assert opened.value.code == EX_NOPERM
        assert f"transactional id {cluster}.beta.bridge." in opened.value.message
        # On its own prefix it reads alpha's episodes, only they...
        with TrainerBridge(alpha, TASKS, GroupPolicy(drop_zero_variance=False),
                           group=f"{cluster}.alpha.api") as bridge:
            batch = next(bridge.batches(1, idle_timeout_s=60))
            assert {s.episode_id for s in batch.samples} == episodes("alpha", 0)
            # ...and cannot publish a PolicyVersion for beta: its ack's transaction fails.
            version = {"version": 99, "kind": "full", "uri": "x", "step_id": batch.step_id,
                       "metrics": {}, "created_at_ms": 1}
            with pytest.raises(AccessDenied) as acked:
                batch.ack([Output(f"{cluster}.beta.policy", "alpha", events.POLICY_VERSION,
                                  version)])
            assert f"topic access refused (topic {cluster}.beta.policy)" in acked.value.message

        # Alpha breaks: its inference server is dead and poison arrives on its tasks topic.
        dead = f"http://127.0.0.1:{free_port()}"
        (tmp_path / "alpha.json").write_text(
            f'{{"name": "alpha", "principal": "User:{props["alpha"].stem}", '
            f'"policy_urls": ["{dead}"]}}')
        assert main(["jobs", "apply", str(tmp_path / "alpha.json"), "--kafka-config",
                     str(admin), "--prefix", cluster]) == 0
        poison = kafka.producer(alpha)
        for i in range(POISON):
            kafka.produce(poison, alpha.topics.tasks, b"\x00not avro", key=f"poison-{i}")
        assert poison.flush(30) == 0
        assert publish(alpha, tasks("alpha", TASKS)) == TASKS
        t1 = time.monotonic()
        assert publish(beta, tasks("beta", TASKS)) == TASKS
        beta_all = episodes("beta", 0) | episodes("beta", TASKS)
        wait(lambda: set(scored(as_admin, f"{cluster}.beta")) == beta_all, "beta's episodes",
             procs)
        print(f"beta's second round scored in {time.monotonic() - t1:.1f} s with alpha broken")
        time.sleep(1)  # a duplicate would be committed by now
        found = scored(as_admin, f"{cluster}.beta")
        assert set(found) == beta_all and all(len(v) == 1 for v in found.values())  # exact
        assert records(as_admin, f"{cluster}.beta.dlq") == []
        wait(lambda: len(records(as_admin, f"{cluster}.alpha.dlq")) == POISON,
             "alpha's dead letters", procs, timeout=30)
        dead_letters = [codec().decode_as("DeadLetter", m.value())
                        for m in records(as_admin, f"{cluster}.alpha.dlq")]
        assert {(d["stage"], d["key"]) for d in dead_letters} == {
            ("init", f"poison-{i}".encode()) for i in range(POISON)}
        # None of alpha's episodes of this round was sampled (its only server is dead).
        alpha_now = scored(as_admin, f"{cluster}.alpha")
        assert all(classes == ["infra"] for e, classes in alpha_now.items()
                   if e in episodes("alpha", TASKS)), alpha_now

        for what, future in refused.items():
            proc = future.result()
            line = one_line_error(proc)
            assert proc.returncode == EX_NOPERM, line
            assert f"topic access refused (topic {cluster}.beta.{what})" in line, line
        done = trained.result()
        pool.shutdown()
        assert done.returncode == 0, done.stderr[-3000:]
        assert records(as_admin, f"{cluster}.beta.policy") == []
        assert [codec().decode_as("PolicyVersion", m.value())["version"]
                for m in records(as_admin, f"{cluster}.alpha.policy")] == [1]
        print(f"both rounds and every refusal checked in {time.monotonic() - t0:.1f} s")
        for stage in ("init", "run", "eval"):  # alive all along (`wait` checks)
            assert "fleet: job rogue refused: not authorized" in (
                tmp_path / "logs" / f"{stage}.log").read_text(), stage
    finally:
        procs.stop_all()
        for job in ("alpha", "beta"):
            delete_topics(as_admin.kafka(), f"{cluster}.{job}")
        delete_topics(as_admin.kafka(), cluster)
        delete_topics(as_admin.kafka(), rogue)
