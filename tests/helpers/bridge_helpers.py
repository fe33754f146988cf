"""Shared by the trainer bridge's tests: encoded scored events of whole groups, published
interleaved."""

from __future__ import annotations

from producers.publish import validate_task
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec


def scored(task_id: str, index: int, group_size: int, reward: float) -> bytes:
    task = validate_task({"task_id": task_id, "env": "arithmetic", "prompt": "1+1=",
                          "data": {"answer": "2"}, "group_size": group_size})
    trajectory = {"episode_id": f"{task_id}#{index}", "task": task, "sample_index": index,
                  "turns": [], "termination": "DONE", "started_at_ms": 1}
    return codec().encode("ScoredTrajectory", {
        "trajectory": trajectory, "reward": reward, "failure_class": "ok", "scored_at_ms": 2})


def publish_groups(settings: Settings, tasks: int, group_size: int) -> None:
    producer = kafka.producer(settings)
    # Interleaved, so groups complete out of order and across partitions.
    for i in range(group_size):
        for t in range(tasks):
            kafka.produce(producer, settings.topics.scored, scored(f"task{t}", i, group_size,
                                                                   float(i)),
                          key=f"task{t}#{i}")
    producer.flush()
