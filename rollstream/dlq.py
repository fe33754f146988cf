"""`rollstream dlq list|show|redrive`: look into the dead-letter topic and send fixed events back.

A redrive re-publishes a dead letter's original key and bytes to its source topic, and in the
same Kafka transaction writes the dead letter's coordinates to `<p>.dlq-redriven` (compacted,
keyed by the coordinates). Before choosing what to send, a redrive reads that ledger, after
`init_transactions` with one transactional id per prefix: any earlier or concurrent redrive has
then either committed (its coordinates are in the ledger) or been fenced and aborted (nothing of
it is visible). So a dead letter goes back at most once, however often the command is run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from rollstream import config, kafka
from rollstream.broker import with_broker
from rollstream.codec import DecodeError, codec
from rollstream.config import Settings
from rollstream.events import DEAD_LETTER


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
    return f"{settings.topics.dlq}-redriven"


def _partitions(settings: Settings, topic: str) -> list[TopicPartition] | None:
    """Every partition of `topic` from its beginning; None if the topic does not exist."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient(settings.kafka()).list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    return [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]


def dead_letters(settings: Settings) -> Iterator[DeadLetter]:
    """Every dead letter on <p>.dlq (committed ones), oldest first per partition."""
    partitions = _partitions(settings, settings.topics.dlq)
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
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(settings.kafka())
    topic = NewTopic(ledger_topic(settings), num_partitions=1, replication_factor=1,
                     config={"cleanup.policy": "compact"})
    try:
        admin.create_topics([topic])[topic.topic].result(timeout=60)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def redriven(settings: Settings) -> set[str]:
    """Coordinates on <p>.dlq already sent back (committed ledger entries)."""
    ledger = _partitions(settings, ledger_topic(settings))
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
    producer = kafka.producer(settings, f"{settings.prefix}.dlq-redrive")
    producer.init_transactions(60)  # fences a concurrent redrive before the ledger is read
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


# -- CLI --------------------------------------------------------------------------------------

def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "dlq", help="inspect the dead-letter topic and send fixed events back",
        description="Dead letters are events a stage could not decode or validate, kept with "
                    "their reason and source coordinates. A dead letter is named by its "
                    "coordinates on <prefix>.dlq, PARTITION:OFFSET.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="counts by stage, source topic and reason",
                                 description="Group the dead letters by stage, source topic "
                                             "and reason class, with the latest reason of each.")
    listing.add_argument("--json", action="store_true", help="one JSON object per group")
    show = actions.add_parser("show", help="one dead letter, its original event decoded",
                              description="Print one dead letter as JSON; its original bytes "
                                          "are decoded when they are a known Avro event.")
    show.add_argument("at", metavar="PARTITION:OFFSET")
    again = actions.add_parser(
        "redrive", help="re-publish selected dead letters to their source topics, once",
        description="Re-publish the original key and bytes of the selected dead letters to "
                    "their source topic and partition, in one transaction that also records "
                    "them as redriven: running it again sends nothing twice. Select with "
                    "--stage, --reason and --at (all must match), or --all.")
    again.add_argument("--stage", help="only dead letters from this stage (init, run, ...)")
    again.add_argument("--reason", help="only those whose reason contains this text")
    again.add_argument("--at", action="append", metavar="PARTITION:OFFSET",
                       help="only this dead letter (repeatable)")
    again.add_argument("--all", action="store_true", help="every dead letter not yet redriven")
    again.add_argument("--dry-run", action="store_true", help="list what would be sent")
    for p in (listing, show, again):
        config.add_arguments(p)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = with_broker(config.load(args))
    if args.action == "list":
        rows = summary(list(dead_letters(settings)), redriven(settings))
        if args.json:
            for row in rows:
                print(json.dumps(row))
        else:
            print(f"{sum(r['count'] for r in rows)} dead letters on {settings.topics.dlq}")
            for r in rows:
                print(f"{r['count']:6d}  {r['stage']:<6} {r['source_topic']:<28} {r['reason']:<12}"
                      f" redriven {r['redriven']}  latest {r['latest_at']}: {r['latest']}")
        return 0
    if args.action == "show":
        match = select(list(dead_letters(settings)), at=[args.at])
        if not match:
            raise SystemExit(f"no dead letter at {args.at} on {settings.topics.dlq}")
        print(json.dumps(decoded(match[0]), indent=2, default=str))
        return 0
    selection = {"stage": args.stage, "reason": args.reason, "at": args.at}
    if not args.all and not any(selection.values()):
        raise SystemExit("say which dead letters to redrive: --stage, --reason, --at or --all")
    if args.dry_run:
        done = redriven(settings)
        for d in select(list(dead_letters(settings)), **selection):
            if d.coordinates not in done:
                print(f"{d.coordinates} -> {d.event['source_topic']}[{d.event['source_partition']}]"
                      f"  {d.event['reason']}")
        return 0
    sent = redrive(settings, **selection)
    for d in sent:
        print(f"{d.coordinates} -> {d.event['source_topic']}[{d.event['source_partition']}]")
    print(f"redriven {len(sent)}")
    return 0
