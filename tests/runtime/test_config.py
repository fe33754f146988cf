import argparse
import ast
import dataclasses
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
    assert settings.stage.max_in_flight == 9  # environment beats file
    assert settings.stage.commit_interval_ms == 25  # flag beats file
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


def test_kafka_client_properties_from_file_and_toml_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    props = tmp_path / "client.properties"
    # Java properties syntax as Kafka's tools read it: comments, `:` separators, continuations.
    props.write_text("# Confluent Cloud\n! another comment\nbootstrap.servers=pkc-1.example:9092\n"
                     "security.protocol : SASL_SSL\nsasl.mechanism=PLAIN\n"
                     "sasl.username=KEY\nsasl.password=se\\\n    cret\n")
    toml = tmp_path / "rs.toml"
    toml.write_text('prefix = "p"\n[kafka]\n"sasl.mechanism" = "SCRAM-SHA-512"\n'
                    '"client.id" = "from-toml"\n')
    settings = config.load(parse(["--config", str(toml), "--kafka-config", str(props)]))
    conf = settings.kafka()
    assert conf["bootstrap.servers"] == "pkc-1.example:9092"  # from the file
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.password"] == "secret"
    assert conf["sasl.mechanism"] == "PLAIN"  # the file beats the [kafka] table
    assert conf["client.id"] == "from-toml"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:1")
    monkeypatch.setenv("ROLLSTREAM_KAFKA_CONFIG", str(props))
    assert config.load(parse([])).kafka()["bootstrap.servers"] == "env:1"  # the address wins
    assert config.load(parse([])).kafka()["sasl.username"] == "KEY"  # the env names the file
    shown = config.redacted(conf)
    assert shown["sasl.password"] == "[redacted]" and shown["sasl.username"] == "KEY"
    assert "secret" not in repr(settings)


@pytest.mark.parametrize("key", [
    "sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret",
    "sasl.jaas.config", "sasl.oauthbearer.config", "ssl.key.pem",
    "sasl.oauthbearer.assertion.private.key.passphrase", "bearer.auth.token"])
def test_secret_keys_are_hidden(key: str) -> None:
    assert config.redacted({key: "s3cr3t"}) == {key: "[redacted]"}


@pytest.mark.parametrize("key", [
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.id", "sasl.username",
    "ssl.key.location", "ssl.certificate.location", "ssl.ca.location", "sasl.mechanism",
    "sasl.oauthbearer.scope"])
def test_keys_that_are_no_secret_are_shown(key: str) -> None:
    assert config.redacted({key: "value"}) == {key: "value"}


def test_missing_properties_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="properties file not found"):
        config.load(parse(["--kafka-config", str(tmp_path / "none.properties")]))


def test_a_command_offers_only_its_components_flags() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, "kafka", "sandbox")
    args = parser.parse_args(["--prefix", "x", "--sandbox", "docker"])
    assert config.load(args).sandbox.backend == "docker"
    with pytest.raises(SystemExit):
        parser.parse_args(["--tokenizer-path", "x"])
    with pytest.raises(ValueError, match="unknown setting groups"):
        config.add_arguments(argparse.ArgumentParser(), "nope")


def test_sandbox_settings_come_through_the_one_loader_and_are_handed_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollstream.sandbox import Sandboxes, SandboxSettings

    monkeypatch.setenv("ROLLSTREAM_SANDBOX_ROOT", str(tmp_path / "env"))
    resolved = config.load().sandbox
    assert resolved == SandboxSettings(root=str(tmp_path / "env"))
    assert Sandboxes(resolved).backend("bwrap").root == tmp_path / "env"
    # What the process hands in counts, whatever the environment says.
    handed = Sandboxes(SandboxSettings(backend="bwrap", root=str(tmp_path / "handed")))
    assert handed.backend("bwrap").root == tmp_path / "handed"


def test_each_component_gets_its_own_settings_from_flags_files_and_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "rs.toml"
    file.write_text('sandbox = "bwrap"\nmax_group_size = 4\nadmission_window = 16\n')
    monkeypatch.setenv("ROLLSTREAM_DEDUP_WINDOW", "7")
    monkeypatch.setenv("ROLLSTREAM_SANDBOX_ROOT", str(tmp_path))
    settings = config.load(parse([
        "--config", str(file), "--max-in-flight", "3", "--instance-id", "run-1",
        "--policy-url", "http://h:1/,http://h:2", "--prefix", "p"]))
    assert (settings.prefix, settings.topics.tasks) == ("p", "p.tasks")
    assert (settings.stage.max_in_flight, settings.stage.admission_window,
            settings.stage.dedup_window) == (3, 16, 7)
    assert settings.service.instance_id == "run-1"
    assert settings.inference.policy_urls() == ["http://h:1", "http://h:2"]
    assert (settings.sandbox.backend, settings.sandbox.root) == ("bwrap", str(tmp_path))
    assert settings.bounds.max_group_size == 4
    # The untouched components keep their defaults, each a value of its own type.
    assert settings.bounds == config.Bounds(max_group_size=4)
    assert settings.inference.retries_infra == config.InferenceSettings().retries_infra


def test_override_replaces_within_components_and_names_an_unknown_setting() -> None:
    base = config.Settings(prefix="p")
    changed = base.override(max_in_flight=5, policy_url="http://x:1", prefix="q")
    assert (changed.stage.max_in_flight, changed.inference.policy_url, changed.prefix) == (
        5, "http://x:1", "q")
    assert changed.sandbox is base.sandbox and changed.bounds is base.bounds
    assert base.stage.max_in_flight == 64  # the original is left as it was
    with pytest.raises(TypeError, match="unknown settings \\['max_inflight'\\]"):
        base.override(max_inflight=3)
    with pytest.raises(ValueError, match="retries_infra -1"):
        base.override(retries_infra=-1)


def test_every_setting_has_one_key_a_flag_and_a_help_line() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    shown = parser.format_help()
    for component in config.COMPONENTS.values():
        for f in dataclasses.fields(component):
            key = f.metadata.get("key") or f.name
            assert f"--{key.replace('_', '-')}" in shown, key
            assert config.env_var(key) in shown.replace("\n", " ").replace("  ", ""), key
    # The sandbox package names its variables in errors; they are the loader's.
    from rollstream.sandbox import settings as sandbox

    named = [sandbox.BACKEND_ENV, sandbox.IMAGE_ENV, sandbox.ROOT_ENV, sandbox.UIDS_ENV]
    keys = ("sandbox", "sandbox_image", "sandbox_root", "sandbox_uids")
    assert named == [config.env_var(key) for key in keys]


# Where settings may be resolved: the commands, the dev harness that plays them, slime's rollout
# hook (slime starts it, with arguments of its own), and the fallback for an environment built
# with no sandboxes handed in (a library user's).
LOADERS = ("rollstream/cli/", "rollstream/dev/", "trainer_bridge/adapters/slime_adapter.py",
           "rollstream/envs/base.py")


def test_only_the_commands_resolve_settings() -> None:
    root = Path(__file__).resolve().parents[2]
    found = []
    for package in ("rollstream", "stages", "producers", "trainer_bridge"):
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name == "rollstream/config.py" or name.startswith(LOADERS):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr == "load" and getattr(node.func.value, "id", "") == "config":
                    found.append(f"{name}:{node.lineno}")
                if isinstance(node, ast.ImportFrom) and node.module == "rollstream.config" and \
                        any(alias.name == "load" for alias in node.names):
                    found.append(f"{name}:{node.lineno}")
    assert found == [], f"settings resolved outside a command (hand them in instead): {found}"
