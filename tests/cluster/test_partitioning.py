"""Keys land on the partition Kafka's Java producer would choose (murmur2), so topics can be
joined with a Java or Kafka Streams client: checked against the Java client's own code. And
every produced record names its type in its headers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from producers.publish import validate_task
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec

# The Java producer's own partitioning of a keyed record (the default partitioner).
JAVA = """
import java.io.*;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;

public class JavaPartition {
    public static void main(String[] args) throws IOException {
        int partitions = Integer.parseInt(args[0]);
        BufferedReader in = new BufferedReader(
            new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String key; (key = in.readLine()) != null; ) {
            byte[] bytes = key.getBytes(StandardCharsets.UTF_8);
            System.out.println(key + " " + BuiltInPartitioner.partitionForKey(bytes, partitions));
        }
    }
}
"""


def java_partitions(keys: list[str], partitions: int, tmp_path: Path) -> dict[str, int]:
    libs = local.resolve_jars()
    assert list(libs.glob("kafka-clients-*.jar")), "the broker's libs hold no kafka-clients jar"
    source = tmp_path / "JavaPartition.java"
    source.write_text(JAVA)
    out = subprocess.run(["java", "-cp", f"{libs}/*", str(source), str(partitions)],
                         input="\n".join(keys) + "\n", capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return {key: int(p) for key, p in (line.rsplit(" ", 1) for line in out.splitlines())}


@pytest.mark.skipif(shutil.which("java") is None, reason="needs java (the broker needs it too)")
def test_keys_land_where_the_java_producer_puts_them(settings: Settings, tmp_path: Path) -> None:
    keys = [f"task-{i}#{i % 8}" for i in range(300)] + [f"g{i}" for i in range(20)] + ["é#0"]
    topic = settings.topics.episodes
    producer = kafka.producer(settings)
    for key in keys:
        kafka.produce(producer, topic, b"x", key=key)
    assert producer.flush(30) == 0
    placed = {m.key().decode(): m.partition() for m in kafka.read_partitions(
        settings, [TopicPartition(topic, p, 0) for p in range(settings.partitions)])}
    assert len(placed) == len(keys)
    expected = java_partitions(keys, settings.partitions, tmp_path)
    assert placed == expected
    assert len(set(placed.values())) == settings.partitions  # spread, not all on one


def test_produced_records_carry_their_record_type_and_fingerprint(settings: Settings) -> None:
    task = validate_task({"task_id": "h-1", "env": "arithmetic", "prompt": "1+1=",
                          "data": {"answer": "2"}, "group_size": 1})
    value = codec().encode("Task", task)
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.tasks, value, key="h-1")
    assert producer.flush(30) == 0
    [msg] = kafka.read_partitions(
        settings, [TopicPartition(settings.topics.tasks, p, 0) for p in range(settings.partitions)])
    # Readable without knowing the framing: what kcat -f '%h' shows.
    assert dict(msg.headers()) == {"rollstream.record": b"rollstream.Task",
                                   "rollstream.fingerprint": value[2:10].hex().encode()}
