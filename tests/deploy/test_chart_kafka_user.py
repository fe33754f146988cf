"""The chart's Kafka credentials against a real secured broker (SASL_SSL, SCRAM-SHA-512, ACLs
enforced): the test plays Strimzi's User Operator for the rendered KafkaUser (a SCRAM-SHA-512
user named after it, the ACLs of its spec, its password in a Secret named after it; the broker's
CA as the cluster CA Secret) and the kubelet for a stage pod (the init container's environment
from those Secrets, its volumes as files under a directory standing for the pod's root). The
rendered kafka-config init container's command writes client.properties there, and INIT, RUN
and EVAL reading that file, as the KafkaUser and with only its ACLs, score every episode."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from producers.publish import publish, validate_task
from rollstream import config
from rollstream.broker.secure import Material
from rollstream.cluster import acl, kafka
from rollstream.contracts.graph import STAGES
from rollstream.dev.processes import ProcessGroup
from tests.helpers.helm_helpers import CHART, HELM

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HELM.exists(), reason="Helm is not built: run `make helm-deps`"),
]


# Strimzi's names in a KafkaUser's ACLs -> Kafka's.
RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
             "transactionalId": ResourceType.TRANSACTIONAL_ID}
PATTERNS = {"literal": ResourcePatternType.LITERAL, "prefix": ResourcePatternType.PREFIXED}


def render(prefix: str, bootstrap: str) -> list[dict]:
    sets = ("inference.embedded=true", f"prefix={prefix}", "partitions=2",
            f"kafka.bootstrapServers={bootstrap}",
            # Over the credentials: a setting the user adds (librdkafka's default, spelt out).
            "kafka.clientProperties=ssl.endpoint.identification.algorithm=https")
    result = subprocess.run(
        [str(HELM), "template", "rs", str(CHART), *(a for s in sets for a in ("--set", s))],
        capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def strimzi_user(admin: AdminClient, user: dict) -> str:
    """What Strimzi's User Operator does for a scram-sha-512 KafkaUser with simple
    authorization: the SCRAM credential and the ACLs of its spec; the password it puts in the
    Secret named after the user."""
    name, spec = user["metadata"]["name"], user["spec"]
    assert spec["authentication"]["type"] == "scram-sha-512"
    password = secrets.token_urlsafe(12)
    acl.set_password(admin, name, password, 30, "SCRAM-SHA-512")
    bindings = [
        AclBinding(RESOURCES[rule["resource"]["type"]], rule["resource"]["name"],
                   PATTERNS[rule["resource"]["patternType"]], f"User:{name}", "*",
                   # Strimzi's Read, DescribeConfigs: Kafka's READ, DESCRIBE_CONFIGS
                   AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", op).upper()],
                   AclPermissionType.ALLOW)
        for rule in spec["authorization"]["acls"] for op in rule["operations"]]
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result()
    return password


def pod_root_path(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def run_init_container(pod: dict, objects: dict[tuple[str, str], dict],
                       secret_data: dict[str, dict[str, str]], root: Path) -> Path:
    """The kafka-config init container as the kubelet runs it, under `root`: its volumes'
    files, its environment, its command. The client.properties it writes."""
    [init] = [c for c in pod["initContainers"] if c["name"] == "kafka-config"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in init["volumeMounts"] + [{"name": "kafka-ca",
                                          "mountPath": "/etc/rollstream/kafka-ca"}]:
        target = pod_root_path(root, mount["mountPath"])
        target.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            data = secret_data.get(name) or objects[("Secret", name)]["stringData"]
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (target / item["path"]).write_text(data[item["key"]])
        elif "configMap" in volume:
            for key, text in objects[("ConfigMap", volume["configMap"]["name"])]["data"].items():
                (target / key).write_text(text)
    env = {}
    for e in init["env"]:
        if "value" in e:
            value = e["value"]
            env[e["name"]] = (str(pod_root_path(root, value)) if value.startswith("/etc/")
                              else value)
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = secret_data[ref["name"]][ref["key"]]
    python, *args = init["command"]
    assert python == "python"
    argv = [sys.executable, *(str(pod_root_path(root, a)) if a.startswith("/etc/") else a
                              for a in args)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return pod_root_path(root, "/etc/rollstream/kafka/client.properties")


def test_stages_score_as_the_kafka_user_with_the_properties_the_pod_writes(
        secured: tuple[str, Material], tmp_path: Path) -> None:
    bootstrap, material = secured
    prefix = f"k{secrets.token_hex(4)}"
    objects = {(d["kind"], d["metadata"]["name"]): d for d in render(prefix, bootstrap)}
    [user] = [d for (kind, _), d in objects.items() if kind == "KafkaUser"]
    admin = AdminClient(material.admin_conf(bootstrap))
    password = strimzi_user(admin, user)
    secret_data = {user["metadata"]["name"]: {"password": password},
                   "my-cluster-cluster-ca-cert": {"ca.crt": material.ca.read_text()}}

    pod = objects[("StatefulSet", "rs-run")]["spec"]["template"]["spec"]
    properties = run_init_container(pod, objects, secret_data, tmp_path / "pod")
    props = config.read_properties(properties)
    assert props == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "rs", "sasl.password": password,
        "ssl.ca.location": str(tmp_path / "pod/etc/rollstream/kafka-ca/ca.crt"),
        "ssl.endpoint.identification.algorithm": "https"}
    assert properties.stat().st_mode & 0o777 == 0o600

    settings = config.load(bootstrap_servers=bootstrap, prefix=prefix, partitions=2,
                           kafka_config=str(properties))
    common = ["--bootstrap-servers", bootstrap, "--prefix", prefix,
              "--kafka-config", str(properties)]
    made = subprocess.run([sys.executable, "-m", "rollstream.cli", "topics", "create",
                           *common, "--partitions", "2"], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    procs = ProcessGroup(tmp_path / "logs")
    try:
        policy = procs.start_policy()
        for stage in STAGES:
            procs.start(stage, "stage", stage, *common, "--commit-interval-ms", "100",
                        *(["--policy-url", policy.url] if stage == "run" else []))
        policy.ready()
        publish(settings, [validate_task({
            "task_id": f"t{i}", "env": "arithmetic", "prompt": f"{i}+1=",
            "data": {"answer": str(i + 1)}, "group_size": 2}) for i in range(6)])
        scored = [TopicPartition(settings.topics.scored, p, 0) for p in range(2)]
        deadline = time.monotonic() + 180
        while len(keys := [m.key() for m in kafka.read_partitions(settings, scored)]) < 12:
            procs.check_alive()
            assert time.monotonic() < deadline, f"{len(keys)} of 12 scored"
            time.sleep(1)
        assert len(set(keys)) == 12
    finally:
        procs.stop_all()
