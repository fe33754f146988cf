"""The Helm chart (deploy/helm/rollstream), offline: `helm lint` and `helm template` with the
Helm that `make helm-deps` builds; every rendered object decoded strictly by
deploy/helm/validate (Kubernetes' own API types; KEDA's, Strimzi's and Prometheus Operator's
CRD schemas, as an API server prunes and validates); and the chart against the topic graph:
a KafkaTopic per topic, a StatefulSet and ScaledObject per stage, probes on served ports."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from rollstream.contracts import graph
from rollstream.deploy import chart
from tests.helpers.helm_helpers import CHART, CRDS, HELM, HELM_DIR, VALIDATE

CI_VALUES = CHART / "ci" / "test-values.yaml"
KEDA_KAFKA_SCALER = HELM_DIR / "keda" / "kafka_scaler.go"
CRD_FILES = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml",
             "monitoring.coreos.com_servicemonitors.yaml", "strimzi_kafkatopics.yaml",
             "strimzi_kafkausers.yaml")

pytestmark = pytest.mark.skipif(
    not (HELM.exists() and VALIDATE.exists()),
    reason="Helm and the validator are not built: run `make helm-deps` (needs Go)")


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)


@cache
def rendered_text() -> str:
    result = helm("template", "rs", str(CHART), "-f", str(CI_VALUES))
    assert result.returncode == 0, result.stderr
    return result.stdout


@cache
def rendered() -> tuple[dict, ...]:
    return tuple(d for d in yaml.safe_load_all(rendered_text()) if d)


def of_kind(kind: str) -> list[dict]:
    return [copy.deepcopy(d) for d in rendered() if d["kind"] == kind]


def validate(path: Path) -> subprocess.CompletedProcess:
    missing = [n for n in CRD_FILES if not (CRDS / n).exists()]
    assert not missing, f"CRDs {missing} are missing: run `make helm-deps`"
    return subprocess.run([str(VALIDATE), "-crds", str(CRDS), str(path)], capture_output=True,
                          text=True, timeout=120)


def test_lint_passes_with_default_and_test_values() -> None:
    for extra in ([], ["-f", str(CI_VALUES)]):
        result = helm("lint", "--strict", str(CHART), *extra)
        assert result.returncode == 0, result.stdout + result.stderr


def test_without_inference_servers_the_chart_refuses_to_render() -> None:
    result = helm("template", "rs", str(CHART))
    assert result.returncode != 0
    assert "no inference servers: set inference.urls" in result.stderr


def test_every_rendered_object_decodes_strictly(tmp_path: Path) -> None:
    manifests = tmp_path / "rendered.yaml"
    manifests.write_text(rendered_text())
    result = validate(manifests)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(rendered())
    assert all(line.startswith("ok ") for line in lines)
    kinds = {d["kind"] for d in rendered()}
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget",
            "ScaledObject", "TriggerAuthentication", "KafkaTopic", "KafkaUser",
            "ServiceMonitor"} <= kinds


def test_the_validator_refuses_what_an_api_server_would(tmp_path: Path) -> None:
    """Each object broken in one place: an unknown field of a built-in kind, a field a CRD
    does not have (pruned), a value outside a CRD's enum."""
    [run] = [d for d in of_kind("StatefulSet") if d["metadata"]["name"] == "rs-run"]
    run["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    [scaled] = [d for d in of_kind("ScaledObject") if d["metadata"]["name"] == "rs-run"]
    scaled["spec"]["maxReplicas"] = 3
    [user] = of_kind("KafkaUser")
    user["spec"]["authorization"]["acls"][0]["resource"]["type"] = "topics"
    [topic] = of_kind("KafkaTopic")[:1]
    topic["spec"]["retention"] = 1
    manifests = tmp_path / "broken.yaml"
    manifests.write_text(yaml.safe_dump_all([run, scaled, user, topic]))
    result = validate(manifests)
    assert result.returncode == 1
    failures = result.stdout.splitlines()
    assert len(failures) == 4 and all(f.startswith("FAIL ") for f in failures), result.stdout
    assert 'unknown field "spec.template.spec.containers[0].livenessProbes"' in failures[0]
    assert "unknown field spec.maxReplicas" in failures[1]
    assert 'Unsupported value: "topics"' in failures[2]
    assert "unknown field spec.retention" in failures[3]


def test_graph_file_matches_the_graph() -> None:
    assert chart.main(["--check"]) == 0, "run python -m rollstream.deploy.chart"


def test_a_topic_added_to_the_graph_without_the_chart_fails(monkeypatch) -> None:
    extra = graph.Topic("extra", "extra", "", "k", "a new topic", writers=("producers",))
    monkeypatch.setattr(chart, "GRAPH", (*graph.GRAPH, extra))
    assert chart.main(["--check"]) == 1


def test_every_topic_of_the_graph_has_a_kafka_topic() -> None:
    topics = {d["spec"]["topicName"]: d["spec"] for d in of_kind("KafkaTopic")}
    names = graph.Topics("rollstream")
    assert set(topics) == {t.name(names) for t in graph.GRAPH}
    for t in graph.GRAPH:
        spec = topics[t.name(names)]
        assert spec["partitions"] == graph.partition_count(t, 8)
        assert spec["config"] == t.config


def test_every_stage_has_a_statefulset_and_a_scaled_object_on_its_group() -> None:
    sets = {d["metadata"]["name"]: d for d in of_kind("StatefulSet")}
    scaled = {d["metadata"]["name"]: d for d in of_kind("ScaledObject")}
    for stage in graph.STAGES:
        statefulset = sets[f"rs-{stage}"]
        [container] = statefulset["spec"]["template"]["spec"]["containers"]
        assert container["args"] == ["stage", stage]
        env = {e["name"]: e for e in container["env"]}
        assert env["ROLLSTREAM_INSTANCE_ID"]["value"] == "$(POD_NAME)"
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        spec = scaled[f"rs-{stage}"]["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                          "name": f"rs-{stage}"}
        assert spec["maxReplicaCount"] == 8  # the partitions
        [trigger] = spec["triggers"]
        assert trigger["type"] == "kafka"
        assert trigger["metadata"]["consumerGroup"] == f"rollstream.{stage}"
        assert trigger["metadata"]["topic"] == graph.input_of(stage).name(
            graph.Topics("rollstream"))
        # A caught-up pipeline shows 1 per partition: that lag must not activate a stage.
        assert int(trigger["metadata"]["activationLagThreshold"]) >= 8


def test_trigger_metadata_keys_are_ones_kedas_kafka_scaler_reads() -> None:
    assert KEDA_KAFKA_SCALER.exists(), "KEDA's scaler source is missing: run `make helm-deps`"
    known = set(re.findall(r'keda:"name=(\w+)', KEDA_KAFKA_SCALER.read_text()))
    assert {"lagThreshold", "activationLagThreshold", "consumerGroup"} <= known
    for scaled in of_kind("ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            assert set(trigger["metadata"]) <= known, set(trigger["metadata"]) - known


def served_port(container: dict, settings: dict[str, str]) -> int:
    """The port the container's process listens on, from its command line or settings."""
    for arg in container.get("args", []):
        if m := re.fullmatch(r"--port=(\d+)", arg):
            return int(m.group(1))
    args = container.get("args", [])
    if "--port" in args:
        return int(args[args.index("--port") + 1])
    # Rollstream processes: /metrics, /health and /ready on ROLLSTREAM_METRICS_PORT.
    assert container["envFrom"][0]["configMapRef"]["name"] == "rs-settings"
    return int(settings["ROLLSTREAM_METRICS_PORT"])


def test_every_probe_points_at_the_port_its_process_serves() -> None:
    [config] = of_kind("ConfigMap")
    probes = 0
    for workload in of_kind("StatefulSet") + of_kind("Deployment"):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            served = served_port(container, config["data"])
            for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
                if kind not in container:
                    continue
                port = container[kind]["httpGet"]["port"]
                number = ports[port] if isinstance(port, str) else port
                assert number == served, (workload["metadata"]["name"], kind, number, served)
                assert container[kind]["httpGet"]["path"] in {"/health", "/ready"}
                probes += 1
    assert probes >= 3 * 7  # three on each Rollstream process


def test_helm_is_the_pinned_one() -> None:
    # Built from its module, Helm reports only "v3.22"; the module version is in the binary.
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed: the binary's module version cannot be read")
    info = subprocess.run([go, "version", "-m", str(HELM)], capture_output=True, text=True,
                          check=True).stdout
    assert re.search(r"\bmod\s+helm\.sh/helm/v3\s+v3\.22\.0\s", info), info
