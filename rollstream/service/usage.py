"""Per-job usage, per hour, from the log: what each job's episodes consumed.

Read from each job's committed records only (read_committed), so the numbers are exact after a
crash: an episode a killed stage wrote in a transaction that never committed is not counted,
and the one that replaced it is counted once. Per job and UTC hour:

- from `<job prefix>.scored` (the hour of `scored_at_ms`): episodes, agent turns, sampled
  tokens (completion ids the servers sampled), episodes per failure class, and the seconds
  its recorded turns took on the inference servers (their completions' `inference_ms`; the
  metrics' server-seconds also count requests that failed and episodes that were redone) and
  in the environment (their `env_ms`: tool calls, sandbox commands); the times its episodes
  were played again after infra failures (their `attempt`s), and its groups with an infra
  failure whose retries were spent (the groups a trainer with the `drop` group policy drops);
- from `<job prefix>.dlq` (the hour of `failed_at_ms`): dead letters.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import DecodeError, codec
from rollstream.contracts.events import Job
from rollstream.ops import dlq
from rollstream.service.jobs import job_settings

HOUR_MS = 3_600_000
FAILURE_CLASSES = ("ok", "agent", "env", "infra", "truncated")
_AGO = re.compile(r"(\d+)([mhd])")
_UNIT_MS = {"m": 60_000, "h": HOUR_MS, "d": 24 * HOUR_MS}


@dataclass
class Usage:
    """One job's usage in one hour."""
    job: str
    hour_ms: int  # the hour's start, UTC
    episodes: int = 0
    turns: int = 0
    sampled_tokens: int = 0
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_CLASSES, 0))
    dead_letters: int = 0
    undecodable: int = 0  # records on the scored topic that are not ScoredTrajectory
    retries: int = 0  # times its scored episodes were played again after infra failures
    infra_tasks: set[str] = field(default_factory=set)  # tasks with a sample scored infra
    server_ms: float = 0.0
    env_ms: float = 0.0

    @property
    def hour(self) -> str:
        return datetime.fromtimestamp(self.hour_ms / 1000, UTC).strftime("%Y-%m-%dT%H:00Z")

    def as_json(self) -> dict:
        return {"job": self.job, "hour": self.hour, "episodes": self.episodes,
                "turns": self.turns, "sampled_tokens": self.sampled_tokens,
                "failure_classes": self.failures, "dead_letters": self.dead_letters,
                "undecodable": self.undecodable, "retries": self.retries,
                "infra_groups": len(self.infra_tasks), "server_s": round(self.server_ms / 1000, 3),
                "env_s": round(self.env_ms / 1000, 3)}


def parse_since(text: str, now_ms: int | None = None) -> int:
    """`--since`: a time ago (`90m`, `6h`, `2d`) or an ISO date/time (UTC unless it says);
    epoch milliseconds, or ValueError saying what is accepted."""
    ago = _AGO.fullmatch(text.strip())
    if ago:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return now - int(ago.group(1)) * _UNIT_MS[ago.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r}: give a time ago (90m, 6h, 2d) or an ISO date/time "
                         "(2026-12-01 or 2026-12-01T08:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _hour(ms: int) -> int:
    return ms - ms % HOUR_MS


def job_usage(settings: Settings, job: Job, since_ms: int = 0) -> list[Usage]:
    """Job `job`'s usage per hour from `since_ms` on, oldest hour first."""
    own = job_settings(settings, job)
    hours: dict[int, Usage] = {}

    def at(ms: int) -> Usage:
        return hours.setdefault(_hour(ms), Usage(job["name"], _hour(ms)))

    scored = kafka.whole_topic(own, own.topics.scored)
    if scored is None:
        raise ValueError(f"job {job['name']}: topic {own.topics.scored} does not exist")
    for msg in kafka.read_partitions(own, scored):
        try:
            record = codec().decode_as("ScoredTrajectory", msg.value())
        except DecodeError:
            # No time of its own to count it by: the record's broker timestamp places it.
            if msg.timestamp()[1] >= since_ms:
                at(msg.timestamp()[1]).undecodable += 1
            continue
        if record["scored_at_ms"] < since_ms:
            continue
        usage = at(record["scored_at_ms"])
        turns = record["trajectory"]["turns"]
        usage.episodes += 1
        usage.turns += len(turns)
        usage.sampled_tokens += sum(len(t["completion_ids"]) // 4 for t in turns)  # int32 each
        usage.server_ms += sum(t["inference_ms"] for t in turns)
        usage.env_ms += sum(t["env_ms"] for t in turns)
        usage.failures[record["failure_class"]] += 1
        usage.retries += record["trajectory"]["attempt"]
        if record["failure_class"] == "infra":
            usage.infra_tasks.add(record["trajectory"]["task"]["task_id"])
    for letter in dlq.dead_letters(own):
        if letter.event["failed_at_ms"] >= since_ms:
            at(letter.event["failed_at_ms"]).dead_letters += 1
    return [hours[h] for h in sorted(hours)]


def usage(settings: Settings, jobs: Iterable[Job], since_ms: int = 0) -> list[Usage]:
    """Every given job's usage per hour, by job then hour."""
    return [row for job in sorted(jobs, key=lambda j: j["name"])
            for row in job_usage(settings, job, since_ms)]


def table(rows: list[Usage]) -> str:
    """The rows as an aligned text table."""
    head = ("JOB", "HOUR", "EPISODES", "TURNS", "SAMPLED_TOKENS", *(c.upper() for c in
            FAILURE_CLASSES), "RETRIES", "INFRA_GROUPS", "DEAD_LETTERS", "SERVER_S", "ENV_S")
    lines = [head]
    for row in rows:
        lines.append((row.job, row.hour, str(row.episodes), str(row.turns),
                      str(row.sampled_tokens), *(str(row.failures.get(c, 0))
                                                 for c in FAILURE_CLASSES),
                      str(row.retries), str(len(row.infra_tasks)), str(row.dead_letters),
                      f"{row.server_ms / 1000:.1f}",
                      f"{row.env_ms / 1000:.1f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)
