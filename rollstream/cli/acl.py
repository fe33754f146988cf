"""`rollstream acl grant|revoke|list|user`: least-privilege rights on a secured cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rollstream import config
from rollstream.cli import common
from rollstream.config import Settings


def register_cli(sub: argparse._SubParsersAction) -> None:
    from rollstream.cluster.acl import ROLES  # one table of roles: the ACLs and what each is for

    parser = sub.add_parser(
        "acl", help="grant a principal what a pipeline on one prefix needs (secured clusters)",
        description="Prefixed ACLs on <prefix>.: topics, consumer groups and transactional ids, "
                    "nothing cluster-wide. Run as an administrator (--kafka-config with a super "
                    "user's properties, e.g. the secured bundled broker's admin.properties). "
                    "Roles: " + "; ".join(f"{k}: {what}" for k, (what, _) in ROLES.items()))
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, what in (("grant", "add a role's ACLs"), ("revoke", "remove a role's ACLs")):
        p = actions.add_parser(name, help=what)
        p.add_argument("principal", metavar="User:NAME")
        p.add_argument("--role", required=True, choices=sorted(ROLES))
        p.add_argument("--on-prefix", dest="acl_prefix", metavar="PREFIX",
                       help="the prefix the role covers (default: --prefix)")
        p.add_argument("--dry-run", action="store_true", help="print the ACLs, change nothing")
        config.add_arguments(p, "kafka", "command")
        p.set_defaults(func=run_grant if name == "grant" else run_revoke)
    p = actions.add_parser("list", help="the cluster's ACLs (of one principal)")
    p.add_argument("principal", metavar="User:NAME", nargs="?")
    config.add_arguments(p, "kafka", "command")
    p.set_defaults(func=run_list)
    p = actions.add_parser("user", help="create a SCRAM user, or change its password")
    p.add_argument("name")
    p.add_argument("--mechanism", choices=("SCRAM-SHA-512", "SCRAM-SHA-256"),
                   default="SCRAM-SHA-512", help="the SCRAM mechanism the credential is for "
                   "(default SCRAM-SHA-512)")
    p.add_argument("--password-file", type=Path,
                   help="file holding the password (default: read from standard input)")
    config.add_arguments(p, "kafka", "command")
    p.set_defaults(func=run_user)


def _admin(args: argparse.Namespace) -> tuple[Any, Settings]:
    from confluent_kafka.admin import AdminClient

    settings = common.settings(args)
    return AdminClient(settings.kafka()), settings


def run_grant(args: argparse.Namespace) -> int:
    from rollstream.cluster import acl

    prefix = args.acl_prefix or config.load(args).prefix
    if args.dry_run:
        for binding in acl.bindings(args.principal, prefix, args.role):
            print(acl.describe(binding))
        return 0
    admin, settings = _admin(args)
    for line in acl.grant(admin, args.principal, prefix, args.role, settings.timeout_s):
        print(line)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from rollstream.cluster import acl

    admin, settings = _admin(args)
    prefix = args.acl_prefix or settings.prefix
    removed = acl.revoke(admin, args.principal, prefix, args.role, settings.timeout_s)
    print(f"{removed} ACLs removed")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from rollstream.cluster import acl

    admin, settings = _admin(args)
    for line in acl.listed(admin, args.principal, settings.timeout_s):
        print(line)
    return 0


def run_user(args: argparse.Namespace) -> int:
    from rollstream.cluster import acl

    password = (args.password_file.read_text() if args.password_file
                else sys.stdin.readline()).strip()
    if not password:
        print("error: empty password", file=sys.stderr)
        return 2
    admin, settings = _admin(args)
    acl.set_password(admin, args.name, password, settings.timeout_s, args.mechanism)
    print(f"{args.mechanism} credential set for User:{args.name}")
    return 0
