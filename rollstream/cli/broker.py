"""`rollstream broker start|stop|status|fetch`: manage the bundled Kafka broker (one node, or a
local cluster with `start --nodes 3`)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollstream.broker import class_archive, cluster, local


def _on_chosen_broker(command: Callable[[argparse.Namespace], int]
                      ) -> Callable[[argparse.Namespace], int]:
    """`command` on the secured broker with --secure, else on the plain one."""
    def run(args: argparse.Namespace) -> int:
        with local.secured() if args.secure else contextlib.nullcontext():
            return command(args)
    return run


def _secured_note() -> None:
    # Only a secured broker has a mutual-TLS listener (a plain cluster's nodes have no port).
    material = local.security()
    if material is not None:
        print(f"SASL_SSL ({material.admin_properties.name}: the admin super user's client "
              f"properties for --kafka-config): {material.admin_properties}; mutual TLS "
              f"(`rollstream broker client-cert`) at {_mtls_bootstrap()}", file=sys.stderr)


def _mtls_bootstrap() -> str | None:
    """The running secured broker's (or cluster's) mutual-TLS addresses."""
    st = cluster.state()
    if st is not None and cluster.running_nodes():
        return cluster.bootstrap_of(st, "mtls_port")
    return local.status()["mtls_bootstrap"] if local.is_running() else None


def _start(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.nodes > 1:
        return _start_cluster(args, t0)
    try:
        bootstrap = local.start(timeout=args.timeout)
    except (local.BrokerError, ValueError) as exc:  # ValueError: a bad plain-users file
        print(f"error: {exc}", file=sys.stderr)
        return 1
    st = local.status()
    # The address alone on stdout, so `export KAFKA_BOOTSTRAP_SERVERS=$(rollstream broker start)`
    # works; the rest is for people and goes to stderr.
    print(bootstrap)
    print(
        f"Kafka {st['kafka_version']} broker running at {bootstrap} (pid {st['pid']}, "
        f"ready after {time.monotonic() - t0:.1f} s); log: {st['log']}",
        file=sys.stderr,
    )
    _secured_note()
    return 0


def _start_cluster(args: argparse.Namespace, t0: float) -> int:
    try:
        bootstrap = cluster.start(args.nodes, timeout=args.timeout)
    except (local.BrokerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(bootstrap)
    print(
        f"Kafka {local.kafka_version()} cluster of {args.nodes} nodes running at {bootstrap} "
        f"(ready after {time.monotonic() - t0:.1f} s); logs: {cluster.cluster_dir()}/node*/",
        file=sys.stderr,
    )
    _secured_note()
    return 0


def _client_cert(args: argparse.Namespace) -> int:
    with local.secured() as material:
        bootstrap = _mtls_bootstrap()
        if bootstrap is None:
            print("error: the secured broker is not running: `rollstream broker start --secure`",
                  file=sys.stderr)
            return 1
        try:
            cert, key = material.issue_client_certificate(args.name, args.out)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    props = args.out / f"{args.name}.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in
                             material.certificate_properties(bootstrap, cert, key).items()))
    print(props)
    print(f"principal User:CN={args.name} (grant it with `rollstream acl grant`); certificate "
          f"{cert}, key {key}", file=sys.stderr)
    return 0


def _stop(args: argparse.Namespace) -> int:
    try:
        stopped = local.stop(timeout=args.timeout)
        nodes = cluster.stop(timeout=args.timeout)
    except local.BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("broker stopped" if stopped else "broker was not running")
    if nodes:
        print(f"cluster nodes {', '.join(map(str, nodes))} stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    st: dict[str, Any] = local.status()
    print(f"running:   {'yes' if st['running'] else 'no'}")
    if st["running"]:
        print(f"pid:       {st['pid']}")
    print(f"bootstrap: {st['bootstrap'] or '(not started yet)'}")
    version = st["kafka_version"] or "(jars not fetched yet)"
    if st["kafka_version"] and not st["jars_ready"]:
        version += " (pom.xml changed: the next start fetches new jars)"
    print(f"kafka:     {version}")
    print(f"home:      {st['home']}")
    print(f"log:       {st['log']}")
    cluster_state = cluster.state()
    if cluster_state is not None:
        up = cluster.running_nodes()
        print(f"cluster:   {len(up)} of {len(cluster_state['nodes'])} nodes running at "
              f"{cluster.bootstrap_of(cluster_state)}")
    return 0 if st["running"] else 3


def _fetch(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        libs = local.resolve_jars(force=args.force)
    except local.BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Kafka {local.kafka_version()} jars in {libs} ({time.monotonic() - t0:.1f} s)")
    if args.class_archive and not local.class_archive().is_file():
        t0 = time.monotonic()
        try:
            archive = class_archive.build()
        except local.BrokerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"class-data archive {archive} ({time.monotonic() - t0:.1f} s)")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    """Add `broker` and its subcommands to the `rollstream` command's subparsers."""
    parser = sub.add_parser(
        "broker",
        help="run the bundled Kafka broker, or a local 3-node cluster (no Docker needed)",
        description=(
            "The bundled Apache Kafka 4.x broker (KRaft, one node, 127.0.0.1 only), run from "
            "Maven Central jars with Java 17+. Its data, log and ports live under $ROLLSTREAM_HOME "
            "(default: .rollstream in the project). Commands that need a broker start it on "
            "demand unless KAFKA_BOOTSTRAP_SERVERS or --bootstrap-servers names another one."
        ),
    )
    commands = parser.add_subparsers(dest="broker_command", metavar="ACTION", required=True)

    p = commands.add_parser(
        "start",
        help="start the broker (reuses a running one); prints its bootstrap address",
        description="Start the broker detached, or reuse the one already running, and wait "
        "until it answers. Prints host:port on stdout.",
    )
    p.add_argument("--timeout", type=float, default=90, help="seconds to wait for it (default 90)")
    p.add_argument(
        "--nodes", type=int, default=1,
        help="1 (default): the single broker; 3: a local KRaft cluster of 3 broker+controller "
        "nodes, replication factor 3, min.insync.replicas=2, transaction and offsets logs "
        "replicated (for failover tests and benchmarks; create topics with "
        "`rollstream topics create --replication-factor 3`); prints the bootstrap list",
    )
    _secure_flag(p)
    p.set_defaults(func=_on_chosen_broker(_start))

    p = commands.add_parser(
        "stop", help="stop the broker and the local cluster's nodes (SIGTERM, then SIGKILL)")
    p.add_argument("--timeout", type=float, default=30, help="seconds before SIGKILL (default 30)")
    _secure_flag(p)
    p.set_defaults(func=_on_chosen_broker(_stop))

    p = commands.add_parser(
        "status",
        help="show whether the broker runs, where, and its log (exit 0 running, 3 not)",
    )
    _secure_flag(p)
    p.set_defaults(func=_on_chosen_broker(_status))

    p = commands.add_parser(
        "client-cert",
        help="a client certificate from the secured broker's CA, for mutual TLS",
        description="Sign a certificate for principal User:CN=NAME with the secured broker's "
        "CA and write NAME.pem, NAME.key and NAME.properties (its client properties on the "
        "mutual-TLS listener) into --out; prints the properties file's path.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--out", type=Path, default=Path("."),
                   help="folder for the files (default: the current one)")
    p.set_defaults(func=_client_cert)

    p = commands.add_parser(
        "fetch",
        help="download the broker's jars with Maven now (start does it when missing)",
    )
    p.add_argument("--force", action="store_true", help="download again even if present")
    p.add_argument(
        "--class-archive", action="store_true",
        help="also make the broker JVM's class-data archive unless it is there (about 10 s, "
        "once): every broker started after it starts on about half the CPU (for suites and "
        "benchmarks that start many)")
    p.set_defaults(func=_fetch)


def _secure_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secure", action="store_true",
        help="the secured broker (its own home and ports, beside the plain one): SASL_SSL with "
        "SCRAM-SHA-512 (SCRAM-SHA-256 and PLAIN too), mutual TLS on a listener of its own, a "
        "locally made CA, the StandardAuthorizer denying what no ACL allows, one super user "
        "`admin` whose client properties start writes to admin.properties; grant other "
        "principals prefixed ACLs with `rollstream acl`")
