"""`rollstream schemas check|export`: schema evolution checked with Apache Avro's checker, and
self-contained schemas with their fingerprints for consumers in other languages."""

from __future__ import annotations

import argparse
from pathlib import Path

import schemas
from rollstream.contracts import schema_tools
from rollstream.contracts.schema_tools import DEFAULT_DIR, TABLE, SchemaSet, check, export


def _check_cmd(args: argparse.Namespace) -> int:
    found = SchemaSet.load(Path(args.schemas))
    problems = check(found)
    for p in problems:
        print(f"INCOMPATIBLE {p}")
    if not problems:
        print(f"ok: {len(found.current)} schemas are backward and forward compatible with "
              f"{len(found.retired)} retired versions; {len(found.aliases)} legacy aliases resolve")
    return 1 if problems else 0


def _export_cmd(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    table = export(SchemaSet.load(Path(args.schemas)), out)
    for name, fp in table.items():
        print(f"{fp}  {schemas.NAMESPACE}.{name}")
    print(f"wrote {len(table)} schemas and {TABLE} to {out}")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schemas", description=schema_tools.__doc__,
                       help="Check schema evolution; export schemas for other languages.")
    inner = p.add_subparsers(dest="schemas_command", metavar="ACTION", required=True)
    c = inner.add_parser(
        "check", help="Check current schemas against every retired version (exit 1 if not).",
        description="Check, with Apache Avro's compatibility checker, that every current schema "
                    "reads events of each retired version in history/ (backward) and that "
                    "each retired version reads current events (forward); and that every "
                    "legacy fingerprint alias names a retired version of its record.")
    c.add_argument("--schemas", default=str(DEFAULT_DIR), metavar="DIR",
                   help="Schemas directory (default: the installed one).")
    c.set_defaults(func=_check_cmd)
    e = inner.add_parser(
        "export", help="Write a self-contained .avsc per topic record and a fingerprint table.",
        description="Write one self-contained .avsc per record type written to a topic (every "
                    "named type inlined, as any Avro library reads it) and fingerprints.json: "
                    "the single-object fingerprint of each, plus the legacy ones earlier "
                    "releases wrote, with every retired schema under history/.")
    e.add_argument("dir", help="Output directory (created if missing).")
    e.add_argument("--schemas", default=str(DEFAULT_DIR), metavar="DIR",
                   help="Schemas directory (default: the installed one).")
    e.set_defaults(func=_export_cmd)
