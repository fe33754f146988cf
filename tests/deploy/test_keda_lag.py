"""The chart's KEDA thresholds against a caught-up pipeline on a real broker: the stages run over
a few tasks until every episode is scored; then each stage group's lag is counted as KEDA's
Kafka scaler counts it (high watermark minus committed offset, summed over the input's
partitions) and by Kafka's own consumer-group tool, and the ScaledObjects rendered for this
pipeline (its prefix, its partitions) neither activate on it nor ask for a second replica."""

from __future__ import annotations

import math
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream.broker.local import _java
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.graph import STAGES, input_of
from rollstream.dev.processes import ProcessGroup
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


def rendered_triggers(settings: Settings) -> dict[str, dict]:
    result = subprocess.run(
        [str(HELM), "template", "rs", str(CHART), "--set", "inference.embedded=true",
         "--set", f"prefix={settings.prefix}", "--set", f"partitions={settings.partitions}",
         "--set", f"kafka.bootstrapServers={settings.bootstrap_servers}"],
        capture_output=True, text=True, timeout=120, check=True)
    scaled = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ScaledObject"]
    out = {}
    for s in scaled:
        [trigger] = s["spec"]["triggers"]
        stage = re.fullmatch(rf"{re.escape(settings.prefix)}\.(\w+)",
                             trigger["metadata"]["consumerGroup"]).group(1)
        out[stage] = {**trigger["metadata"], "min": s["spec"]["minReplicaCount"],
                      "max": s["spec"]["maxReplicaCount"]}
    return out


def test_a_caught_up_pipeline_neither_activates_nor_scales_a_stage(
        settings: Settings, tmp_path: Path) -> None:
    procs = ProcessGroup(tmp_path)
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix,
              "--commit-interval-ms", "100"]
    try:
        policy = procs.start_policy()
        for stage in STAGES:
            procs.start(stage, "stage", stage, *common,
                        *(["--policy-url", policy.url] if stage == "run" else []))
        policy.ready()
        tasks = [validate_task({"task_id": f"k{i}", "env": "arithmetic", "prompt": f"{i}+1=",
                                "data": {"answer": str(i + 1)}, "group_size": 2})
                 for i in range(12)]
        publish(settings, tasks)
        scored = [TopicPartition(settings.topics.scored, p, 0)
                  for p in range(settings.partitions)]
        deadline = time.monotonic() + 180
        while len(list(kafka.read_partitions(settings, scored))) < 24:
            procs.check_alive()
            assert time.monotonic() < deadline, "the pipeline did not score every episode"
            time.sleep(0.5)
        time.sleep(2)  # the stages' idle commits are in
        triggers = rendered_triggers(settings)
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
    finally:
        procs.stop_all()
