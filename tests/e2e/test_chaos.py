"""Kills on one 3-node cluster (starting one is most of these tests' cost on a small machine).

- The cluster itself: topics replicated three ways, and transactions that carry on when the
  partition's leader broker is SIGKILLed; the killed node rejoins.

The chaos benchmarks' short versions: nothing lost, nothing scored twice, nothing infra-classed,
no process exits or hangs.

- The single-job pipeline, a few hundred episodes, while the broker leading a partition of
  `episodes` is SIGKILLed and restarted. Four stage processes (RUN as a dynamic and a static
  member, EVAL static, INIT dynamic): the full benchmark runs them all.
- Two jobs on one shared fleet, a few dozen episodes each, through a partition-leader kill and
  a SIGKILL of each process kind: the fleet's INIT, RUN and EVAL and the policy server.
- Long episodes over two RUN processes, one SIGKILLed mid-run (the at_scale benchmark's).

Times back to full throughput are the benchmarks' business (`make bench`), not asserted here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from benchmarks import at_scale, chaos, chaos_jobs
from rollstream.broker import cluster
from rollstream.cluster.kafka import read_partitions
from rollstream.cluster.topics import create_topics
from rollstream.config import load
from rollstream.dev.simulated import Fleet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with chaos.three_node_cluster(tmp_path_factory.mktemp("cluster")) as bootstrap:
        yield bootstrap


def _transaction(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex,
                  "enable.idempotence": True})
    p.init_transactions(120)
    p.begin_transaction()
    for value in values:
        p.produce(topic, value, partition=0)
    p.commit_transaction(120)


@pytest.mark.timeout(900)  # the cluster's start, when this test runs first
def test_transactions_survive_the_partition_leader_being_killed(three_nodes: str) -> None:
    bootstrap = three_nodes
    assert cluster.running_nodes() == [1, 2, 3]
    settings = load(bootstrap_servers=bootstrap, prefix=f"c{uuid.uuid4().hex[:6]}")
    create_topics(bootstrap, settings.prefix, partitions=2, replication_factor=3)
    topic = settings.topics.tasks
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # create_topics returns once every broker knows the topics (each one answers
    # DescribeConfigs from its own metadata).
    meta = admin.list_topics(topic, timeout=30)
    assert len(meta.topics[topic].partitions) == 2
    assert all(len(p.replicas) == 3 for p in meta.topics[topic].partitions.values())
    [config] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    assert config.result(timeout=30)["min.insync.replicas"].value == "2"

    _transaction(bootstrap, topic, [b"before"])
    leader = cluster.partition_leader(bootstrap, topic, 0)
    assert cluster.kill_node(leader)
    _transaction(bootstrap, topic, [b"after-leader-kill-1", b"after-leader-kill-2"])
    assert cluster.partition_leader(bootstrap, topic, 0) != leader
    values = [m.value() for m in read_partitions(settings, [TopicPartition(topic, 0, 0)])]
    assert values == [b"before", b"after-leader-kill-1", b"after-leader-kill-2"]
    # The killed node comes back and rejoins as a broker of the cluster.
    cluster.start_node(leader)
    cluster.wait_ready(bootstrap, 3, timeout=240)
    assert cluster.running_nodes() == [1, 2, 3]


@pytest.mark.timeout(900)  # a 3-node cluster and five processes start on a small machine
def test_a_broker_kill_loses_and_duplicates_nothing(three_nodes: str, tmp_path: Path) -> None:
    # The kill comes 1 s after the first scored episode: mid-run, with transactions open.
    result = chaos.measure(three_nodes, episodes=200, interval=1, kinds=["partition-leader"],
                           baseline=False, timeout_s=600, workdir=tmp_path,
                           whole_cluster=False, max_faults=1, grace_s=3,
                           processes=["init-0", "run-0", "run-1", "eval-1"])
    run = result["with_faults"]
    assert run["faults"] == {"partition-leader": 1}, run["fault_log"]
    assert run["expected"] == 200
    assert (run["lost"], run["duplicated"], run["infra"]) == (0, 0, 0), run
    assert run["processes_exited_unkilled"] == [] and run["processes_hung_at_stop"] == []


# The policy server is killed while RUN restarts: RUN then waits for a usable server. A server
# gone mid-turn for longer than RUN's retry budget ends that episode as infra by design
# (tests/stages/test_run_routing.py); the benchmark reports that case per fault.
KINDS = ["partition-leader", "init", "eval", "run", "policy"]


@pytest.mark.timeout(900)  # the cluster's start, when this test runs alone
def test_two_jobs_through_every_kind_of_kill_lose_and_duplicate_nothing(
        three_nodes: str, tmp_path: Path) -> None:
    # One fault a second from the first scored episodes, without waiting for throughput to
    # come back (that is timing, the benchmark's): each kill lands while both jobs have work.
    # Each job is paced at 8 turns a second (its quota): its 48 episodes (168 turns with the
    # scripted guesses) take at least 21 s, longer than the five faults, on a fast machine too.
    # Unpaced, both jobs were done 7.2 s after the start, before the first fault.
    result = chaos_jobs.measure(three_nodes, tmp_path, episodes=48, kinds=KINDS,
                                faults=len(KINDS), interval=1, timeout_s=300, baseline=False,
                                settle_max_s=0, grace_s=3, turns_per_s=8)
    run = result["with_faults"]
    for job, figures in run["jobs"].items():
        assert [f["kind"] for f in figures["fault_log"]] == KINDS, (
            job, figures["total_s"], figures["fault_log"])
        assert figures["expected"] == 48
        assert (figures["lost"], figures["duplicated"], figures["infra"]) == (0, 0, 0), (
            job, figures)
        # Every kill came before the job's last episode was scored: none hit an idle fleet.
        assert all(f["at"] < figures["total_s"] for f in figures["fault_log"]), (
            job, figures["total_s"], figures["fault_log"])
    assert run["processes_exited_unkilled"] == [] and run["processes_hung_at_stop"] == []


@pytest.mark.timeout(900)  # the cluster's start, when this test runs alone
def test_a_run_process_killed_among_long_episodes_resumes_each_from_its_turns(
        three_nodes: str, tmp_path: Path) -> None:
    """The at_scale benchmark, small: RUN process 0 is SIGKILLed once 40% of the turns are
    checkpointed and restarted; the episodes it held resume at the turns they reached, and
    every trajectory holds each turn once."""
    size = at_scale.Size(episodes=96, turns=6, processes=2, prompt_tokens=200)
    with Fleet(at_scale.servers(1)) as fleet:
        result = at_scale.measure(size, tmp_path, three_nodes, fleet.urls, os.getpid(),
                                  lambda: at_scale.decoded(fleet), timeout_s=600)
    assert (result["trajectories"], result["lost"], result["duplicated"]) == (96, 0, 0), result
    kill = result["kill"]
    # Most resume from their turns; one with no turn checkpointed yet (a long tool call) starts
    # again, and one that ended just before the kill may be read back late on a busy machine.
    assert kill["resumed"] >= kill["episodes_held"] // 2 > 0, kill
    assert kill["median_resumed_at_turn"] >= 1, kill  # from its turns, not from the start
    resumed = result["resumed_trajectories"]
    assert resumed["checked"] >= kill["episodes_held"] and resumed["not_whole"] == 0, resumed
