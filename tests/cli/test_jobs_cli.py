"""`rollstream jobs` against the real broker: create makes the job's topics, apply takes TOML
or JSON, the state changes follow their rules, and bad input ends with a clear reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from rollstream.cli import main
from rollstream.cluster.topics import delete_topics
from rollstream.config import Settings
from rollstream.service import jobs


@pytest.fixture
def cli(settings: Settings):
    base = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    made: list[str] = []

    def run(*args: str) -> int:
        if args[0] in ("create", "apply"):
            made.append(args[1])
        return main(["jobs", *args, *base])

    yield run
    for name in made:  # the jobs' own topics (the cluster's are the fixture's)
        delete_topics(settings.bootstrap_servers, f"{settings.prefix}.{Path(name).stem}")


def test_create_list_show_and_the_state_changes(settings: Settings, cli, capsys) -> None:
    assert cli("create", "alpha", "--weight", "2", "--adapter", "alpha-lora",
               "--quota-episodes", "16", "--partitions", "2", "--retries", "1",
               "--group-policy", "partial") == 0
    prefix = f"{settings.prefix}.alpha"
    names = AdminClient({"bootstrap.servers": settings.bootstrap_servers}).list_topics(
        timeout=30).topics
    assert {f"{prefix}.tasks", f"{prefix}.episodes", f"{prefix}.scored"} <= set(names)
    assert len(names[f"{prefix}.tasks"].partitions) == 2
    assert f"{prefix}.jobs" not in names  # the jobs topic is the cluster's only
    job = jobs.get(settings, "alpha")
    assert (job["weight"], job["adapter"], job["quota_episodes"], job["state"]) == (
        2.0, "alpha-lora", 16, "RUNNING")
    assert (job["retries_infra"], job["group_policy"]) == (1, "partial")

    capsys.readouterr()
    assert cli("list") == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[:3] == ["NAME", "STATE", "PREFIX"]
    assert listed[1].split()[:6] == ["alpha", "RUNNING", prefix, "2", "0", "alpha-lora"]
    assert cli("show", "alpha") == 0
    assert json.loads(capsys.readouterr().out)["prefix"] == prefix

    assert cli("pause", "alpha") == 0
    assert jobs.get(settings, "alpha")["state"] == "PAUSED"
    with pytest.raises(SystemExit, match="is PAUSED; `pause` takes a job that is RUNNING"):
        cli("pause", "alpha")
    assert cli("resume", "alpha") == 0
    with pytest.raises(SystemExit, match="is RUNNING; cancel it first"):
        cli("delete", "alpha")
    assert cli("cancel", "alpha") == 0
    with pytest.raises(SystemExit, match="is CANCELLED; `resume` takes a job that is PAUSED"):
        cli("resume", "alpha")
    with pytest.raises(SystemExit, match="job 'alpha' exists; change it with"):
        cli("create", "alpha")
    assert cli("delete", "alpha") == 0
    assert "alpha" not in jobs.current(settings)
    with pytest.raises(SystemExit, match=r"no job 'alpha' on .*\.jobs; jobs: none"):
        cli("show", "alpha")


def test_apply_creates_then_updates_from_toml_and_json(settings: Settings, cli,
                                                       tmp_path: Path) -> None:
    toml = tmp_path / "beta.toml"
    toml.write_text('name = "beta"\nweight = 3\npolicy_urls = ["http://10.0.0.9:8000"]\n')
    assert cli("apply", str(toml), "--partitions", "2") == 0
    created = jobs.get(settings, "beta")
    assert (created["weight"], created["policy_urls"]) == (3.0, ["http://10.0.0.9:8000"])
    assert cli("pause", "beta") == 0
    update = tmp_path / "beta.json"
    update.write_text(json.dumps({"name": "beta", "weight": 1, "priority": 5}))
    assert cli("apply", str(update)) == 0
    updated = jobs.get(settings, "beta")
    # The file's fields; the job's creation time and state stay.
    assert (updated["weight"], updated["priority"], updated["policy_urls"]) == (1.0, 5, [])
    assert (updated["created_at_ms"], updated["state"]) == (created["created_at_ms"], "PAUSED")

    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps({"name": "beta", "prefix": "elsewhere"}))
    with pytest.raises(SystemExit, match="a job's prefix cannot change"):
        cli("apply", str(moved))


@pytest.mark.parametrize(("content", "suffix", "message"), [
    ("name = ", ".toml", "not valid TOML"),
    ("[1, 2]", ".json", "holds one job's fields, `name` among them"),
    ('{"name": "x", "weight": -1}', ".json", "weight -1: must be a number above 0"),
    ('{"name": "x", "state": "ASLEEP"}', ".json", "state 'ASLEEP': one of"),
])
def test_a_bad_job_file_says_what_is_wrong(settings: Settings, cli, tmp_path: Path,
                                           content: str, suffix: str, message: str) -> None:
    path = tmp_path / f"x{suffix}"
    path.write_text(content)
    with pytest.raises(SystemExit, match=message):
        cli("apply", str(path))
    with pytest.raises(SystemExit, match="job file not found"):
        cli("apply", str(tmp_path / "missing.json"))


def test_status_of_a_job_shows_its_own_pipeline(settings: Settings, cli, capsys) -> None:
    assert cli("create", "gamma", "--partitions", "2", "--principal", "User:gamma") == 0
    assert (f"rollstream acl grant User:gamma --role trainer --prefix {settings.prefix}.gamma"
            in capsys.readouterr().out)
    base = ["--bootstrap-servers", settings.bootstrap_servers, "--prefix", settings.prefix]
    capsys.readouterr()
    assert main(["status", "--job", "gamma", "--json", "--interval", "0.1", *base]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    assert snapshot["prefix"] == f"{settings.prefix}.gamma"
    with pytest.raises(SystemExit, match=r"no job 'delta' .*jobs: \['gamma'\]"):
        main(["status", "--job", "delta", "--json", *base])


@pytest.mark.parametrize(("command", "flag", "says"), [
    (["jobs", "create"], "--quota-tasks-queued", "tasks INIT has expanded whose episodes RUN"),
    (["stage", "run"], "--drain-timeout", "(default 30)"),
    (["fleet", "run"], "--drain-timeout", "(default 30)"),
])
def test_help_describes_the_flag(capsys: pytest.CaptureFixture[str], command: list[str],
                                 flag: str, says: str) -> None:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert says in text[text.index(flag):]
