"""`rollstream sandbox list|sweep`: see the sandboxes on this host (and Docker engine), and
remove those left behind by processes that died."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rollstream import config


def _backends(args: argparse.Namespace) -> list[Any]:
    from rollstream.sandbox.backends import get_backend, unavailable

    settings = config.load(args).sandbox  # where this host's sandboxes live
    names = args.backend

    found = []
    for name in names or ["bwrap", "docker"]:
        # bwrap sandboxes are directories: listable even where bwrap itself is missing.
        reason = unavailable(name) if name == "docker" else None
        if reason is None:
            found.append(get_backend(name, settings))
        else:
            print(f"{name}: skipped ({reason})", file=sys.stderr)
    return found


def _state(alive: bool | None) -> str:
    return {True: "owner alive", False: "abandoned", None: "owner on another host"}[alive]


def list_command(args: argparse.Namespace) -> int:
    rows = []
    for backend in _backends(args):
        for lease in backend.leases():
            rows.append({"backend": backend.name, "id": lease.id, "owner": lease.owner,
                         "state": _state(lease.owner_alive()),
                         "age_s": round(time.time() - lease.created_at, 1),
                         "labels": lease.labels})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    for row in rows:
        labels = " ".join(f"{k}={v}" for k, v in row["labels"].items())
        print(f"{row['backend']:<7} {row['id']:<20} {row['age_s']:>9.1f}s  {row['state']:<21} "
              f"{row['owner']}  {labels}")
    print(f"{len(rows)} sandbox(es)", file=sys.stderr)
    return 0


def sweep_command(args: argparse.Namespace) -> int:
    total = 0
    for backend in _backends(args):
        for lease in backend.reap(older_than_s=args.older_than, everything=args.all):
            print(f"removed {backend.name} sandbox {lease.id} (owner {lease.owner})")
            total += 1
    print(f"removed {total} sandbox(es)", file=sys.stderr)
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "sandbox", help="list or sweep sandboxes (bwrap workspaces, docker containers)",
        description="Sandboxes record their owner process. `list` shows them; `sweep` removes "
        "those whose owner on this host has died (an abandoned episode), and with --older-than "
        "or --all also the others. A sweep is safe while stages run: live owners are skipped.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    backends = {"choices": ["bwrap", "docker"], "help": "only this backend (repeatable)"}

    ls = actions.add_parser("list", help="one line per sandbox: backend, id, age, owner state")
    ls.add_argument("--backend", action="append", **backends)
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    config.add_arguments(ls, "sandbox")
    ls.set_defaults(func=list_command)

    sw = actions.add_parser("sweep", help="remove abandoned sandboxes")
    sw.add_argument("--backend", action="append", **backends)
    group = sw.add_mutually_exclusive_group()
    group.add_argument("--older-than", type=float, metavar="SECONDS",
                       help="also remove sandboxes older than this, whoever owns them")
    group.add_argument("--all", action="store_true",
                       help="remove every sandbox, even those of live processes")
    config.add_arguments(sw, "sandbox")
    sw.set_defaults(func=sweep_command)
