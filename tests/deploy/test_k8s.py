"""The chart installed with Helm on a real single-node Kubernetes (tests/helpers/k8s_cluster.py),
as docs/deploy.md's "A single-node cluster" says: Strimzi's CRDs applied to the API server (which
then validates the chart's KafkaTopics and KafkaUser), the bundled broker as a StatefulSet, KEDA's
operator and metrics adapter in the cluster, the checkpoints volume a PersistentVolume, and every
Rollstream pod on the locally built image. Published tasks are each scored once; KEDA scales RUN
up on its lag and back to its minimum; a RUN pod killed mid-run changes no count.

Its own session (`pytest -m k8s`, the last of `make test`): it takes the host's network and
runs as root."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from sybil.evaluators.skip import Skipper

from producers.publish import publish, validate_task
from rollstream import config
from tests.docs.blocks import Page, mark_reason, parse, run_shell
from tests.helpers import k8s_cluster
from tests.helpers.api_helpers import scored
from tests.helpers.helm_helpers import CHART, HELM, ROOT

# Cluster start (images imported), the install, then bursts of episodes on a 2-core node.
pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.timeout(1800)]

RELEASE, PREFIX, PARTITIONS = "rs", "k8s", 4  # as single-node-values.yaml has them
BOOTSTRAP = f"{k8s_cluster.NODE_IP}:19092"
PAGE = ROOT / "docs" / "deploy.md"
RUN_HERE = "tests/deploy/test_k8s.py starts one and runs this block on it"  # the block's mark
CHECKPOINTS = Path("/var/lib/rollstream/checkpoints")  # single-node-checkpoints.yaml's


def _install_block() -> str:
    """The block of docs/deploy.md marked as run here: the commands, as a user pastes them."""
    skipped = False
    for example in parse(PAGE):
        if isinstance(example.region.evaluator, Skipper):
            skipped = mark_reason(example).endswith(RUN_HERE)
        elif skipped:
            return str(example.region.parsed)
    raise AssertionError(f"{PAGE.name} has no block whose mark ends {RUN_HERE!r}")


def _replicas(cluster: k8s_cluster.Cluster, stage: str) -> int:
    return int(cluster.kubectl("get", "statefulset", f"{RELEASE}-{stage}", "-o",
                               "jsonpath={.spec.replicas}") or 0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    reason = k8s_cluster.missing() or (
        None if HELM.exists() else "Helm is not built: make helm-deps")
    if reason:
        pytest.skip(f"no Kubernetes here: {reason}")
    work = tmp_path_factory.mktemp("k8s")
    running = k8s_cluster.Cluster(work)
    try:
        running.start()
        yield running
    except BaseException:
        for name in running.procs.procs:
            print(f"--- {name}\n{running.procs.log_tail(name, 15)}")
        raise
    finally:
        running.stop()


@pytest.fixture(scope="module")
def release(cluster: k8s_cluster.Cluster, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """docs/deploy.md's install block run on the cluster; every Rollstream pod ready."""
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)  # a previous run's policy versions
    page = Page("docs/deploy.md", tmp_path_factory.mktemp("page"),
                {**cluster.env(), "PATH": f"{Path(sys.executable).parent}:{cluster.env()['PATH']}"},
                PREFIX)
    page.cwd = ROOT  # the volumes' paths are the checkout's own ($PWD)
    began = time.monotonic()
    # The block ends once every Rollstream pod is ready.
    print(run_shell(page, _install_block(), "the install block", timeout=900)[-3000:])
    cluster.timings["install_s"] = round(time.monotonic() - began, 1)
    print(f"set-up times (s): {cluster.timings}")
    yield config.load(None, bootstrap_servers=BOOTSTRAP, prefix=PREFIX, partitions=PARTITIONS)
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)


def _tasks(first: int, n: int, turns: int) -> list[dict]:
    """guess_number tasks of 8 episodes: up to `turns` requests to the policy each."""
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4, "seed": None}
    return [validate_task({"task_id": f"k8s-{i}", "env": "guess_number",
                           "prompt": "Guess 0-99.", "data": {"secret": i % 100, "low": 0,
                                                              "high": 99},
                           "max_turns": turns, "group_size": 8, "sampling": sampling})
            for i in range(first, first + n)]


def _wait_scored(cluster: k8s_cluster.Cluster, settings: config.Settings, episodes: int,
                 timeout: float) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}

    def all_scored() -> bool:
        nonlocal found
        found = scored(settings)
        return len(found) >= episodes

    cluster.wait_for(all_scored, timeout, f"{episodes} episodes scored")
    return found


def test_the_installed_chart_scores_every_episode_once(
        cluster: k8s_cluster.Cluster, release: config.Settings,
        record_property: pytest.RecordProperty) -> None:
    record_property(k8s_cluster.SET_UP, cluster.timings)  # the session's summary prints it
    tasks = _tasks(0, 4, turns=2)
    publish(release, tasks)
    found = _wait_scored(cluster, release, 32, timeout=300)
    assert {len(records) for records in found.values()} == {1}, "an episode scored twice"
    records = [r for rs in found.values() for r in rs]
    assert {r["trajectory"]["task"]["task_id"] for r in records} == {t["task_id"] for t in tasks}
    # RUN reached the policy server through its Service's name (CoreDNS, kube-proxy).
    assert [r["failure_class"] for r in records if r["failure_class"] == "infra"] == []
    # The API server validated the chart's Strimzi objects against Strimzi's CRDs.
    graph = json.loads((CHART / "graph.json").read_text())
    assert len(cluster.kubectl("get", "kafkatopics", "-o", "name").split()) == len(graph["topics"])
    assert cluster.kubectl("get", "kafkauser", RELEASE, "-o", "name") == \
        f"kafkauser.kafka.strimzi.io/{RELEASE}"


def test_keda_scales_run_on_its_lag_and_a_killed_run_pod_changes_no_count(
        cluster: k8s_cluster.Cluster, release: config.Settings) -> None:
    before = len(scored(release))
    assert _replicas(cluster, "run") == 1, "RUN is not at its minimum before the load"
    tasks = _tasks(1000, 128, turns=8)  # 1,024 episodes: work left once RUN has scaled
    publish(release, tasks)
    # KEDA's metrics adapter feeds the HPA RUN's committed lag: more replicas.
    try:
        cluster.wait_for(lambda: _replicas(cluster, "run") >= 2, 180, "RUN scaled above 1")
    except AssertionError:
        _print_scaling(cluster)
        raise
    scaled_to = _replicas(cluster, "run")
    # A RUN pod killed mid-run (no grace: SIGKILL): its episodes resume elsewhere, once.
    cluster.kubectl("delete", "pod", f"{RELEASE}-run-0", "--grace-period=0", "--force")
    assert len(scored(release)) < before + 8 * len(tasks), "the burst ended before the kill"
    found = _wait_scored(cluster, release, before + 8 * len(tasks), timeout=600)
    assert {len(records) for records in found.values()} == {1}, "an episode scored twice"
    assert len(found) == before + 8 * len(tasks)
    # Caught up, the lag is 0 (commit markers not counted): back to the minimum.
    try:
        cluster.wait_for(lambda: _replicas(cluster, "run") == 1, 240, "RUN back to 1 replica")
    except AssertionError:
        _print_scaling(cluster)
        raise
    print(f"RUN scaled 1 -> {scaled_to} -> 1; {len(found)} episodes scored once")


def test_a_caught_up_stage_scales_to_zero_and_wakes_on_its_next_event(
        cluster: k8s_cluster.Cluster, release: config.Settings) -> None:
    """EVAL (minReplicas 0) reads RUN's transactional output: the commit markers left on it
    count as no lag, so it goes to zero; the next trajectory wakes it."""
    before = len(scored(release))
    cluster.wait_for(lambda: _replicas(cluster, "eval") == 0, 240, "EVAL scaled to zero")
    tasks = _tasks(2000, 2, turns=2)
    publish(release, tasks)
    # Scored means EVAL woke: with no replica nothing scores them.
    found = _wait_scored(cluster, release, before + 16, timeout=300)
    assert {len(records) for records in found.values()} == {1}, "an episode scored twice"


def _print_scaling(cluster: k8s_cluster.Cluster) -> None:
    """What KEDA and the HPA saw, for a scaling that did not happen."""
    for args in (("get", "scaledobject", f"{RELEASE}-run", "-o", "jsonpath={.status}"),
                 ("get", "hpa", "-o", "wide"), ("describe", "hpa"),
                 ("get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o",
                  "jsonpath={.status}"),
                 ("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1"),
                 ("logs", "-n", "keda", "deployment/keda-operator", "--tail=30"),
                 ("logs", "-n", "keda", "deployment/keda-metrics-apiserver", "--tail=30")):
        print(f"--- kubectl {' '.join(args)}\n{cluster.kubectl(*args, check=False)[-3000:]}")
