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
from tests.helpers.helm_helpers import CHART, CRDS, HELM, HELM_DIR, ROOT, VALIDATE

CI_VALUES = CHART / "ci" / "test-values.yaml"
# The sources of KEDA's scalers the chart's triggers use, whose tags list the keys each reads.
KEDA_SCALERS = {"kafka": "kafka_scaler.go", "metrics-api": "metrics_api_scaler.go",
                "prometheus": "prometheus_scaler.go"}
CRD_FILES = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml",
             "monitoring.coreos.com_servicemonitors.yaml", "strimzi_kafkatopics.yaml",
             "strimzi_kafkausers.yaml")

pytestmark = pytest.mark.skipif(
    not (HELM.exists() and VALIDATE.exists()),
    reason="Helm and the validator are not built: run `make helm-deps` (needs Go)")


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)


@cache
def rendered_text(*sets: str) -> str:
    """The chart rendered with the CI values and `--set` each of `sets`."""
    result = helm("template", "rs", str(CHART), "-f", str(CI_VALUES),
                  *(a for s in sets for a in ("--set", s)))
    assert result.returncode == 0, result.stderr
    return result.stdout


@cache
def rendered(*sets: str) -> tuple[dict, ...]:
    return tuple(d for d in yaml.safe_load_all(rendered_text(*sets)) if d)


def of_kind(kind: str, *sets: str) -> list[dict]:
    return [copy.deepcopy(d) for d in rendered(*sets) if d["kind"] == kind]


def named(kind: str, name: str, *sets: str) -> dict:
    [found] = [d for d in of_kind(kind, *sets) if d["metadata"]["name"] == name]
    return found


def validates(tmp_path: Path, *sets: str) -> None:
    manifests = tmp_path / "rendered.yaml"
    manifests.write_text(rendered_text(*sets))
    result = validate(manifests)
    assert result.returncode == 0, result.stdout + result.stderr


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
            "ScaledObject", "KafkaTopic", "KafkaUser", "ServiceMonitor", "Job"} <= kinds


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
        # By default the lag is Rollstream's own count, which skips transaction markers, read
        # from the status Deployment's /metrics (its Service, port 9400).
        [trigger] = spec["triggers"]
        assert trigger["type"] == "metrics-api"
        assert trigger["metadata"]["url"] == "http://rs-status.default.svc:9400/metrics"
        assert trigger["metadata"]["format"] == "prometheus"
        assert trigger["metadata"]["valueLocation"] == (
            f'rollstream_stage_lag_events{{stage="{stage}"}}')
        assert trigger["metadata"]["activationTargetValue"] == "0"
    status = named("Deployment", "rs-status")
    assert status["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
        "status", "--watch"]
    assert named("Service", "rs-status")["spec"]["ports"][0]["port"] == 9400


def test_with_kafkas_lag_a_caught_up_stage_is_not_activated_by_commit_markers() -> None:
    for scaled in of_kind("ScaledObject", "autoscaling.lagSource=kafka"):
        stage = scaled["metadata"]["name"].removeprefix("rs-")
        [trigger] = scaled["spec"]["triggers"]
        assert trigger["type"] == "kafka"
        assert trigger["metadata"]["consumerGroup"] == f"rollstream.{stage}"
        assert trigger["metadata"]["topic"] == graph.input_of(stage).name(
            graph.Topics("rollstream"))
        # A caught-up pipeline shows 1 per partition: that lag must not activate a stage.
        assert int(trigger["metadata"]["activationLagThreshold"]) >= 8


def test_lag_from_status_needs_the_status_deployment() -> None:
    result = helm("template", "rs", str(CHART), "-f", str(CI_VALUES),
                  "--set", "status.enabled=false")
    assert result.returncode != 0
    assert ("autoscaling.lagSource status reads the lag `rollstream status --watch`"
            in result.stderr)
    result = helm("template", "rs", str(CHART), "-f", str(CI_VALUES),
                  "--set", "autoscaling.lagSource=kafkas")
    assert result.returncode != 0
    assert ('autoscaling.lagSource must be status, prometheus or kafka, not "kafkas"'
            in result.stderr)


@pytest.mark.parametrize("source", ["status", "prometheus", "kafka"])
def test_trigger_metadata_keys_are_ones_kedas_scalers_read(source: str, tmp_path: Path) -> None:
    sets = (f"autoscaling.lagSource={source}",)
    validates(tmp_path, *sets)
    for scaled in of_kind("ScaledObject", *sets):
        for trigger in scaled["spec"]["triggers"]:
            scaler = HELM_DIR / "keda" / KEDA_SCALERS[trigger["type"]]
            assert scaler.exists(), f"KEDA's {scaler.name} is missing: run `make helm-deps`"
            known = set(re.findall(r'keda:"name=(\w+)', scaler.read_text()))
            assert set(trigger["metadata"]) <= known, set(trigger["metadata"]) - known


def rollstream_pods(*sets: str) -> list[dict]:
    """The pod specs of every workload that runs a Rollstream process talking to Kafka."""
    pods = []
    for workload in of_kind("StatefulSet", *sets) + of_kind("Deployment", *sets):
        pod = workload["spec"]["template"]["spec"]
        if any(c["image"].startswith("rollstream:") and "serve-policy" not in c["args"]
               for c in pod["containers"]):
            pods.append(pod)
    return pods


def init_env(pod: dict) -> dict[str, dict]:
    [init] = [c for c in pod["initContainers"] if c["name"] == "kafka-config"]
    return {e["name"]: e for e in init["env"]}


def test_the_kafka_users_secret_and_the_cluster_ca_reach_every_process_and_keda(
        tmp_path: Path) -> None:
    """Strimzi (the default): the User Operator writes the KafkaUser's password to a Secret
    named after it; the cluster CA is in <cluster>-cluster-ca-cert."""
    sets = ("autoscaling.lagSource=kafka",)
    validates(tmp_path, *sets)
    [user] = of_kind("KafkaUser", *sets)
    name = user["metadata"]["name"]
    assert user["spec"]["authentication"]["type"] == "scram-sha-512"
    config = named("ConfigMap", "rs-settings", *sets)
    assert config["data"]["ROLLSTREAM_KAFKA_CONFIG"] == "/etc/rollstream/kafka/client.properties"
    pods = rollstream_pods(*sets)
    assert len(pods) == 3 + 5  # the stages; controller, trainer, status, stats, api
    for pod in pods:
        env = init_env(pod)
        assert env["KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
        assert env["KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
        assert env["KAFKA_SASL_USERNAME"]["value"] == name
        assert env["KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": name, "key": "password"}
        assert env["KAFKA_SSL_CA_LOCATION"]["value"] == "/etc/rollstream/kafka-ca/ca.crt"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["kafka-ca"]["secret"] == {
            "secretName": "my-cluster-cluster-ca-cert",
            "items": [{"key": "ca.crt", "path": "ca.crt"}]}
        assert volumes["kafka-config"] == {"name": "kafka-config",
                                           "emptyDir": {"medium": "Memory"}}
        for container in pod["containers"]:
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts["kafka-config"] == "/etc/rollstream/kafka"
            assert mounts["kafka-ca"] == "/etc/rollstream/kafka-ca"
    [auth] = of_kind("TriggerAuthentication", *sets)
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert refs["password"] == {"parameter": "password", "name": name, "key": "password"}
    assert refs["ca"] == {"parameter": "ca", "name": "my-cluster-cluster-ca-cert",
                          "key": "ca.crt"}
    scaler = named("Secret", "rs-kafka-scaler", *sets)["stringData"]
    assert {p: scaler[refs[p]["key"]] for p in ("sasl", "tls", "username")} == {
        "sasl": "scram_sha512", "tls": "enable", "username": name}
    for scaled in of_kind("ScaledObject", *sets):
        [trigger] = scaled["spec"]["triggers"]
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}


def test_credentials_a_user_brings_without_strimzi(tmp_path: Path) -> None:
    sets = ("autoscaling.lagSource=kafka", "kafka.strimzi.enabled=false",
            "kafka.authentication=credentials", "kafka.credentials.secretName=mine",
            "kafka.credentials.mechanism=SCRAM-SHA-256", "kafka.credentials.caSecretName=myca",
            "kafka.credentials.caKey=ca.pem")
    validates(tmp_path, *sets)
    assert not of_kind("KafkaUser", *sets)
    for pod in rollstream_pods(*sets):
        env = init_env(pod)
        assert env["KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {
            "name": "mine", "key": "username"}
        assert env["KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "mine", "key": "password"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["kafka-ca"]["secret"]["secretName"] == "myca"
        assert volumes["kafka-ca"]["secret"]["items"] == [{"key": "ca.pem", "path": "ca.crt"}]
    [auth] = of_kind("TriggerAuthentication", *sets)
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs["username"] == ("mine", "username") and refs["password"] == ("mine", "password")
    assert refs["ca"] == ("myca", "ca.pem")
    assert named("Secret", "rs-kafka-scaler", *sets)["stringData"]["sasl"] == "scram_sha256"


@pytest.mark.parametrize(("sets", "error"), [
    (["kafka.authentication=credentials"], "kafka.authentication credentials needs "
     "kafka.credentials.secretName"),
    (["kafka.existingSecret=props"], "kafka.existingSecret is a complete client.properties: "
     'set kafka.authentication to none, not "strimzi"'),
    (["kafka.strimzi.user.enabled=false"], "kafka.authentication strimzi needs the chart's "
     "KafkaUser"),
    (["kafka.authentication=scram"], "kafka.authentication must be strimzi, credentials or "
     'none, not "scram"'),
])
def test_credentials_that_cannot_work_refuse_to_render(sets: list[str], error: str) -> None:
    result = helm("template", "rs", str(CHART), "-f", str(CI_VALUES),
                  *(a for s in sets for a in ("--set", s)))
    assert result.returncode != 0
    assert error in result.stderr


def test_without_authentication_the_rendered_secret_is_the_client_properties() -> None:
    sets = ("kafka.authentication=none", "kafka.clientProperties=security.protocol=SSL")
    for pod in rollstream_pods(*sets):
        assert all(c["name"] != "kafka-config" for c in pod.get("initContainers", []))
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["kafka-config"]["secret"] == {"secretName": "rs-kafka"}
    assert named("Secret", "rs-kafka", *sets)["stringData"]["client.properties"] == (
        "security.protocol=SSL")
    assert not of_kind("TriggerAuthentication", *sets)


def test_the_trained_model_reaches_the_inference_servers_through_the_checkpoints_volume(
        ) -> None:
    """The trainer writes policy versions into the checkpoints claim; vLLM and the embedded
    server mount the same claim read-only at the same path, so the path a PolicyVersion names
    is one they can load; vLLM serves, RUN tokenizes with and the trainer starts from the
    model the download Job put there."""
    mount = "/checkpoints"

    def claim_mounts(pod: dict, claim: str = "checkpoints") -> list[tuple[str, bool]]:
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in pod.get("volumes", []) if "persistentVolumeClaim" in v}
        return [(m["mountPath"], m.get("readOnly", False))
                for c in pod["containers"] for m in c.get("volumeMounts", [])
                if claims.get(m["name"]) == claim]

    trainer = named("Deployment", "rs-trainer")["spec"]["template"]["spec"]
    args = trainer["containers"][0]["args"]
    assert args[0] == "train"
    assert args[args.index("--checkpoint-dir") + 1].startswith(mount + "/")
    model = args[args.index("--hf-model") + 1]
    assert model.startswith(mount + "/")
    assert claim_mounts(trainer) == [(mount, False)]
    for name in ("rs-vllm-0", "rs-vllm-1", "rs-policy"):
        pod = named("Deployment", name)["spec"]["template"]["spec"]
        assert claim_mounts(pod) == [(mount, True)], name
    vllm = named("Deployment", "rs-vllm-0")["spec"]["template"]["spec"]
    [server] = vllm["containers"]
    assert f"--model={model}" in server["args"]
    assert "--enable-prefix-caching" in server["args"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    run = named("StatefulSet", "rs-run")["spec"]["template"]["spec"]
    run_env = {e["name"]: e.get("value") for e in run["containers"][0]["env"]}
    assert run_env["ROLLSTREAM_TOKENIZER_PATH"] == model
    assert claim_mounts(run) == [(mount, True)]
    [job] = of_kind("Job")
    pod = job["spec"]["template"]["spec"]
    assert claim_mounts(pod) == [(mount, False)]
    assert pod["containers"][0]["command"][-2:] == ["Qwen/Qwen3-4B-Instruct-2507", model]
    # The servers and the trainer wait for the download to finish.
    for spec in (vllm, trainer):
        [wait] = [c for c in spec["initContainers"] if c["name"] == "wait-for-model"]
        assert f"{model}/.downloaded" in wait["command"][-1]
    # Without an existing claim the chart makes one, kept when the release goes.
    made = named("PersistentVolumeClaim", "rs-checkpoints", "checkpoints.existingClaim=")
    assert made["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert made["spec"]["accessModes"] == ["ReadWriteMany"]
    trainer = named("Deployment", "rs-trainer", "checkpoints.existingClaim=")
    assert claim_mounts(trainer["spec"]["template"]["spec"], "rs-checkpoints") == [
        (mount, False)]


def test_the_vllm_version_is_the_one_the_suite_runs_everywhere() -> None:
    makefile = (ROOT / "Makefile").read_text()
    [version] = re.findall(r"^VLLM_VERSION \?= (\S+)$", makefile, re.M)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["inference"]["vllm"]["image"] == f"vllm/vllm-openai:v{version}"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["vllm"]["image"] == f"vllm/vllm-openai:v{version}"
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert set(re.findall(r"vllm/vllm-openai:([\w.]+)", docs)) == {f"v{version}"}


def test_make_image_builds_the_tag_the_chart_runs() -> None:
    out = subprocess.run(["make", "-s", "-n", "image"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f"-t rollstream:{chart_meta['appVersion']} " in out
    [image] = {c["image"] for pod in rollstream_pods() for c in pod["containers"]}
    assert image == f"rollstream:{chart_meta['appVersion']}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{chart_meta["appVersion"]}"' in pyproject


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
    config = named("ConfigMap", "rs-settings")
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
