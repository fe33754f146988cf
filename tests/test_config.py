import argparse
from pathlib import Path

import pytest

from rollstream import config


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_precedence_defaults_file_env_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "rs.toml"
    file.write_text('prefix = "from-file"\nmax_in_flight = 7\ncommit_interval_ms = 50\n')
    monkeypatch.setenv("ROLLSTREAM_MAX_IN_FLIGHT", "9")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env-host:9092")
    settings = config.load(parse(["--config", str(file), "--commit-interval-ms", "25"]))
    assert settings.prefix == "from-file"  # file beats default
    assert settings.max_in_flight == 9  # environment beats file
    assert settings.commit_interval_ms == 25  # flag beats file
    assert settings.bootstrap_servers == "env-host:9092"
    assert settings.topics.episode_state == "from-file.episode-state"
    flag = config.load(parse(["--bootstrap-servers", "flag-host:1"]))
    assert flag.bootstrap_servers == "flag-host:1"  # flag beats environment


def test_unknown_setting_in_file_is_a_clear_error(tmp_path: Path) -> None:
    file = tmp_path / "rs.toml"
    file.write_text("max_inflight = 3\n")
    with pytest.raises(SystemExit, match="unknown settings \\['max_inflight'\\]"):
        config.load(parse(["--config", str(file)]))


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="config file not found"):
        config.load(parse(["--config", str(tmp_path / "nope.toml")]))


def test_loading_settings_never_starts_a_broker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollstream.broker import local

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "home"))
    started: list[str] = []
    monkeypatch.setattr(local, "start", lambda: started.append("start") or "127.0.0.1:1")
    settings = config.load(parse([]))
    assert settings.bootstrap_servers == "" and started == []
    # Only the explicit step a command takes to reach Kafka starts the bundled broker.
    assert local.with_broker(settings).bootstrap_servers == "127.0.0.1:1" and started == ["start"]
    assert local.with_broker(config.load(parse(["--bootstrap-servers", "h:1"]))) \
        .bootstrap_servers == "h:1" and started == ["start"]
