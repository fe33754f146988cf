"""`rollstream status`: one screen for a running pipeline of one prefix.

Per stage group: its members and their partitions, its lag (events on its input topic past the
group's committed offsets) and its rate (committed events per second between two looks). Lag is
counted exactly, by reading the committed records past each committed offset (transaction
markers take offsets too, so `end - committed` would never reach 0), unless more than
EXACT_LAG_LIMIT are waiting; then it is `end - committed`, marked approximate. Also: the
dead-letter count and latest reasons, the newest policy version (the trainer's position is the
`train` group's lag), inference servers' health and load, and in-flight events where the
stages' /metrics URLs are given, with the episodes played again after infra failures and the
groups the trainer dropped (`retry_numbers`). For one job of a shared fleet (`--job`), the
in-flight events and the job's accounting (`job_numbers`) count only the series labelled with
the job.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from rollstream import policy_versions
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.graph import BRIDGE, STAGES, input_of
from rollstream.telemetry.metrics import JOB_LABEL

# Read to count up to this many: a publish stopped by Ctrl-C leaves its aborted records in the
# log, and 48,756 of them showed as INIT's lag when the limit was 20,000 (reading 100,000 small
# records takes a second or two).
EXACT_LAG_LIMIT = 100_000
# (stage, consumer group suffix, input topic attribute of Topics), from the topic graph
STAGE_GROUPS = tuple(("train" if g == BRIDGE else g, g, input_of(g).attr)
                     for g in (*STAGES, BRIDGE))


def _get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


class Inspector:
    """Reads the pipeline's state; keeps its Kafka clients between refreshes."""

    def __init__(self, settings: Settings, metrics_urls: list[str] | None = None,
                 job: str | None = None) -> None:
        """`job`: the job of a shared fleet shown (`settings` under its prefix)."""
        self.settings = settings
        self.job = job
        self.admin = AdminClient(settings.kafka())
        self.probe = kafka.reader(settings, [])
        self.metrics_urls = metrics_urls or []
        self._previous: tuple[float, dict[str, int]] | None = None
        self._probes: dict[str, Consumer] = {}

    def close(self) -> None:
        self.probe.close()
        for probe in self._probes.values():
            probe.close()

    def _group_probe(self, group: str) -> Consumer:
        """A consumer with the group's id that never joins it, for its committed offsets: the
        admin client's OffsetFetch (librdkafka 2.16) crashes the process or times out while a
        fresh broker's group coordinator is loading; the consumer's own path retries."""
        if group not in self._probes:
            self._probes[group] = Consumer({**self.settings.kafka(), "group.id": group,
                                            "enable.auto.commit": False})
        return self._probes[group]

    def committed(self, group: str, topic: str, parts: list[int],
                  timeout_s: float = 30.0) -> list[TopicPartition]:
        """The group's committed offsets; retried while the coordinator is not ready yet (a
        fresh broker answers NOT_COORDINATOR or loading for a few seconds)."""
        return kafka.retrying(lambda: self._group_probe(group).committed(
            [TopicPartition(topic, p) for p in parts], timeout=timeout_s), timeout_s)

    def partitions(self, topic: str) -> list[int]:
        meta = self.probe.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        return sorted(meta.partitions)

    def pending(self, topic: str, starts: dict[int, int]) -> tuple[int, bool]:
        """Committed records at or past `starts` (partition -> offset): (count, exact)."""
        ends = {p: kafka.watermarks(self.probe, TopicPartition(topic, p)) for p in starts}
        begin = {p: max(starts[p], ends[p][0]) for p in starts}
        upper = {p: max(0, ends[p][1] - begin[p]) for p in starts}
        if sum(upper.values()) > EXACT_LAG_LIMIT:
            return sum(upper.values()), False
        parts = [TopicPartition(topic, p, begin[p]) for p, n in upper.items() if n > 0]
        return sum(1 for _ in kafka.read_partitions(self.settings, parts)), True

    def stage(self, stage: str, group_suffix: str, topic_attr: str) -> dict[str, Any]:
        group = self.settings.topics.group(group_suffix)
        topic = getattr(self.settings.topics, topic_attr)
        parts = self.partitions(topic)
        starts = {tp.partition: tp.offset for tp in self.committed(group, topic, parts)}
        lag, exact = self.pending(topic, starts)
        description = self.admin.describe_consumer_groups([group])[group].result(timeout=30)
        members = [{"client_id": m.client_id, "host": m.host,
                    "partitions": sorted(tp.partition for tp in m.assignment.topic_partitions
                                         if tp.topic == topic)}
                   for m in description.members]
        return {"stage": stage, "group": group, "topic": topic, "members": members,
                "lag": lag, "lag_exact": exact,
                "committed": sum(max(o, 0) for o in starts.values())}

    def dead_letters(self, latest: int = 5) -> dict[str, Any]:
        from rollstream.ops import dlq

        letters = list(dlq.dead_letters(self.settings))
        newest = sorted(letters, key=lambda d: d.event["failed_at_ms"])[-latest:]
        return {"count": len(letters),
                "latest": [{"at": d.coordinates, "stage": d.event["stage"],
                            "reason": d.event["reason"]} for d in reversed(newest)]}

    def policy(self) -> dict[str, Any] | None:
        topic = self.settings.topics.policy
        if not self.partitions(topic):
            return None
        low, high = kafka.watermarks(self.probe, TopicPartition(topic, 0))
        # Each version is one record and one transaction marker: the newest is in the last few.
        tail = [TopicPartition(topic, 0, max(low, high - 10))]
        newest = policy_versions.latest(self.settings, tail)
        if newest is None:
            return None
        return {"version": newest["version"], "uri": newest["uri"],
                "created_at_ms": newest["created_at_ms"],
                "mean_reward": newest["metrics"].get("mean_reward")}

    def servers(self) -> list[dict[str, Any]]:
        from rollstream.inference.client import parse_load

        rows = []
        urls = self.server_urls()
        # Nothing named a server and no RUN page said which it uses: only the default is known.
        default = Settings().inference.policy_url
        assumed = urls == [default] and self.settings.inference.policy_url == urls[0]
        for url in urls:
            health, _ = _get(f"{url}/health")
            code, text = _get(f"{url}/metrics") if health == 200 else (0, "")
            rows.append({"url": url, "healthy": health == 200,
                         "load": parse_load(text) if code == 200 else {}, "assumed": assumed})
        return rows

    def server_urls(self) -> list[str]:
        """The servers RUN's routers report on the /metrics pages given (the ones RUN uses),
        then those the settings name; the built-in default URL only when nothing names one."""
        routed = [s.labels["server"] for family in self._families()
                  if family.name == "rollstream_router_server_healthy" for s in family.samples]
        named = self.settings.inference.policy_urls()
        if routed and not self.settings.inference.policy_url_file and (
                self.settings.inference.policy_url == Settings().inference.policy_url):
            named = []  # the default, which nobody named
        return list(dict.fromkeys([*routed, *named]))

    def _families(self) -> list[Any]:
        """The metric families of every /metrics page given that answers."""
        from prometheus_client.parser import text_string_to_metric_families

        families: list[Any] = []
        for url in self.metrics_urls:
            code, text = _get(url)
            if code == 200:
                families += text_string_to_metric_families(text)
        return families

    def _ours(self, sample: Any) -> bool:
        """Whether a sample counts for what is shown: the job's own, where one is shown."""
        return self.job is None or sample.labels.get(JOB_LABEL) == self.job

    def in_flight(self, families: list[Any]) -> dict[str, float]:
        """Events in flight per stage, summed over the /metrics pages' `families`."""
        totals: dict[str, float] = {}
        for family in families:
            if family.name == "rollstream_in_flight_events":
                for s in filter(self._ours, family.samples):
                    totals[s.labels["stage"]] = totals.get(s.labels["stage"], 0) + s.value
        return totals

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        stages = [self.stage(*spec) for spec in STAGE_GROUPS]
        positions = {s["stage"]: s["committed"] for s in stages}
        if self._previous is not None:
            then, before = self._previous
            for s in stages:
                # Offsets include transaction markers: a rate a little above the event rate.
                s["rate"] = round((s["committed"] - before[s["stage"]]) / (now - then), 2)
        self._previous = now, positions
        families = self._families()
        in_flight = self.in_flight(families)
        for s in stages:
            if s["stage"] in in_flight:
                s["in_flight"] = int(in_flight[s["stage"]])
        snap = {"prefix": self.settings.prefix, "at_ms": int(time.time() * 1000),
                "stages": stages, "dlq": self.dead_letters(), "policy": self.policy(),
                "servers": self.servers()}
        if self.job is not None:
            snap["job"] = {"name": self.job, **(job_numbers(families, self.job) if families
                                                else {})}
        elif families:
            snap["retries"] = retry_numbers(families)
        return snap


def retry_numbers(families: list[Any], job: str | None = None) -> dict[str, Any]:
    """Infra retries and their outcome, summed over the /metrics pages' `families` (job `job`'s
    series only, where given): episodes RUN played again, infra failures it passed on with
    every retry spent, and groups the trainer bridge dropped, by reason."""
    retries = spent = 0.0
    dropped: dict[str, int] = {}
    for family in families:
        for s in family.samples:
            if job is not None and s.labels.get(JOB_LABEL) != job:
                continue
            if s.name == "rollstream_episode_retries_total":
                retries += s.value
            elif s.name == "rollstream_episode_retries_spent_total":
                spent += s.value
            elif s.name == "rollstream_groups_dropped_total":
                reason = s.labels["reason"]
                dropped[reason] = dropped.get(reason, 0) + int(s.value)
    return {"retries": int(retries), "retries_spent": int(spent),
            "groups_dropped": dict(sorted(dropped.items()))}


def job_numbers(families: list[Any], job: str) -> dict[str, Any]:
    """Job `job`'s accounting, summed over the /metrics pages' `families` (each process's
    counts since it started serving the job): episodes scored (by failure class), turns,
    sampled tokens, dead letters, server-seconds and their share of every job's on these
    pages, sandbox-seconds, and the mean staleness of its scored episodes."""
    sums: dict[str, float] = {}
    classes: dict[str, float] = {}
    lacking: set[tuple[str, str, int]] = set()  # (server, adapter, 1: lacks the newest)
    all_server_s = 0.0
    for family in families:
        for s in family.samples:
            if s.name == "rollstream_server_seconds_total":
                all_server_s += s.value
            if s.labels.get(JOB_LABEL) != job:
                continue
            sums[s.name] = sums.get(s.name, 0.0) + s.value
            if s.name == "rollstream_episodes_total":
                fc = s.labels["failure_class"]
                classes[fc] = classes.get(fc, 0) + s.value
            if s.name == "rollstream_router_adapter_lacking":
                lacking.add((s.labels["server"], s.labels["adapter"], int(s.value)))
    server_s = sums.get("rollstream_server_seconds_total", 0.0)
    stale_n = sums.get("rollstream_episode_staleness_versions_count", 0.0)
    return {
        "episodes": int(sums.get("rollstream_episodes_total", 0)),
        "failure_classes": {fc: int(n) for fc, n in sorted(classes.items())},
        "turns": int(sums.get("rollstream_turns_total", 0)),
        "sampled_tokens": int(sums.get("rollstream_sampled_tokens_total", 0)),
        "dead_letters": int(sums.get("rollstream_events_dead_lettered_total", 0)),
        "server_seconds": round(server_s, 3),
        "server_share": round(server_s / all_server_s, 4) if all_server_s else None,
        "sandbox_seconds": round(sums.get("rollstream_sandbox_seconds_total", 0.0), 3),
        "staleness_mean": (round(sums["rollstream_episode_staleness_versions_sum"]
                                 / stale_n, 3) if stale_n else None),
        "adapter_lacking": [{"server": url, "adapter": adapter, "newest": bool(newest)}
                            for url, adapter, newest in sorted(lacking)],
        **retry_numbers(families, job),
    }


def render(snap: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    stages = Table(title=f"pipeline {snap['prefix']}", title_justify="left")
    for col in ("stage", "members", "lag", "events/s", "in flight", "partitions"):
        stages.add_column(col, justify="left" if col in ("stage", "partitions") else "right")
    for s in snap["stages"]:
        lag = f"{s['lag']}" + ("" if s["lag_exact"] else "~")
        parts = "; ".join(f"{m['client_id']}: {m['partitions']}" for m in s["members"])
        stages.add_row(s["stage"], str(len(s["members"])), lag, str(s.get("rate", "")),
                       str(s.get("in_flight", "")), parts)
    policy = snap["policy"]
    lines = [stages,
             f"policy version: {policy['version'] if policy else 'none'}"
             + (f" (mean reward {policy['mean_reward']:.3f})"
                if policy and policy["mean_reward"] is not None else ""),
             f"dead letters: {snap['dlq']['count']}"]
    lines += [f"  {d['at']} {d['stage']}: {d['reason']}" for d in snap["dlq"]["latest"]]
    if "job" in snap:
        lines.append(_job_line(snap["job"]))
        if "episodes" in snap["job"]:
            lines.append(_retries_line(snap["job"]))
    elif "retries" in snap:
        lines.append(_retries_line(snap["retries"]))
    for srv in snap["servers"]:
        load = ", ".join(f"{k} {v:g}" for k, v in sorted(srv["load"].items()))
        lines.append(f"server {srv['url']}: {'up' if srv['healthy'] else 'DOWN'}"
                     + (f" ({load})" if load else "")
                     + (" (the default URL: RUN's servers are those its --metrics-url page "
                        "reports, or name them with --policy-url)"
                        if srv.get("assumed") and not srv["healthy"] else ""))
    return Group(*lines)


def _retries_line(numbers: dict[str, Any]) -> str:
    dropped = ", ".join(f"{reason} {n}" for reason, n in numbers["groups_dropped"].items())
    return (f"infra retries: {numbers['retries']} episodes played again, "
            f"{numbers['retries_spent']} failed with every retry spent; groups dropped: "
            + (dropped or "none"))


def _job_line(job: dict[str, Any]) -> str:
    if "episodes" not in job:
        return f"job {job['name']}: give the fleet's --metrics-url for its episodes and usage"
    classes = ", ".join(f"{fc} {n}" for fc, n in job["failure_classes"].items() if n)
    share = job["server_share"]
    stale = job["staleness_mean"]
    return (f"job {job['name']} (from /metrics): {job['episodes']} episodes scored"
            + (f" ({classes})" if classes else "")
            + f", {job['turns']} turns, {job['sampled_tokens']} tokens sampled, "
            f"{job['dead_letters']} dead-lettered, server time {job['server_seconds']:g} s"
            + (f" ({share:.0%} of all jobs')" if share is not None else "")
            + f", sandbox time {job['sandbox_seconds']:g} s"
            + (f", staleness {stale:g} versions on average" if stale is not None else "")
            + "".join(_lacking_note(entry) for entry in job["adapter_lacking"]))


def _lacking_note(entry: dict[str, Any]) -> str:
    if entry["newest"]:
        return (f"; server {entry['server']} lacks {entry['adapter']} (the job's newest "
                "adapter) and serves it nothing")
    return (f"; server {entry['server']} lists no {entry['adapter']} yet: the job samples "
            "the base model")
