"""Training jobs: Job records on the compacted `<cluster>.jobs` topic, read one way.

A job is its name (the record's key), its topic prefix and the rest of `schemas/job.avsc`. The
topic lives under the cluster's prefix (the `--prefix` of `rollstream jobs` and of the fleet);
the latest record of a name is the job, a tombstone deletes it. Readers take the whole topic
(one partition, committed records only) and keep the last record per name; an undecodable
record is skipped with a warning, as on <p>.policy (rollstream.policy_versions).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Iterable
from typing import Any, get_args

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from rollstream.cluster import kafka
from rollstream.cluster.follower import Follower
from rollstream.config import Settings
from rollstream.contracts.codec import DecodeError, codec
from rollstream.contracts.events import JOB, Job, JobState
from rollstream.contracts.graph import BY_ATTR, GRAPH, Topic, partition_count
from rollstream.contracts.wire import check_adapter

log = logging.getLogger(__name__)

STATES: tuple[str, ...] = get_args(JobState)
# States in which a fleet runs the job's stages; the others have it drained and stopped.
ACTIVE = ("RUNNING",)
# Kafka's legal topic characters; a job's name and prefix end up in topic and group names.
NAME = re.compile(r"[A-Za-z0-9._-]+")
# The fields a job file or flag may set (name is the key; state and times are the CLI's).
SETTABLE = ("prefix", "principal", "adapter", "policy_urls", "weight", "priority",
            "quota_episodes", "quota_sandboxes", "quota_tasks_queued", "quota_turns_per_s",
            "admission_window", "max_staleness", "group", "retries_infra", "group_policy")
# A job's group policy: what the trainer does with a group that lost a sample for good.
GROUP_POLICIES = ("drop", "partial")

# A job's own topics: the graph under its prefix but the jobs topic, which is the cluster's.
JOB_TOPICS: tuple[Topic, ...] = tuple(t for t in GRAPH if t.attr != "jobs")
CLUSTER_TOPICS: tuple[Topic, ...] = (BY_ATTR["jobs"],)


class JobError(ValueError):
    """A job record that cannot be, with what is wrong."""


def now_ms() -> int:
    return int(time.time() * 1000)


def default_prefix(cluster_prefix: str, name: str) -> str:
    return f"{cluster_prefix}.{name}"


def new_job(name: str, cluster_prefix: str, **fields: Any) -> Job:
    """A RUNNING job with the schema's defaults for what `fields` does not set; validated."""
    unknown = sorted(set(fields) - set(SETTABLE))
    if unknown:
        raise JobError(f"unknown job fields {unknown}; known: {list(SETTABLE)}")
    stamp = now_ms()
    job: Job = {
        "name": name, "prefix": default_prefix(cluster_prefix, name), "principal": "",
        "adapter": "", "policy_urls": [], "weight": 1.0, "priority": 0, "quota_episodes": 0,
        "quota_sandboxes": 0, "quota_tasks_queued": 0, "quota_turns_per_s": 0.0,
        "admission_window": 0, "max_staleness": 0, "state": "RUNNING", "group": None,
        "api_tokens": [], "retries_infra": 2, "group_policy": "drop",
        "created_at_ms": stamp, "updated_at_ms": stamp,
    }
    job.update(fields)  # type: ignore[typeddict-item]
    return validate(job, cluster_prefix)


def validate(job: Job, cluster_prefix: str) -> Job:
    """`job` if it can be run, else JobError saying which field is wrong and why."""
    for key in ("name", "prefix"):
        if not isinstance(job[key], str) or not NAME.fullmatch(job[key]):
            raise JobError(f"job {key} {job[key]!r}: use letters, digits, '.', '_' or '-'")
    if job["prefix"] == cluster_prefix:
        raise JobError(f"job prefix {job['prefix']!r} is the cluster's own prefix; a job needs "
                       "a prefix of its own")
    if not isinstance(job["weight"], int | float) or job["weight"] <= 0:
        raise JobError(f"job weight {job['weight']!r}: must be a number above 0")
    for key in ("priority", "quota_episodes", "quota_sandboxes", "quota_tasks_queued",
                "admission_window", "max_staleness", "retries_infra"):
        if not isinstance(job[key], int) or isinstance(job[key], bool):
            raise JobError(f"job {key} {job[key]!r}: must be a whole number")
        if key != "priority" and job[key] < 0:
            raise JobError(f"job {key} {job[key]}: must be 0 (none) or more")
    if not isinstance(job["quota_turns_per_s"], int | float) or job["quota_turns_per_s"] < 0:
        raise JobError(f"job quota_turns_per_s {job['quota_turns_per_s']!r}: must be 0 or more")
    if not isinstance(job["policy_urls"], list) or not all(
            isinstance(u, str) and u.startswith(("http://", "https://"))
            for u in job["policy_urls"]):
        raise JobError(f"job policy_urls {job['policy_urls']!r}: must be a list of http(s) URLs")
    if job["adapter"] and job["policy_urls"]:
        raise JobError("a job's policy is an adapter on the shared servers or servers of its "
                       "own, not both")
    try:
        check_adapter(job["adapter"])
    except ValueError as exc:
        raise JobError(f"job {exc}") from None
    if job["group_policy"] not in GROUP_POLICIES:
        raise JobError(f"job group_policy {job['group_policy']!r}: one of {list(GROUP_POLICIES)}")
    if job["state"] not in STATES:
        raise JobError(f"job state {job['state']!r}: one of {list(STATES)}")
    if job["group"] is not None and not NAME.fullmatch(job["group"]):
        raise JobError(f"job group {job['group']!r}: use letters, digits, '.', '_' or '-'")
    bad = [e.partition(":")[0] for e in job["api_tokens"] if not TOKEN_ENTRY.fullmatch(e)]
    if bad:
        raise JobError(f"job api_tokens: entries {bad} are not <id>:<sha256 hex>")
    job["weight"] = float(job["weight"])
    job["quota_turns_per_s"] = float(job["quota_turns_per_s"])
    return job


# -- HTTP API tokens (rollstream.api) -----------------------------------------------------------
# A token is `rst_<id>_<secret>`; the job keeps `<id>:<sha256 of the token>` only, so a leaked
# jobs topic gives no token, and the id names a token to revoke without showing it.
TOKEN_ENTRY = re.compile(r"[0-9a-f]{8}:[0-9a-f]{64}")
TOKEN = re.compile(r"rst_([0-9a-f]{8})_[A-Za-z0-9_-]{43}")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A fresh token and the entry the job stores for it (`<id>:<hash>`)."""
    ident = secrets.token_hex(4)
    token = f"rst_{ident}_{secrets.token_urlsafe(32)}"
    return token, f"{ident}:{token_hash(token)}"


def token_ids(job: Job) -> list[str]:
    return [entry.partition(":")[0] for entry in job["api_tokens"]]


def token_is_of(job: Job, token: str) -> bool:
    """Whether `token` is one of `job`'s (compared in constant time)."""
    found = TOKEN.fullmatch(token)
    if found is None:
        return False
    digest = token_hash(token)
    return any(hmac.compare_digest(entry, f"{found.group(1)}:{digest}")
               for entry in job["api_tokens"])


def job_of_token(jobs: Iterable[Job], token: str) -> Job | None:
    """The job that holds `token`, if any."""
    return next((job for job in jobs if token_is_of(job, token)), None)


def job_settings(base: Settings, job: Job) -> Settings:
    """The settings a fleet runs the job's stages with: the fleet's, under the job's prefix,
    with the job's admission window, infra retries and policy (its adapter, or its own
    servers). Each job's RUN stage has a harness gateway of its own, on a free port: a fixed
    one would be taken by the first job, and a job's episode keys are good at its own gateway
    only."""
    return base.override(
        prefix=job["prefix"], admission_window=job["admission_window"], adapter=job["adapter"],
        gateway_port=0, retries_infra=job["retries_infra"],
        policy_url=",".join(job["policy_urls"]) or base.inference.policy_url,
        policy_url_file="" if job["policy_urls"] else base.inference.policy_url_file)


# -- the topic ------------------------------------------------------------------------------

def partitions(settings: Settings) -> list[TopicPartition]:
    count = partition_count(BY_ATTR["jobs"], settings.partitions)
    return [TopicPartition(settings.topics.jobs, p, OFFSET_BEGINNING) for p in range(count)]


def fold(jobs: dict[str, Job], messages: Iterable[Message]) -> set[str]:
    """Apply `messages` (records of the jobs topic, in order) to `jobs`; the names changed."""
    changed = set()
    for msg in messages:
        if msg.key() is None:
            log.warning("skipping a keyless record on %s at %d", msg.topic(), msg.offset())
            continue
        name = msg.key().decode()
        if msg.value() is None:
            jobs.pop(name, None)
        else:
            try:
                jobs[name] = codec().decode_as(JOB, msg.value())  # type: ignore[assignment]
            except DecodeError as exc:
                log.warning("skipping an undecodable record on %s at %d: %s", msg.topic(),
                            msg.offset(), exc)
                continue
        changed.add(name)
    return changed


def current(settings: Settings) -> dict[str, Job]:
    """Every job now, reading the jobs topic to its end."""
    jobs: dict[str, Job] = {}
    fold(jobs, kafka.read_partitions(settings, partitions(settings)))
    return jobs


def get(settings: Settings, name: str) -> Job:
    """The job named `name`, or JobError naming the jobs there are."""
    jobs = current(settings)
    if name not in jobs:
        raise JobError(f"no job {name!r} on {settings.topics.jobs}; jobs: {sorted(jobs) or 'none'}")
    return jobs[name]


def put(settings: Settings, job: Job | None, name: str = "") -> None:
    """Write `job` (None: a tombstone for `name`, deleting it) and wait until it is stored."""
    producer = kafka.producer(settings)
    value = None if job is None else codec().encode(JOB, dict(job))
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _: Message) -> None:
        if err is not None:
            failed.append(err)

    kafka.produce(producer, settings.topics.jobs, value, key=name or (job or {})["name"],
                  on_delivery=delivered)
    if producer.flush(settings.timeout_s):
        raise JobError(f"the job record was not stored on {settings.topics.jobs} within "
                       f"{settings.timeout_s:.0f} s")
    if failed:
        raise KafkaException(failed[0])


class JobReader:
    """Follows the jobs topic: `jobs` is every job read so far; `poll` takes what arrived and
    returns the names that changed (a deleted job is no longer in `jobs`)."""

    def __init__(self, settings: Settings) -> None:
        self.jobs: dict[str, Job] = {}
        self._follower = Follower(settings, partitions(settings))

    @property
    def at_end(self) -> bool:
        return self._follower.at_end

    def poll(self, timeout_s: float = 0.0) -> set[str]:
        return fold(self.jobs, self._follower.poll(timeout_s))

    def close(self) -> None:
        self._follower.close()
