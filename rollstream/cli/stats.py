"""`rollstream stats`: live analytics (faust-streaming), served as JSON and published to
<prefix>.stats."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollstream import config
from rollstream.cli import common
from rollstream.cluster.kafka_errors import EX_CONFIG, KafkaProblem
from rollstream.telemetry import metrics


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "stats", help="live analytics (faust-streaming): windowed tables served as JSON",
        description="Read scored, trajectories, policy and dlq in the consumer group "
                    "<prefix>.stats and keep all-time, 10 s tumbling and 1 min hopping tables: "
                    "episodes/s, reward by policy version and by environment, failure classes, "
                    "turns and tokens per episode, stage latency percentiles, dead letters. "
                    "Serves them at http://127.0.0.1:PORT/stats and publishes them to the "
                    "compacted topic <prefix>.stats.")
    parser.add_argument("--web-port", type=int, default=6066, help="port of the JSON server")
    parser.add_argument("--web-host", default="127.0.0.1",
                        help="address the JSON server listens on (0.0.0.0 in a container)")
    parser.add_argument("--datadir", type=Path, default=Path(".rollstream/stats"),
                        help="faust's local state directory")
    # --instance-id: each stats process of one prefix needs its own (static membership).
    config.add_arguments(parser, "kafka", "command", "service")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient

    from rollstream.cluster.security import UnsupportedSecurity, faust_credentials
    from rollstream.ops.analytics import build_app, declare_changelogs

    try:
        import faust
    except ImportError as exc:
        raise SystemExit("rollstream stats needs faust-streaming: pip install "
                         "'rollstream[stats]'") from exc

    resolved = config.load(args)
    try:  # before the broker: a mechanism faust cannot use is no reason to wait for one
        faust_credentials(resolved.kafka_properties)
    except UnsupportedSecurity as exc:
        raise KafkaProblem(str(exc), EX_CONFIG) from None
    settings = common.checked(common.named_broker(resolved), "scored")
    common.log_to_stderr()
    metrics.serve(settings.service.metrics_port)  # /health and /ready beside faust's web server
    scored = settings.topics.scored
    meta = AdminClient(settings.kafka()).list_topics(scored, timeout=30).topics.get(scored)
    if meta is None or meta.error is not None:
        raise SystemExit(f"topic {scored} does not exist (rollstream topics create)")
    # The tables' changelogs must have as many partitions as the topics they count.
    datadir = args.datadir / settings.prefix
    datadir.mkdir(parents=True, exist_ok=True)
    app = build_app(settings, args.web_port, datadir, len(meta.partitions), args.web_host)
    declare_changelogs(app, settings)
    faust.Worker(app, loglevel="INFO").execute_from_commandline()
    return 0
