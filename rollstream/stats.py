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

Exact after a crash: faust (0.15) sends a table's changelog records with its plain producer,
outside the transaction that commits its input offsets, so a SIGKILL between the two leaves
the changelog holding updates for events past the committed offsets; the restarted worker
recovers them and then reads those events again (at least once), and running totals count
them twice (a manual run once showed 43 for 40). So the one table (`events`, changelog
`<prefix>.stats-events-changelog` on the same cluster) holds what each event adds, keyed by
the event's identity (episode id; a dead letter's source coordinates): an event read again
writes the same key, and every report is summed from the table when it is asked for. The table
grows with the episodes counted (one small record each).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rollstream import health
from rollstream.codec import DecodeError, codec, unpack_ids
from rollstream.config import Settings
from rollstream.events import DEAD_LETTER, POLICY_VERSION, SCORED_TRAJECTORY, TRAJECTORY
from rollstream.graph import STATS

# Latency buckets (ms) for the percentile estimates: a percentile is reported as the upper
# bound of the bucket it falls in.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000,
                      60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000)
PERCENTILES = (50, 90, 99)
PUBLISH_INTERVAL_S = 5.0


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


def _add_up(entries: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    sums: dict[tuple[str, str], float] = {}
    for entry in entries:
        for metric, label, amount in entry["sums"]:
            sums[metric, label] = sums.get((metric, label), 0.0) + amount
    return sums


def windows(entries: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """All entries, those in the 10 s tumbling window and those in the oldest 1 min hopping
    window (10 s hops) that hold the newest entry's time (the stream's time, as faust's
    `relative_to_stream` windows)."""
    if not entries:
        return {"total": [], "this_10s": [], "last_1m": []}
    now = max(e["at_s"] for e in entries)
    tumbling = now - now % 10
    hopping = tumbling - 50
    return {"total": entries,
            "this_10s": [e for e in entries if tumbling <= e["at_s"] < tumbling + 10],
            "last_1m": [e for e in entries if hopping <= e["at_s"] < hopping + 60]}


def build_app(settings: Settings, web_port: int, datadir: Path, partitions: int,
              web_host: str = "127.0.0.1") -> Any:
    import faust

    from rollstream.security import faust_credentials

    app = faust.App(
        settings.topics.group(STATS),  # the app id is its consumer group
        broker=[f"kafka://{b}" for b in settings.bootstrap_servers.split(",")],
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
        # A crashed worker's partitions move after 10 s, not faust's default 60 s.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
    )
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    topics = settings.topics
    scored = app.topic(topics.scored, value_type=bytes, **raw)
    trajectories = app.topic(topics.trajectories, value_type=bytes, **raw)
    dlq = app.topic(topics.dlq, value_type=bytes, **raw)
    policy = app.topic(topics.policy, value_type=bytes, **raw)
    # Declared in the graph (`topics create` makes it); faust creates it alike if it is missing.
    stats_topic = app.topic(topics.stats, partitions=1, compacting=True, internal=True, **raw)
    # What each event adds, by the event's identity: see the module docstring.
    events = app.Table("events", key_type=str, value_type=dict,  # JSON in the changelog
                       partitions=partitions)
    latest_policy = app.Table("policy", key_type=str, value_type=float, default=float,
                              partitions=1)

    def decoded(record: str, value: bytes) -> dict | None:
        try:
            return codec().decode_as(record, value)
        except DecodeError:
            return None  # the stages dead-letter what they cannot read; nothing to count here

    def counter(topic: Any, record: str, identity: Any, sums: Any) -> None:
        """An agent recording `sums(event)` under `identity(event)` for every `record` event
        on `topic` (once: an event read again finds its key)."""
        async def count(stream: Any) -> None:
            async for event in stream.events():
                value = decoded(record, event.value)
                if value is None:
                    continue
                key = f"{record}|{identity(value)}"
                if key not in events:
                    events[key] = {"at_s": event.message.timestamp, "sums": sums(value)}

        app.agent(topic, name=f"count-{record}")(count)

    counter(scored, SCORED_TRAJECTORY, lambda e: e["trajectory"]["episode_id"], scored_sums)
    counter(trajectories, TRAJECTORY, lambda t: t["episode_id"],
            lambda t: [("trajectories", t["termination"], 1.0)])
    counter(dlq, DEAD_LETTER,
            lambda d: f"{d['stage']}|{d['source_topic']}|{d['source_partition']}|"
                      f"{d['source_offset']}",
            lambda d: [("dead_letters", d["stage"], 1.0)])

    @app.agent(policy)
    async def on_policy(stream: Any) -> None:
        async for event in stream.events():
            value = decoded(POLICY_VERSION, event.value)
            if value is not None and value["version"] >= latest_policy["version"]:
                latest_policy["version"] = float(value["version"])
                latest_policy["created_at_ms"] = float(value["created_at_ms"])

    def snapshot() -> dict[str, Any]:
        report = {name: summarize(_add_up(entries))
                  for name, entries in windows(list(events.values())).items()}
        return {
            "at_ms": int(time.time() * 1000),
            "policy_version": (int(latest_policy["version"])
                               if "version" in latest_policy else None),
            "episodes_per_s": report["last_1m"]["episodes"] / 60,
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
