"""`rollstream replay`: re-read a topic's events, to another topic or as JSON lines."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from rollstream import config
from rollstream.cli import common


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it names an offset)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither epoch milliseconds nor ISO 8601 (2025-01-31T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def run_replay(args: argparse.Namespace) -> int:
    from producers.replay import replay
    from rollstream.contracts.graph import GRAPH

    # A topic of the graph named by its suffix is checked by name: a refusal then names it.
    suffix = [args.topic] if args.topic in {spec.suffix for spec in GRAPH} else []
    settings, _ = common.for_job(common.settings(args), args.job)
    try:
        count = replay(
            common.checked(settings, *suffix),
            args.topic,
            start_offset=args.from_offset,
            end_offset=args.to_offset,
            start_time_ms=args.from_time,
            end_time_ms=args.to_time,
            where=args.where,
            policy_version=args.policy_version,
            to_topic=args.to_topic,
            limit=args.limit,
        )
    except ValueError as exc:  # bad topic or filter: a usage error, not a crash
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"replayed {count} events" + (f" to {args.to_topic}" if args.to_topic else ""),
        file=sys.stderr,  # stdout carries the JSON lines
    )
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    """Add `replay` to the `rollstream` command's subparsers."""
    r = sub.add_parser(
        "replay",
        help="re-read a topic's events: copy them to another topic or print them as JSON",
        description="Re-read the committed events of a topic in the range [from, to) on every\n"
        "partition (no bound: from the start / to the current end), keep those matching the\n"
        "filters, then either copy their original bytes and keys to --to-topic in one\n"
        "transaction, or print one JSON object per line on stdout: {topic, partition, offset,\n"
        "timestamp_ms, key, type, value}, token ids and logprobs as lists, other bytes base64.\n"
        "Undecodable events are skipped and counted on stderr.",
        epilog="examples:\n"
        "  rollstream replay --topic scored --where failure_class=ok --policy-version 3\n"
        "  rollstream replay --topic tasks --from-time 2025-01-31T12:00 --to-topic rerun.tasks\n"
        "  rollstream replay --topic trajectories --where task.env=arithmetic --limit 5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument(
        "--topic",
        required=True,
        help="topic to read; a name that is not a topic is taken as a suffix: "
        "`scored` means <prefix>.scored",
    )
    r.add_argument("--from-offset", type=int, metavar="N", help="first offset, each partition")
    r.add_argument(
        "--to-offset", type=int, metavar="N", help="stop before this offset, each partition"
    )
    r.add_argument(
        "--from-time",
        type=parse_time_ms,
        metavar="TIME",
        help="first event at or after TIME: epoch ms or ISO 8601 (UTC unless an offset is given)",
    )
    r.add_argument(
        "--to-time", type=parse_time_ms, metavar="TIME", help="stop before events at TIME"
    )
    r.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="keep events whose dotted field PATH equals VALUE as text, e.g. task.env=arithmetic, "
        "trajectory.task.env=guess_number, failure_class=ok; lists match if any element does "
        "(trajectory.turns.finish_reason=length); repeat to require several",
    )
    r.add_argument(
        "--policy-version",
        type=int,
        metavar="N",
        help="keep trajectories with a turn sampled by policy version N (and that PolicyVersion)",
    )
    target = r.add_mutually_exclusive_group()
    target.add_argument(
        "--to-topic",
        metavar="T2",
        help="copy events to this exact topic (created like the source if missing)",
    )
    target.add_argument(
        "--json", action="store_true", help="print one JSON object per line (the default)"
    )
    r.add_argument("--limit", type=int, metavar="N", help="stop after N replayed events")
    common.add_job_argument(r, "replay a topic")
    config.add_arguments(r, "kafka", "command")
    r.set_defaults(func=run_replay)
