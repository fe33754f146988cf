"""`rollstream jobs usage` on the real broker: two jobs' episodes, turns, sampled tokens,
failure classes, dead letters and time on the servers and in the environment per hour, counted
from committed records only."""

from __future__ import annotations

import json

import pytest

from rollstream.cli import main
from rollstream.cluster.kafka import process_id, producer
from rollstream.cluster.topics import delete_topics
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.service import jobs
from rollstream.service.usage import HOUR_MS, parse_since
from tests.helpers.scored_factory import scored, turn

HOUR = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS  # an hour's start


def write(settings: Settings, topic: str, records: list[tuple[str, bytes]],
          commit: bool = True) -> None:
    """One transaction; aborted (as by a writer killed before its commit) unless `commit`."""
    p = producer(settings, process_id(settings, "usage-writer"))
    p.init_transactions(30)
    p.begin_transaction()
    for key, value in records:
        p.produce(topic, value, key=key)
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


def episode(task: str, index: int, at_ms: int, failure: str = "ok",
            completions: tuple[int, ...] = (3,), attempt: int = 0) -> tuple[str, bytes]:
    """A scored episode (its `attempt`) with one turn per entry of `completions`, that many
    tokens sampled in 100 ms each on the server, and 10 ms each in the environment."""
    turns = [turn(i, [1, 2], list(range(n)), 0) | {"inference_ms": 100.0 * n, "env_ms": 10.0 * n}
             for i, n in enumerate(completions)]
    record = scored(task, index, None if failure == "infra" else 1.0, failure_class=failure,
                    turns=turns, attempt=attempt) | {"scored_at_ms": at_ms}
    return f"{task}#{index}", codec().encode("ScoredTrajectory", record)


def dead_letter(at_ms: int) -> tuple[str, bytes]:
    return "k", codec().encode("DeadLetter", {
        "stage": "init", "reason": "undecodable: test", "source_topic": "x",
        "source_partition": 0, "source_offset": 0, "key": None, "value": b"junk",
        "failed_at_ms": at_ms, "truncated_from": None})


def usage(settings: Settings, capsys: pytest.CaptureFixture[str], *flags: str) -> list[dict]:
    capsys.readouterr()
    assert main(["jobs", "usage", "--json", "--bootstrap-servers", settings.bootstrap_servers,
                 "--prefix", settings.prefix, *flags]) == 0
    # One JSON object per job and hour, a line each (docs/jobs.md#usage).
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_usage_counts_each_jobs_committed_records_per_hour(
        settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    try:
        for name in ("alpha", "beta"):
            assert main(["jobs", "create", name, "--partitions", "2", *base]) == 0
        a = jobs.job_settings(settings, jobs.get(settings, "alpha"))
        b = jobs.job_settings(settings, jobs.get(settings, "beta"))
        write(a, a.topics.scored, [episode("a", 0, HOUR + 1, completions=(3, 4), attempt=1),
                                   episode("a", 1, HOUR + 2, "infra", (2,), attempt=2),
                                   episode("a", 2, HOUR + HOUR_MS + 5, "truncated")])
        # A crashed writer's episodes: never committed, never counted.
        write(a, a.topics.scored, [episode("a", 9, HOUR + 3)], commit=False)
        write(a, a.topics.dlq, [dead_letter(HOUR + 7), dead_letter(HOUR + HOUR_MS)])
        write(b, b.topics.scored, [episode("b", i, HOUR + 10, "agent", (5, 5, 5))
                                   for i in range(4)])

        rows = usage(settings, capsys)
        assert [(r["job"], r["hour"]) for r in rows] == [
            ("alpha", "2023-11-14T22:00Z"), ("alpha", "2023-11-14T23:00Z"),
            ("beta", "2023-11-14T22:00Z")]
        first, second, beta = rows
        assert (first["episodes"], first["turns"], first["sampled_tokens"],
                first["dead_letters"]) == (2, 3, 9, 1)
        assert first["failure_classes"] == {"ok": 1, "agent": 0, "env": 0, "infra": 1,
                                            "truncated": 0}
        # Played again 1 + 2 times; one group ("a") lost a sample with its retries spent.
        assert (first["retries"], first["infra_groups"]) == (3, 1)
        assert (second["retries"], second["infra_groups"], beta["retries"]) == (0, 0, 0)
        assert (second["episodes"], second["turns"], second["sampled_tokens"],
                second["dead_letters"], second["failure_classes"]["truncated"]) == (1, 1, 3, 1, 1)
        assert (beta["episodes"], beta["turns"], beta["sampled_tokens"], beta["dead_letters"],
                beta["failure_classes"]["agent"]) == (4, 12, 60, 0, 4)
        # Time on the servers and in the environment: the uncommitted episode's not counted.
        assert [(r["server_s"], r["env_s"]) for r in rows] == [(0.9, 0.09), (0.3, 0.03),
                                                               (6.0, 0.6)]

        # One job, from an hour on.
        since = "2023-11-14T23:00"
        assert usage(settings, capsys, "--job", "alpha", "--since", since) == [second]
        capsys.readouterr()
        assert main(["jobs", "usage", "--job", "beta", *base]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[:5] == ["JOB", "HOUR", "EPISODES", "TURNS", "SAMPLED_TOKENS"]
        assert table[1].split()[:5] == ["beta", "2023-11-14T22:00Z", "4", "12", "60"]
        assert table[0].split()[-2:] == ["SERVER_S", "ENV_S"]
        assert table[1].split()[-2:] == ["6.0", "0.6"]
        with pytest.raises(SystemExit, match="time ago"):
            main(["jobs", "usage", "--since", "yesterday", *base])
    finally:
        for name in ("alpha", "beta"):
            delete_topics(settings.bootstrap_servers, f"{settings.prefix}.{name}")


def test_since_takes_a_time_ago_or_an_iso_time() -> None:
    assert parse_since("90m", now_ms=10 * HOUR_MS) == 10 * HOUR_MS - 90 * 60_000
    assert parse_since("2d", now_ms=100 * HOUR_MS) == 52 * HOUR_MS
    assert parse_since("1970-01-01T01:00") == HOUR_MS
    assert parse_since("1970-01-01T03:00+02:00") == HOUR_MS
    with pytest.raises(ValueError, match="ISO date"):
        parse_since("6 hours")
