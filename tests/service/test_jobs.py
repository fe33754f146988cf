"""Jobs as records (rollstream.service.jobs): validation with clear errors, the compacted jobs topic
read one way (the last record of a name wins, a tombstone deletes, a bad record is skipped), and
a follower that sees each change once."""

from __future__ import annotations

import re
import time

import pytest

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.graph import BY_ATTR
from rollstream.service import jobs


def test_a_new_job_takes_the_schema_defaults_and_the_cluster_prefix() -> None:
    job = jobs.new_job("team-a", "rs", weight=2, adapter="team-a-lora")
    assert (job["prefix"], job["weight"], job["state"], job["group"]) == (
        "rs.team-a", 2.0, "RUNNING", None)
    settings = jobs.job_settings(Settings().override(prefix="rs", admission_window=5), job)
    assert (settings.prefix, settings.topics.tasks, settings.inference.adapter) == (
        "rs.team-a", "rs.team-a.tasks", "team-a-lora")
    assert settings.stage.admission_window == 0  # the job's, not the fleet's
    assert (job["retries_infra"], job["group_policy"], settings.inference.retries_infra) == (
        2, "drop", 2)
    assert jobs.job_settings(Settings(), jobs.new_job("c", "rs", retries_infra=0)
                             ).inference.retries_infra == 0
    own = jobs.job_settings(Settings(prefix="rs"), jobs.new_job(
        "b", "rs", policy_urls=["http://10.0.0.1:8000", "http://10.0.0.2:8000"]))
    assert own.inference.policy_urls() == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    # A fleet's fixed gateway port is no job's: each job's RUN stage listens on a free one.
    fixed = jobs.job_settings(Settings().override(prefix="rs", gateway_port=8123), job)
    assert fixed.inference.gateway_port == 0


@pytest.mark.parametrize(("fields", "message"), [
    ({"weight": 0}, "weight 0: must be a number above 0"),
    ({"prefix": "has space"}, "job prefix 'has space'"),
    ({"prefix": "rs"}, "the cluster's own prefix"),
    ({"quota_episodes": -1}, "quota_episodes -1: must be 0 (none) or more"),
    ({"priority": 1.5}, "priority 1.5: must be a whole number"),
    ({"policy_urls": ["10.0.0.1:8000"]}, "list of http(s) URLs"),
    ({"adapter": "x", "policy_urls": ["http://a"]}, "not both"),
    ({"colour": "red"}, "unknown job fields ['colour']"),
    ({"retries_infra": -1}, "retries_infra -1: must be 0 (none) or more"),
    ({"group_policy": "keep"}, "group_policy 'keep': one of ['drop', 'partial']"),
])
def test_bad_jobs_are_refused_saying_what_is_wrong(fields: dict, message: str) -> None:
    with pytest.raises(jobs.JobError, match=re.escape(message)):
        jobs.new_job("a", "rs", **fields)
    with pytest.raises(jobs.JobError, match="job name 'a/b'"):
        jobs.new_job("a/b", "rs")


def test_the_jobs_topic_is_one_compacted_partition() -> None:
    topic = BY_ATTR["jobs"]
    assert topic.partitions == 1
    assert topic.config["cleanup.policy"] == "compact"


def test_the_last_record_wins_a_tombstone_deletes_and_a_bad_record_is_skipped(
        settings: Settings) -> None:
    assert jobs.current(settings) == {}
    a = jobs.new_job("a", settings.prefix)
    jobs.put(settings, a)
    jobs.put(settings, jobs.new_job("b", settings.prefix, weight=3))
    producer = kafka.producer(settings)
    kafka.produce(producer, settings.topics.jobs, b"not avro", key="c")
    producer.flush(30)
    jobs.put(settings, {**a, "state": "PAUSED"})
    jobs.put(settings, None, name="b")
    found = jobs.current(settings)
    assert list(found) == ["a"]
    assert found["a"]["state"] == "PAUSED"
    assert jobs.get(settings, "a")["prefix"] == f"{settings.prefix}.a"
    with pytest.raises(jobs.JobError, match=r"no job 'b' .*jobs: \['a'\]"):
        jobs.get(settings, "b")


def test_a_reader_follows_jobs_as_they_come_and_go(settings: Settings) -> None:
    jobs.put(settings, jobs.new_job("a", settings.prefix))
    reader = jobs.JobReader(settings)
    try:
        def poll_until(done) -> set[str]:
            changed: set[str] = set()
            deadline = time.monotonic() + 30
            while not done() and time.monotonic() < deadline:
                changed |= reader.poll(0.2)
            return changed

        assert poll_until(lambda: reader.at_end) == {"a"}
        jobs.put(settings, jobs.new_job("b", settings.prefix))
        assert poll_until(lambda: "b" in reader.jobs) == {"b"}
        jobs.put(settings, None, name="a")
        assert poll_until(lambda: "a" not in reader.jobs) == {"a"}
        assert list(reader.jobs) == ["b"]
    finally:
        reader.close()
