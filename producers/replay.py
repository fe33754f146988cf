"""Replay a topic's events: re-read a range, filter, then copy to another topic or print as JSON.

Rollouts are events in Kafka, so reproducing a run means re-reading them: feed the tasks of a run
to a fresh pipeline, copy the scored trajectories of one policy version to a trainer's topic, or
dump what an environment produced to look at it.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, nullcontext
from typing import Any, TextIO

import numpy as np
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from rollstream.cluster.kafka import (
    consumer,
    process_id,
    produce,
    read_partitions,
    retrying,
    transaction,
    transactional_producer,
    watermarks,
)
from rollstream.config import Settings
from rollstream.contracts.codec import DecodeError, codec, unpack_ids, unpack_logprobs
from rollstream.contracts.events import POLICY_VERSION, SCORED_TRAJECTORY, TRAJECTORY

# read_partitions' deadline for reaching the end of every partition: generous, since a replay may
# cover days of trajectories.
READ_TIMEOUT_S = 3600.0
# The copy is one transaction (readers of the target see all of it or nothing); the broker's
# default cap (transaction.max.timeout.ms) is 15 minutes.
TRANSACTION_TIMEOUT_MS = 900_000
# Turn's packed arrays, by field name: everything else in bytes is printed as base64.
_UNPACK: dict[str, Callable[[bytes], np.ndarray]] = {
    "prompt_ids": unpack_ids,
    "completion_ids": unpack_ids,
    "logprobs": unpack_logprobs,
}


def resolve_topic(settings: Settings, name: str, existing: Iterable[str]) -> str:
    """`name` if such a topic exists, else `<prefix>.<name>` (so `scored` works as a suffix)."""
    existing = set(existing)
    for candidate in (name, f"{settings.prefix}.{name}"):
        if candidate in existing:
            return candidate
    mine = sorted(t for t in existing if t.startswith(settings.prefix + "."))
    raise ValueError(f"no topic {name!r} (nor {settings.prefix}.{name}); topics: {mine}")


def parse_where(items: Iterable[str]) -> list[tuple[list[str], str]]:
    """`path=value` filters as (path parts, value); ValueError on a malformed one."""
    parsed = []
    for item in items:
        path, sep, value = item.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"bad filter {item!r}: expected path=value, e.g. task.env=arithmetic")
        parsed.append((path.strip().split("."), value))
    return parsed


def _lookup(value: Any, path: list[str]) -> list[Any]:
    """Every value at a dotted path; lists fan out (turns.reward) unless indexed (turns.0)."""
    found = [value]
    for part in path:
        step: list[Any] = []
        for v in found:
            if isinstance(v, list) and part.isdigit():
                step.extend(v[int(part) : int(part) + 1])
                continue
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, dict) and part in item:
                    step.append(item[part])
        found = step
    return found


def to_json(value: Any, key: str = "") -> Any:
    """A decoded event as JSON-ready data: token ids and logprobs as lists, other bytes base64."""
    if isinstance(value, bytes):
        unpack = _UNPACK.get(key)
        return unpack(value).tolist() if unpack else base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {k: to_json(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def _as_text(value: Any) -> str:
    # Strings as they are (enum symbols too); anything else as it reads in the JSON output.
    return value if isinstance(value, str) else json.dumps(to_json(value))


def _matches(value: dict, where: list[tuple[list[str], str]]) -> bool:
    return all(
        any(_as_text(v) == expected for v in _lookup(value, path)) for path, expected in where
    )


def _has_policy_version(record: str, value: dict, version: int) -> bool:
    if record == POLICY_VERSION:
        return value["version"] == version
    if record == SCORED_TRAJECTORY:
        value = value["trajectory"]
    elif record != TRAJECTORY:
        return False  # other events carry no policy version
    return any(turn["policy_version"] == version for turn in value["turns"])


def _ranges(
    c: Consumer,
    topic: str,
    partitions: list[int],
    offsets: tuple[int | None, int | None],
    times: tuple[int | None, int | None],
) -> dict[int, tuple[int, int | None]]:
    """Per partition (start offset, exclusive end offset or None for the current end)."""

    def lookup(ms: int) -> list[TopicPartition]:
        found = c.offsets_for_times([TopicPartition(topic, p, ms) for p in partitions], 30)
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
        return found

    def at_times(ms: int | None) -> dict[int, int | None]:
        if ms is None:
            return dict.fromkeys(partitions)
        found = retrying(lambda: lookup(ms))
        # -1: no event at or after that time, i.e. the partition's end.
        return {tp.partition: tp.offset if tp.offset >= 0 else None for tp in found}

    start_at, end_at = at_times(times[0]), at_times(times[1])
    result: dict[int, tuple[int, int | None]] = {}
    for p in partitions:
        low, high = watermarks(c, TopicPartition(topic, p), timeout_s=30)
        starts = [low] + [o for o in (offsets[0], start_at[p]) if o is not None]
        if times[0] is not None and start_at[p] is None:
            starts.append(high)  # nothing that recent here
        ends = [o for o in (offsets[1], end_at[p]) if o is not None]
        start, end = max(starts), min(ends, default=None)
        if start < high and (end is None or start < end):
            result[p] = (start if start > low else OFFSET_BEGINNING, end)
    return result


def _ensure_topic(settings: Settings, source: str, target: str) -> int:
    """Create `target` like `source` (partitions, replicas, its own configs) unless it exists.

    Returns the target's partition count.
    """
    admin = AdminClient(settings.kafka())
    meta = admin.list_topics(timeout=30).topics
    if target in meta:
        return len(meta[target].partitions)
    src = meta[source].partitions
    resource = ConfigResource("topic", source)
    entries = admin.describe_configs([resource])[resource].result(30)
    # Only what was set on the source topic: e.g. max.message.bytes, without which large
    # trajectories would not fit in a default topic.
    config = {
        name: entry.value
        for name, entry in entries.items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }
    new = NewTopic(
        target, num_partitions=len(src), replication_factor=len(src[0].replicas), config=config
    )
    try:
        admin.create_topics([new])[target].result(60)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    return len(src)


class _Skipped:
    """Undecodable events seen while reading: counted and reported, never fatal."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def add(self, msg: Message, exc: DecodeError) -> None:
        self.count += 1
        self.first = self.first or f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {exc}"


def _decoded(
    settings: Settings, topic: str, ranges: dict[int, tuple[int, int | None]], skipped: _Skipped
) -> Iterator[tuple[Message, str, dict]]:
    """(message, record name, value) for each decodable committed event in the ranges."""
    # A partition with a finite end is done once an event at or past end - 1 was seen, so a
    # narrow range stops without reading the rest of the topic.
    unfinished = {part for part, (_, end) in ranges.items() if end is not None}
    all_finite = len(unfinished) == len(ranges)
    tps = [TopicPartition(topic, part, start) for part, (start, _) in ranges.items()]
    with closing(read_partitions(settings, tps, timeout_s=READ_TIMEOUT_S)) as messages:
        for msg in messages:
            end = ranges[msg.partition()][1]
            if end is not None and msg.offset() >= end - 1:
                unfinished.discard(msg.partition())
            if end is None or msg.offset() < end:
                try:
                    record, value = codec().decode(msg.value())
                except DecodeError as exc:
                    skipped.add(msg, exc)
                else:
                    yield msg, record, value
            if all_finite and not unfinished:
                return


def _event_json(msg: Message, record: str, value: dict) -> dict[str, Any]:
    key = msg.key()
    return {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp_ms": msg.timestamp()[1],
        "key": key.decode("utf-8", "replace") if key is not None else None,
        "type": record,
        "value": to_json(value),
    }


def replay(
    settings: Settings,
    topic: str,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
    start_time_ms: int | None = None,
    end_time_ms: int | None = None,
    where: Iterable[str] = (),
    policy_version: int | None = None,
    keep: Callable[[str, dict], bool] | None = None,
    to_topic: str | None = None,
    out: TextIO | None = None,
    limit: int | None = None,
) -> int:
    """Replay committed events of `topic` in [start, end) and return how many were replayed.

    Bounds apply to every partition: offsets as given, times via the broker's time index; both
    may be combined (the narrower wins); no end bound means the topic's current end. `topic` may
    be a bare suffix (`scored` for <prefix>.scored) when no topic has that exact name.
    With `to_topic` the matching events' original bytes and keys are copied there in one
    transaction (the topic is created like the source if missing; same partition when the counts
    match); otherwise each is written to `out` (default stdout) as one JSON line:
    {topic, partition, offset, timestamp_ms, key, type, value}.
    `keep(record, value)`, when given, is one more filter (ranges of versions or rewards).
    Undecodable events are skipped and counted on stderr.
    """
    filters = parse_where(where)
    c = consumer(settings, process_id(settings, settings.topics.group("replay")))
    try:
        meta = c.list_topics(timeout=30).topics
        topic = resolve_topic(settings, topic, meta)
        partitions = sorted(meta[topic].partitions)
        ranges = _ranges(
            c, topic, partitions, (start_offset, end_offset), (start_time_ms, end_time_ms)
        )
    finally:
        c.close()
    if to_topic == topic:
        raise ValueError(f"cannot replay {topic} into itself")

    def kept(record: str, value: dict) -> bool:
        return (_matches(value, filters) and (
            policy_version is None or _has_policy_version(record, value, policy_version)
        ) and (keep is None or keep(record, value)))

    p = None
    same_partitions = False
    if to_topic is not None:
        same_partitions = _ensure_topic(settings, topic, to_topic) == len(partitions)
        p = transactional_producer(
            settings,
            process_id(settings, settings.topics.group("replay")),
            **{"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS},
        )
    out = out or sys.stdout
    skipped = _Skipped()
    replayed = 0
    # Which filters' paths some event has: a misspelt path matches nothing, silently otherwise.
    unfound = dict(enumerate(filters))
    fields: list[str] = []
    with transaction(p, commit_timeout_s=120) if p is not None else nullcontext():
        for msg, record, value in _decoded(settings, topic, ranges, skipped):
            if limit is not None and replayed >= limit:
                break
            fields = fields or sorted(value)
            for i, (path, _) in list(unfound.items()):
                if _lookup(value, path):
                    del unfound[i]
            if not kept(record, value):
                continue
            replayed += 1
            if p is not None:
                target = msg.partition() if same_partitions else None
                produce(p, to_topic, msg.value(), key=msg.key(), partition=target)
            else:
                out.write(json.dumps(_event_json(msg, record, value)) + "\n")
    if unfound and fields:
        paths = ", ".join(repr(".".join(path)) for path, _ in unfound.values())
        print(f"replay: warning: no event read from {topic} has the field {paths} that --where "
              f"names (the events' fields: {', '.join(fields)})", file=sys.stderr)
    if skipped.count:
        print(f"replay: skipped {skipped.count} undecodable event(s); first at {skipped.first}",
              file=sys.stderr)
    return replayed
