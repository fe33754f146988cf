"""`rollstream dlq list|show|redrive`: inspect the dead-letter topic and send fixed events back."""

from __future__ import annotations

import argparse
import json

from rollstream import config
from rollstream.cli import common
from rollstream.ops.dlq import dead_letters, decoded, redrive, redriven, select, summary


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
        config.add_arguments(p, "kafka", "command")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = common.settings(args, "dlq")
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
