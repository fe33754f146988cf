"""`rollstream dlq list|show|redrive`: look into the dead-letter topic and send fixed events back.

A redrive re-publishes a dead letter's original key and bytes to its source topic, and in the
same Kafka transaction writes the dead letter's coordinates to `<p>.dlq-redriven` (compacted,
keyed by the coordinates). Before choosing what to send, a redrive reads that ledger, after
`init_transactions` with one transactional id per prefix: any earlier or concurrent redrive has
then either committed (its coordinates are in the ledger) or been fenced and aborted (nothing of
it is visible). So a dead letter goes back at most once, however often the command is run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import DecodeError, codec
from rollstream.contracts.events import DEAD_LETTER
from rollstream.contracts.graph import BY_ATTR, partition_count


@dataclass(frozen=True)
class DeadLetter:
    partition: int  # where it is on <p>.dlq
    offset: int
    event: dict  # the DeadLetter record

    @property
    def coordinates(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def reason_class(self) -> str:
        """The reason up to its first colon ('undecodable', 'invalid', 'stage error')."""
        return self.event["reason"].split(":", 1)[0]


def ledger_topic(settings: Settings) -> str:
    return settings.topics.dlq_redriven


def dead_letters(settings: Settings) -> Iterator[DeadLetter]:
    """Every dead letter on <p>.dlq (committed ones), oldest first per partition."""
    partitions = kafka.whole_topic(settings, settings.topics.dlq)
    if partitions is None:
        raise SystemExit(f"topic {settings.topics.dlq} does not exist (rollstream topics create)")
    for msg in kafka.read_partitions(settings, partitions):
        try:
            event = codec().decode_as(DEAD_LETTER, msg.value())
        except DecodeError:
            continue  # not written by a stage; nothing to redrive
        yield DeadLetter(msg.partition(), msg.offset(), event)


def summary(letters: list[DeadLetter], redriven: set[str]) -> list[dict]:
    """Dead letters grouped by stage, source topic and reason class, with the latest reason."""
    groups: dict[tuple[str, str, str], list[DeadLetter]] = {}
    for letter in letters:
        e = letter.event
        groups.setdefault((e["stage"], e["source_topic"], letter.reason_class), []).append(letter)
    rows = []
    for (stage, source, reason), items in sorted(groups.items()):
        latest = max(items, key=lambda d: d.event["failed_at_ms"])
        rows.append({"stage": stage, "source_topic": source, "reason": reason,
                     "count": len(items),
                     "redriven": sum(1 for d in items if d.coordinates in redriven),
                     "latest": latest.event["reason"], "latest_at": latest.coordinates})
    return rows


def decoded(letter: DeadLetter) -> dict:
    """The dead letter with its original bytes decoded where they are a known Avro event."""
    e = letter.event
    out: dict[str, Any] = {k: v for k, v in e.items() if k not in ("key", "value")}
    out["coordinates"] = letter.coordinates
    out["key"] = e["key"].decode(errors="replace") if e["key"] is not None else None
    try:
        record, value = codec().decode(e["value"])
        out["record"], out["value"] = record, value
    except DecodeError as exc:
        out["record"] = None
        out["value"] = repr(e["value"][:512]) if e["value"] is not None else None
        out["decode_error"] = str(exc)
    return out


def ensure_ledger(settings: Settings) -> None:
    """Create the ledger as the graph declares it, for topics made before the graph had it."""
    from confluent_kafka.admin import AdminClient, NewTopic

    spec = BY_ATTR["dlq_redriven"]
    admin = AdminClient(settings.kafka())
    topic = NewTopic(ledger_topic(settings), num_partitions=partition_count(spec, 1),
                     replication_factor=1, config=spec.config)
    try:
        admin.create_topics([topic])[topic.topic].result(timeout=60)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def redriven(settings: Settings) -> set[str]:
    """Coordinates on <p>.dlq already sent back (committed ledger entries)."""
    ledger = kafka.whole_topic(settings, ledger_topic(settings))
    if ledger is None:
        return set()  # nothing was ever redriven
    return {msg.key().decode() for msg in kafka.read_partitions(settings, ledger)}


def select(letters: list[DeadLetter], *, stage: str | None = None, reason: str | None = None,
           at: list[str] | None = None) -> list[DeadLetter]:
    return [d for d in letters
            if (stage is None or d.event["stage"] == stage)
            and (reason is None or reason in d.event["reason"])
            and (not at or d.coordinates in at)]


def redrive(settings: Settings, **selection: Any) -> list[DeadLetter]:
    """Send the selected dead letters not yet redriven back to their source topics, once.
    Returns those sent."""
    ensure_ledger(settings)
    # Its initialization fences a concurrent redrive before the ledger is read.
    producer = kafka.transactional_producer(settings, f"{settings.prefix}.dlq-redrive", 60)
    done = redriven(settings)
    todo = [d for d in select(list(dead_letters(settings)), **selection)
            if d.coordinates not in done]
    if not todo:
        return []
    with kafka.transaction(producer):
        for d in todo:
            e = d.event
            kafka.produce(producer, e["source_topic"], e["value"], e["key"],
                          partition=e["source_partition"])
            kafka.produce(producer, ledger_topic(settings), json.dumps({
                "source_topic": e["source_topic"], "source_partition": e["source_partition"],
                "source_offset": e["source_offset"]}).encode(), d.coordinates)
    return todo
