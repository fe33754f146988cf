"""`rollstream stats`: live analytics of a pipeline, a faust-streaming application.

It reads `scored`, `trajectories`, `policy` and `dlq` in its own consumer group
(`<prefix>.stats`) and serves, as JSON at /stats on Faust's web server, and publishes every few
seconds to the compacted topic `<prefix>.stats` (key `summary`): all-time sums, the current
10 s tumbling window and the 1 min hopping window (advancing by 10 s) that holds the stream's
latest event: episodes and episodes/s (over the 1 min window), reward by policy version and by
environment, failure-class counts, turns and sampled tokens per episode, latency percentiles
(INIT -> RUN start, the episode in RUN, RUN -> EVAL) from the events' own timestamps,
trajectories by termination, and dead letters by stage.

Why faust here and not in the stages: its tables cannot take part in the stages' Kafka
transactions, but analytics only read. It runs with `processing_guarantee=exactly_once`, which
reads committed data only, so aborted stage outputs are not counted.

Tables: `totals` (all time), `this_10s` (`Table.tumbling`, 10 s) and `last_1m`
(`Table.hopping`, 1 min advancing by 10 s), each windowed one on the events' own timestamps and
expiring (with its changelog's retention) a minute after its window: memory stays bounded by
topics x partitions x live windows, whatever the stream's length. A report is the newest
10 s window and the oldest 1 min window that holds it (the stream's time, not the clock's).

Exact after a crash: faust (0.15) writes a table's changelog records and the input offsets in
one transaction, but the records of events read after the offsets were taken can ride along,
so a SIGKILL leaves the changelog holding updates for events past the committed offsets; the
restarted worker recovers them and then reads those events again (at least once), and running
totals would count them twice (a manual run once showed 43 for 40). So every table is keyed by
source partition (`<topic>|<partition>`) and each value holds, in the one changelog record, the
sums and the offset of the last event they include: an event read again finds its offset
already counted and changes nothing. The opposite, offsets past the changelog, and a restart
that skipped recovery, were faust's own; rollstream/ops/faust_transport.py fixes both, the first
also from the tables' side: after recovery, a partition whose tables counted less than its
committed offset is read again from there (`resume_offsets`).
"""

from __future__ import annotations

import functools
import json
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from rollstream.cluster import topics as kafka_topics
from rollstream.config import Settings
from rollstream.contracts.codec import DecodeError, codec, unpack_ids
from rollstream.contracts.events import DEAD_LETTER, POLICY_VERSION, SCORED_TRAJECTORY, TRAJECTORY
from rollstream.contracts.graph import STATS
from rollstream.telemetry import health

# Latency buckets (ms) for the percentile estimates: a percentile is reported as the upper
# bound of the bucket it falls in.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000,
                      60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000)
PERCENTILES = (50, 90, 99)
PUBLISH_INTERVAL_S = 5.0
TUMBLING_S, HOPPING_S, HOP_S = 10, 60, 10
EXPIRES = timedelta(minutes=1)  # a window's sums are dropped this long after it closes
CLEANUP_INTERVAL_S = 5.0  # how often faust drops expired windows (its default: 30 s)
SESSION_TIMEOUT_S = 30.0  # a worker silent this long leaves the group


def scored_sums(event: dict) -> list[tuple[str, str, float]]:
    """What one ScoredTrajectory adds: (metric, label, amount)."""
    trajectory = event["trajectory"]
    turns = trajectory["turns"]
    env = trajectory["task"]["env"]
    version = str(turns[0]["policy_version"]) if turns else "none"
    tokens = sum(len(unpack_ids(t["completion_ids"])) for t in turns)
    sums = [("episodes", "all", 1.0), ("episodes_by_env", env, 1.0),
            ("failure_class", event["failure_class"], 1.0),
            ("episodes_by_version", version, 1.0),
            ("turns_by_env", env, float(len(turns))), ("tokens_by_env", env, float(tokens))]
    if event["reward"] is not None:
        sums += [("rewarded_by_version", version, 1.0),
                 ("reward_sum_by_version", version, event["reward"]),
                 ("rewarded_by_env", env, 1.0), ("reward_sum_by_env", env, event["reward"])]
    finished = trajectory["finished_at_ms"]
    spans = {"init_to_run": trajectory["started_at_ms"] - trajectory["task"]["created_at_ms"],
             "run": finished - trajectory["started_at_ms"] if finished else None,
             "run_to_eval": event["scored_at_ms"] - finished if finished else None}
    for stage, ms in spans.items():
        if ms is not None and ms >= 0 and trajectory["task"]["created_at_ms"] > 0:
            sums.append(("latency_ms", f"{stage}:{_bucket(ms)}", 1.0))
    return sums


def _bucket(ms: float) -> int:
    for i, bound in enumerate(LATENCY_BUCKETS_MS):
        if ms <= bound:
            return i
    return len(LATENCY_BUCKETS_MS)


def summarize(sums: dict[tuple[str, str], float]) -> dict[str, Any]:
    """The report, from sums keyed by (metric, label) (partitions already added up)."""
    def by(metric: str) -> dict[str, float]:
        # A window without the key reads as 0: left out.
        return {label: v for (m, label), v in sorted(sums.items()) if m == metric and v}

    def mean(total: dict[str, float], count: dict[str, float]) -> dict[str, float | None]:
        return {k: (total.get(k, 0.0) / n if n else None) for k, n in count.items()}

    rewarded_v, rewarded_e = by("rewarded_by_version"), by("rewarded_by_env")
    episodes_env = by("episodes_by_env")
    reward_v = mean(by("reward_sum_by_version"), rewarded_v)
    reward_e = mean(by("reward_sum_by_env"), rewarded_e)
    latency: dict[str, dict[str, float]] = {}
    buckets: dict[str, dict[int, float]] = {}
    for label, n in by("latency_ms").items():
        stage, index = label.rsplit(":", 1)
        buckets.setdefault(stage, {})[int(index)] = n
    for stage, counts in buckets.items():
        total = sum(counts.values())
        latency[stage] = {}
        for q in PERCENTILES:
            seen = 0.0
            for i in sorted(counts):
                seen += counts[i]
                if seen >= total * q / 100:
                    latency[stage][f"p{q}"] = (LATENCY_BUCKETS_MS[i] if i < len(LATENCY_BUCKETS_MS)
                                               else float("inf"))
                    break
    return {
        "episodes": by("episodes").get("all", 0.0),
        "failure_classes": by("failure_class"),
        "by_version": {v: {"episodes": n, "rewarded": rewarded_v.get(v, 0.0),
                           "mean_reward": reward_v.get(v)}
                       for v, n in by("episodes_by_version").items()},
        "by_env": {e: {"episodes": n, "mean_reward": reward_e.get(e),
                       "turns_per_episode": by("turns_by_env").get(e, 0.0) / n,
                       "tokens_per_episode": by("tokens_by_env").get(e, 0.0) / n}
                   for e, n in episodes_env.items()},
        "latency_ms": latency,
        "trajectories": by("trajectories"),
        "dead_letters": by("dead_letters"),
    }


def counted(entry: dict[str, Any], event: tuple[int, list[tuple[str, str, float]]]
            ) -> dict[str, Any]:
    """A partition's sums (`{"offset": last counted, "sums": {"metric|label": amount}}`) with
    one more event, (offset, sums); unchanged for an event whose offset is counted already."""
    offset, sums = event
    if entry.get("offset", -1) >= offset:
        return entry
    added = dict(entry.get("sums", {}))
    for metric, label, amount in sums:
        key = f"{metric}|{label}"
        added[key] = added.get(key, 0.0) + amount
    return {"offset": offset, "sums": added}


def add_up(entries: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """The entries' sums (of partitions, in one window), by (metric, label)."""
    sums: dict[tuple[str, str], float] = {}
    for entry in entries:
        for key, amount in entry.get("sums", {}).items():
            metric, label = key.split("|", 1)
            sums[metric, label] = sums.get((metric, label), 0.0) + amount
    return sums


def newest_windows(tumbling: dict[Any, dict], hopping: dict[Any, dict]
                   ) -> tuple[list[dict], list[dict]]:
    """From windowed tables' data ({(key, (start, end)): entry}): the entries of the newest
    10 s window, and of the oldest 1 min window that holds it (as faust's
    `relative_to_stream` windows)."""
    if not tumbling:
        return [], []
    newest = max(start for _, (start, _) in tumbling)
    oldest = newest - (HOPPING_S - HOP_S)
    return ([e for (_, (start, _)), e in tumbling.items() if start == newest],
            [e for (_, (start, _)), e in hopping.items() if start == oldest])


def resume_offsets(app: Any, sources: set[str], totals: Any, windowed: list[Any]
                   ) -> dict[Any, int]:
    """Where counting must resume on each source partition held: after the last event that
    the totals and every window still held counted (a partition without totals: from its
    start; one without live windows: as its totals say). The consumer reads again from there
    where the committed offset lies past it (rollstream/ops/faust_transport.py); an event read
    again counts once in each table."""
    counted = {key: entry.get("offset", -1) for key, entry in totals.data.items()}
    for table in windowed:
        for (key, _), entry in table.data.items():
            counted[key] = min(counted.get(key, -1), entry.get("offset", -1))
    return {tp: counted.get(f"{tp.topic}|{tp.partition}", -1) + 1
            for tp in app.consumer.assignment() if tp.topic in sources}


async def drop_expired(table: Any) -> None:
    """Drop the recovered windows that have expired: faust expires only the windows it writes
    (it schedules a window's expiry on a write, not on a changelog record it recovers)."""
    now = time.time()
    for key in [k for k in table.data if table.window.stale(k[1][1], now)]:
        del table.data[key]


def declare_changelogs(app: Any, settings: Settings) -> None:
    """Create the tables' changelog topics as faust would (its names, partitions and cleanup
    settings) and wait until every broker knows them. Faust compares a changelog's partition
    count with its source topic's right after creating it itself: on a busy broker it read 0
    there, and the agent that counts crashed and never caught up."""
    from confluent_kafka.admin import NewTopic
    from mode.utils.times import want_seconds

    new = []
    for table in app.tables.values():
        topic = table.changelog_topic
        config = {key: str(value) for key, value in (topic.config or {}).items()}
        policy = [flag for flag, on in (("compact", topic.compacting),
                                        ("delete", topic.deleting)) if on]
        if policy:
            config["cleanup.policy"] = ",".join(policy)
        if topic.retention:
            config["retention.ms"] = str(int(want_seconds(topic.retention) * 1000))
        new.append(NewTopic(topic.get_topic_name(),
                            num_partitions=topic.partitions or app.conf.topic_partitions,
                            replication_factor=topic.replicas or app.conf.topic_replication_factor,
                            config=config))
    kafka_topics.create(settings.kafka(), new)


def build_app(settings: Settings, web_port: int, datadir: Path, partitions: int,
              web_host: str = "127.0.0.1") -> Any:
    import faust

    from rollstream.cluster.security import faust_credentials
    from rollstream.ops.faust_transport import broker_urls

    app = faust.App(
        settings.topics.group(STATS),  # the app id is its consumer group
        broker=broker_urls(settings.bootstrap_servers),
        broker_credentials=faust_credentials(settings.kafka_properties),
        store="memory://",
        datadir=str(datadir),
        processing_guarantee="exactly_once",
        topic_partitions=partitions,
        topic_replication_factor=1,
        web_enabled=True,
        web_port=web_port,
        web_bind=web_host,
        web_in_thread=False,
        consumer_auto_offset_reset="earliest",
        # Static membership: a restarted worker takes its partitions back at once, so the
        # session can be long enough that a busy machine's stalls cause no rebalance (each one
        # makes faust recover its tables from their changelogs).
        consumer_group_instance_id=(settings.service.instance_id
                                    or f"{settings.topics.group(STATS)}-{socket.gethostname()}"),
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=3.0,
        table_cleanup_interval=CLEANUP_INTERVAL_S,
    )
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    topics = settings.topics
    scored = app.topic(topics.scored, value_type=bytes, **raw)
    trajectories = app.topic(topics.trajectories, value_type=bytes, **raw)
    dlq = app.topic(topics.dlq, value_type=bytes, **raw)
    policy = app.topic(topics.policy, value_type=bytes, **raw)
    # Declared in the graph (`topics create` makes it); faust creates it alike if it is missing.
    stats_topic = app.topic(topics.stats, partitions=1, compacting=True, internal=True, **raw)
    # Sums by source partition: see the module docstring.
    # JSON changelogs, read back as they were written (a `value_type` would ask for a Model).
    table = {"schema": faust.Schema(key_serializer="json", value_serializer="json"),
             "default": dict, "partitions": partitions}
    totals = app.Table("totals", **table)
    this_10s = app.Table("this_10s", **table).tumbling(TUMBLING_S, expires=EXPIRES)
    last_1m = app.Table("last_1m", **table).hopping(HOPPING_S, HOP_S, expires=EXPIRES)
    for windowed in (this_10s.table, last_1m.table):
        windowed.on_recover(functools.partial(drop_expired, windowed))
    latest_policy = app.Table("policy", key_type=str, value_type=float, default=float,
                              partitions=1)

    def decoded(record: str, value: bytes) -> dict | None:
        try:
            return codec().decode_as(record, value)
        except DecodeError:
            return None  # the stages dead-letter what they cannot read; nothing to count here

    def counter(topic: Any, record: str, sums: Any) -> None:
        """An agent adding `sums(event)` of every `record` event on `topic` to the tables
        (once: an event read again finds its offset counted)."""
        async def count(stream: Any) -> None:
            async for event in stream.events():
                value = decoded(record, event.value)
                if value is None:
                    continue
                message = event.message
                key = f"{message.topic}|{message.partition}"
                added = (message.offset, sums(value))
                totals[key] = counted(totals[key], added)
                this_10s[key].apply(counted, added)
                last_1m[key].apply(counted, added)

        app.agent(topic, name=f"count-{record}")(count)

    counter(scored, SCORED_TRAJECTORY, scored_sums)
    counter(trajectories, TRAJECTORY, lambda t: [("trajectories", t["termination"], 1.0)])
    counter(dlq, DEAD_LETTER, lambda d: [("dead_letters", d["stage"], 1.0)])
    app.resume_offsets = functools.partial(
        resume_offsets, app, {topics.scored, topics.trajectories, topics.dlq}, totals,
        [this_10s.table, last_1m.table])

    @app.agent(policy)
    async def on_policy(stream: Any) -> None:
        async for event in stream.events():
            value = decoded(POLICY_VERSION, event.value)
            if value is not None and value["version"] >= latest_policy["version"]:
                latest_policy["version"] = float(value["version"])
                latest_policy["created_at_ms"] = float(value["created_at_ms"])

    def snapshot() -> dict[str, Any]:
        tumbling_data = dict(this_10s.table.data.items())
        hopping_data = dict(last_1m.table.data.items())
        tumbling, hopping = newest_windows(tumbling_data, hopping_data)
        report = {"total": summarize(add_up(list(totals.data.values()))),
                  "this_10s": summarize(add_up(tumbling)),
                  "last_1m": summarize(add_up(hopping))}
        return {
            "at_ms": int(time.time() * 1000),
            "policy_version": (int(latest_policy["version"])
                               if "version" in latest_policy else None),
            "episodes_per_s": report["last_1m"]["episodes"] / 60,
            # Windowed sums held in memory: bounded by expiry, not by the stream's length.
            "windows_held": len(tumbling_data) + len(hopping_data),
            **report,
        }

    @app.page("/stats")
    async def stats_view(web: Any, request: Any) -> Any:
        return web.json(snapshot())

    @app.task
    async def declare_stats_topic() -> None:
        await stats_topic.maybe_declare()

    @app.timer(interval=PUBLISH_INTERVAL_S)
    async def publish() -> None:
        await stats_topic.send(key=b"summary", value=json.dumps(snapshot()).encode())

    ready = health.component("stats", "joining group " + settings.topics.group(STATS))

    @app.on_rebalance_complete.connect
    async def rebalanced(sender: Any, **_: Any) -> None:  # tables recovered: counting again
        ready.ready()

    return app
