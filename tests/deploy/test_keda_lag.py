"""The chart's KEDA triggers against a real pipeline on a real broker: the stages run over a few
tasks until every episode is scored. With autoscaling.lagSource kafka, each stage group's lag is
counted as KEDA's Kafka scaler counts it (high watermark minus committed offset, summed over the
input's partitions) and by Kafka's own consumer-group tool: the commit markers leave 1 per
partition, and the rendered thresholds neither activate nor scale up on it. With the default,
status, the value KEDA's metrics-api scaler reads from `rollstream status --watch`'s /metrics
(the rendered valueLocation) is 0 for a caught-up stage, so it scales to its minimum, zero where
configured; with RUN stopped and tasks published, RUN's value wakes it, and once RUN has caught
up again it is 0 again."""

from __future__ import annotations

import math
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from confluent_kafka import TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from producers.publish import publish, validate_task
from rollstream.broker.local import _java
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.graph import STAGES, input_of
from rollstream.dev.processes import ProcessGroup, free_port, wait_http
from tests.helpers.helm_helpers import CHART, HELM, HELM_DIR

KAFKA_TOOLS = HELM_DIR / "kafka-tools" / "jars"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HELM.exists(), reason="Helm is not built: run `make helm-deps`"),
]


def keda_lag(settings: Settings, stage: str) -> dict[int, int]:
    """Per partition: high watermark minus the group's committed offset (KEDA's
    getLagForPartition); with none committed and offsetResetPolicy earliest, what the
    partition retains (high minus low watermark)."""
    topic = input_of(stage).name(settings.topics)
    consumer = kafka.consumer(settings, settings.topics.group(stage))
    try:
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(settings.partitions)], timeout=30)
        lag = {}
        for tp in committed:
            low, high = consumer.get_watermark_offsets(tp, timeout=30)
            lag[tp.partition] = high - (tp.offset if tp.offset >= 0 else low)
        return lag
    finally:
        consumer.close()


def kafka_tool_lag(settings: Settings, stage: str) -> dict[int, int | None]:
    """LAG per partition as Kafka's consumer-group tool prints it (None: "-", no offset
    committed)."""
    assert KAFKA_TOOLS.exists(), "Kafka's consumer-group tool is missing: run `make helm-deps`"
    out = subprocess.run(
        [_java(), "-cp", f"{KAFKA_TOOLS}/*",
         "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
         "--bootstrap-server", settings.bootstrap_servers, "--describe",
         "--group", settings.topics.group(stage)],
        capture_output=True, text=True, timeout=120, check=True).stdout
    topic = input_of(stage).name(settings.topics)
    lag = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == topic:
            # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
            lag[int(fields[2])] = None if fields[5] == "-" else int(fields[5])
    return lag


def rendered_triggers(settings: Settings, source: str, *sets: str) -> dict[str, dict]:
    """Per stage: its ScaledObject's trigger metadata, type, and minimum and maximum replicas,
    rendered for this pipeline (its prefix, its partitions, its broker)."""
    sets = ("inference.embedded=true", f"prefix={settings.prefix}",
            f"partitions={settings.partitions}",
            f"kafka.bootstrapServers={settings.bootstrap_servers}",
            f"autoscaling.lagSource={source}", *sets)
    result = subprocess.run(
        [str(HELM), "template", "rs", str(CHART), *(a for s in sets for a in ("--set", s))],
        capture_output=True, text=True, timeout=120, check=True)
    scaled = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ScaledObject"]
    return {s["metadata"]["name"].removeprefix("rs-"): {
        **s["spec"]["triggers"][0]["metadata"], "type": s["spec"]["triggers"][0]["type"],
        "min": s["spec"]["minReplicaCount"], "max": s["spec"]["maxReplicaCount"]}
        for s in scaled}


def metrics_api_value(metrics_url: str, value_location: str) -> float:
    """What KEDA's metrics-api scaler with format prometheus reads: the sample of the
    valueLocation's metric whose labels match the selector's."""
    m = re.fullmatch(r'(\w+)\{(.*)\}', value_location)
    assert m, value_location
    name, wanted = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    values = [sample.value for family in text_string_to_metric_families(text)
              for sample in family.samples
              if sample.name == name and wanted.items() <= sample.labels.items()]
    assert len(values) == 1, (value_location, values)
    return values[0]


def keda_replicas(value: float, trigger: dict, target: str, activation: str) -> int:
    """KEDA and the HPA on an AverageValue metric: at the minimum while not active (value at
    or below the activation threshold), else ceil(value / target) within min and max."""
    if not value > float(trigger[activation]):
        return trigger["min"]
    return max(trigger["min"], min(trigger["max"], math.ceil(value / float(trigger[target]))))


def tasks(prefix: str, n: int) -> list[dict]:
    return [validate_task({"task_id": f"{prefix}{i}", "env": "arithmetic", "prompt": f"{i}+1=",
                           "data": {"answer": str(i + 1)}, "group_size": 2}) for i in range(n)]


def wait_scored(settings: Settings, procs: ProcessGroup, n: int) -> None:
    scored = [TopicPartition(settings.topics.scored, p, 0) for p in range(settings.partitions)]
    deadline = time.monotonic() + 180
    while len(list(kafka.read_partitions(settings, scored))) < n:
        procs.check_alive()
        assert time.monotonic() < deadline, "the pipeline did not score every episode"
        time.sleep(0.5)
    time.sleep(2)  # the stages' idle commits are in


def test_a_caught_up_pipeline_scales_to_its_minimum_and_lag_wakes_a_stage(
        settings: Settings, tmp_path: Path) -> None:
    procs = ProcessGroup(tmp_path)
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    stage_flags = [*common, "--commit-interval-ms", "100"]
    status_port = free_port()
    try:
        policy = procs.start_policy()
        for stage in STAGES:
            procs.start(stage, "stage", stage, *stage_flags,
                        *(["--policy-url", policy.url] if stage == "run" else []))
        procs.start("status", "status", "--watch", "--json", "--interval", "1",
                    "--metrics-port", str(status_port), *common)
        policy.ready()
        publish(settings, tasks("k", 12))
        wait_scored(settings, procs, 24)
        triggers = rendered_triggers(settings, "kafka")
        assert set(triggers) == set(STAGES)
        for stage in STAGES:
            lag = keda_lag(settings, stage)
            tool = kafka_tool_lag(settings, stage)
            assert set(tool) == set(lag), (stage, tool, lag)
            assert {p: n for p, n in lag.items() if tool[p] is not None} == {
                p: n for p, n in tool.items() if n is not None}, stage
            # Caught up: at most the commit marker after each partition's last offset.
            assert all(0 <= n <= 1 for n in lag.values()), (stage, lag)
            total = sum(lag.values())
            t = triggers[stage]
            assert t["max"] == settings.partitions
            # KEDA: active when total lag > activationLagThreshold; replicas
            # ceil(lag / lagThreshold), at most the partitions.
            assert not total > int(t["activationLagThreshold"]), (stage, total, t)
            assert min(t["max"], math.ceil(total / int(t["lagThreshold"]))) <= t["min"], (
                stage, total, t)
            assert total > 0, "no commit marker counted: the kafka case tests nothing"

        # The default: Rollstream's own lag from status --watch, every stage allowed to zero.
        triggers = rendered_triggers(settings, "status", *(
            f"stages.{stage}.autoscaling.minReplicas=0" for stage in STAGES))
        metrics = f"http://127.0.0.1:{status_port}/metrics"
        wait_http(f"http://127.0.0.1:{status_port}/ready", timeout=60)

        def replicas(stage: str) -> tuple[float, int]:
            t = triggers[stage]
            assert t["type"] == "metrics-api" and t["format"] == "prometheus"
            value = metrics_api_value(metrics, t["valueLocation"])
            return value, keda_replicas(value, t, "targetValue", "activationTargetValue")

        def settle(stage: str, check, timeout: float = 60) -> tuple[float, int]:
            deadline = time.monotonic() + timeout
            while not check(found := replicas(stage)):
                procs.check_alive()
                assert time.monotonic() < deadline, (stage, found)
                time.sleep(1)
            return found

        for stage in STAGES:  # caught up: 0, so zero replicas
            assert settle(stage, lambda f: f[0] == 0) == (0, 0), stage
        # RUN gone (scaled to zero) while tasks arrive: its lag wakes it.
        procs.stop("run")
        publish(settings, tasks("w", 12))
        value, wanted = settle("run", lambda f: f[0] >= 24)
        assert wanted >= 1, (value, wanted)
        procs.start("run", "stage", "run", *stage_flags, "--policy-url", policy.url)
        wait_scored(settings, procs, 48)
        assert settle("run", lambda f: f[0] == 0) == (0, 0)
    finally:
        procs.stop_all()
