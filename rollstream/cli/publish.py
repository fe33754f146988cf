"""`rollstream publish`: validate a task file and put its tasks into the pipeline."""

from __future__ import annotations

import argparse
import sys

from rollstream import config
from rollstream.cli import common


def run_publish(args: argparse.Namespace) -> int:
    from producers.publish import TaskFileError, already_handled, load_tasks, publish

    # Resolved once: the bounds checked here are those of the settings that reach the broker.
    resolved = config.load(args)
    try:
        tasks = load_tasks(args.file, args.format, resolved)
    except (TaskFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"{len(tasks)} tasks valid in {args.file} (dry run: nothing sent)")
        return 0
    settings, _ = common.for_job(common.named_broker(resolved), args.job)
    settings = common.checked(settings, "tasks")
    # Read before sending: once sent, INIT may handle these very tasks while the read runs.
    try:
        handled = already_handled(settings, [t["task_id"] for t in tasks])
    except TimeoutError as exc:  # a very long seen topic on a slow broker: publish anyway
        print(f"note: could not check which task ids INIT has handled: {exc}", file=sys.stderr)
        handled = []
    try:
        sent = publish(settings, tasks)
    except KeyboardInterrupt:  # the transaction is aborted: all or nothing
        print("interrupted: nothing was sent", file=sys.stderr)
        return 130
    print(f"sent {sent} tasks to {settings.topics.tasks}")
    if handled:
        shown = ", ".join(handled[:5]) + (", ..." if len(handled) > 5 else "")
        print(f"warning: INIT has already handled {len(handled)} of these task ids ({shown}) "
              "and drops them as duplicates: give tasks new ids to run them again",
              file=sys.stderr)
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    """Add `publish` to the `rollstream` command's subparsers."""
    # producers.publish is not imported here for its FORMATS: it pulls in numpy and fastavro,
    # and `rollstream --help` should stay instant. load_tasks rejects an unknown format.
    p = sub.add_parser(
        "publish",
        help="validate a task file and send it to <prefix>.tasks",
        description="Validate every task in FILE (JSON syntax, the Task schema, a known env) and "
        "only then send them all, keyed by task_id, in one Kafka transaction: all or nothing. "
        "Bounds are checked too (group_size, max_turns, sampling parameters, prompt and episode "
        "size; limits in the --max-* settings). A bad line is reported as FILE:LINE: field ... "
        "and exits with status 2. Task ids INIT has already handled are named in a warning "
        "after sending (INIT drops them as duplicates). Ctrl-C before the transaction "
        "commits sends nothing (exit 130).",
    )
    p.add_argument("file", metavar="FILE.jsonl", help="one Task JSON object per line")
    p.add_argument(
        "--format",
        default="rollstream",
        help="task source format (default rollstream: JSONL of Task objects; `data` may be a "
        "JSON object or a string holding one; missing optional fields take schema defaults); "
        "an unknown format is an error that lists the known ones",
    )
    p.add_argument("--dry-run", action="store_true", help="validate only; send nothing")
    common.add_job_argument(p, "send the tasks to the tasks topic")
    config.add_arguments(p, "kafka", "command", "bounds")
    p.set_defaults(func=run_publish)
