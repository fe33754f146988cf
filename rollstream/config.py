"""Settings for every Rollstream process, one object per component: defaults < config file
(TOML) < environment < flags.

`Settings` is the Kafka connection every process has (`KafkaSettings`: broker, client
properties, topic prefix) with the components beside it, each handed to what it configures:
`stage` (StageSettings) to the stage runtime, INIT's admission and the dedup windows; `service`
to a long-running process's identity and metrics; `inference` to RUN's router, its chat
template and the controller; `sandbox` (rollstream.sandbox.SandboxSettings) to the sandboxes a
process opens; `bounds` to the checks at the door (rollstream.bounds). Each is resolved where
a command starts (`load`) and passed down, never through a module global. Flags, files and
the environment name a setting by one flat key (`--max-in-flight`, `max_in_flight = 8`,
ROLLSTREAM_MAX_IN_FLIGHT), as does `Settings.override`; the key says which component holds it.

Environment variables are ROLLSTREAM_<FIELD> (e.g. ROLLSTREAM_PREFIX), plus the conventional
KAFKA_BOOTSTRAP_SERVERS for the broker address.

Kafka client properties (SASL, TLS, any librdkafka key) come from a Java-style properties file,
the `client.properties` managed services hand out (`--kafka-config FILE`, env
ROLLSTREAM_KAFKA_CONFIG), over a `[kafka]` table of the TOML file; they reach every client a
process builds (`Settings.kafka()`). `bootstrap.servers` may come from them.

Flags come in groups (`GROUPS`, the sections of `--help`); a command offers the flags of the
groups it uses only, so a flag another command would take is an error there, not silently ignored.
"""

from __future__ import annotations

import argparse
import logging
import os
import tomllib
from dataclasses import Field, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from rollstream.contracts.graph import Topics
from rollstream.contracts.wire import check_adapter
from rollstream.sandbox.settings import SandboxSettings


class _ClientLog(logging.Logger):
    """librdkafka's own lines (a refused connection, a failed SASL handshake, a TLS alert) in
    the project's log, as `rollstream.kafka.client`. The project acts on each such failure
    itself (a long-running process retries and logs a warning, a refusal stops it with exit 77,
    a one-shot command ends with one line naming the cause), so the client's lines are detail:
    INFO for its warnings and errors, DEBUG for the rest; a one-shot command prints none."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        super().log(logging.INFO if level >= logging.WARNING else logging.DEBUG, msg, *args,
                    **kwargs)


CLIENT_LOG = _ClientLog("rollstream.kafka.client")
CLIENT_LOG.parent = logging.getLogger("rollstream")  # handlers and level as the project's


# Components, in the order `--help` shows them: name -> title.
GROUPS: dict[str, str] = {
    "kafka": "Kafka",
    "command": "one-shot command",
    "topics": "topics",
    "stage": "stage process",
    "admission": "INIT admission",
    "dedup": "duplicate ids (INIT, EVAL)",
    "service": "long-running service",
    "inference": "RUN / inference",
    "sandbox": "sandbox",
    "bounds": "bounds at the door",
}


def _setting(default: Any, group: str, help: str, flag: str = "") -> Any:
    return field(default=default, metadata={"group": group, "help": help, "flag": flag})


@dataclass(frozen=True)
class StageSettings:
    """How a stage process takes, dedups, admits and commits its events."""

    max_in_flight: int = _setting(
        64, "stage", "events a stage process works on at once (backpressure)")
    fetch_buffer: int = _setting(
        64, "stage", "events an async stage (RUN, EVAL) keeps fetched beyond those in flight, "
        "to start the moment a slot frees (0: none; a paused partition then waits up to a "
        "second for its next event)")
    commit_interval_ms: int = _setting(200, "stage", "how often a stage commits its transaction")
    admission_window: int = _setting(
        0, "admission", "INIT admits at most this many tasks beyond what the trainer has consumed "
        "(bounds staleness); 0: no limit")
    dedup_window: int = _setting(
        100_000, "dedup", "ids INIT and EVAL remember per input partition to drop duplicates "
        "(rollstream.dedup)")


@dataclass(frozen=True)
class ServiceSettings:
    """A long-running process's identity and its metrics endpoint."""

    instance_id: str = _setting(
        "", "service", "stable id for static group membership and the transactional id")
    metrics_port: int = _setting(
        0, "service", "port of a long-running process's /metrics, /health and /ready (0: a "
        "free port, logged at start; -1: off)")


@dataclass(frozen=True)
class InferenceSettings:
    """Where RUN and the controller find inference servers, and how they talk to them."""

    policy_url: str = _setting(
        "http://127.0.0.1:8011", "inference",
        "inference endpoint(s), comma separated (vLLM-compatible)")
    policy_url_file: str = _setting(
        "", "inference", "file listing more inference endpoints, one per line; re-read while "
        "running, so servers can be added and removed")
    adapter: str = _setting(
        "", "inference", "the job's LoRA adapter base name on shared inference servers: RUN "
        "samples its newest `<adapter>-v<N>` and the controller loads its policy versions under "
        "that name, never touching another job's (empty: `rollstream-policy-v<N>`, or the base "
        "model where no such adapter is loaded)")
    request_timeout_s: float = _setting(60.0, "inference", "per inference request timeout")
    retries_infra: int = _setting(
        2, "inference", "times RUN plays an episode again, in a fresh environment, after an "
        "infrastructure failure (a sandbox that died, inference retries spent); environment "
        "errors are never retried")
    server_max_in_flight: int = _setting(
        64, "inference", "requests one RUN process sends one inference server at once; when "
        "every server is at it, RUN stops taking episodes")
    health_interval_s: float = _setting(
        2.0, "inference", "how often inference servers' health and load are read")
    tokenizer_path: str = _setting(
        "", "inference", "local Hugging Face tokenizer directory whose chat template RUN "
        "renders (empty: the embedded policy's template)")
    gateway_port: int = _setting(
        0, "inference", "port of RUN's OpenAI-compatible gateway for harness episodes, on "
        "127.0.0.1 (0: a free port)")
    chat_template: str = _setting(
        "", "inference", "a Jinja chat template file used instead of the tokenizer's (e.g. one "
        "that keeps earlier reasoning: rollstream/inference/templates/)")
    chat_template_kwargs: str = _setting(
        "", "inference", 'JSON object passed to the chat template, e.g. '
        '\'{"enable_thinking": false}\'')

    def __post_init__(self) -> None:
        check_adapter(self.adapter)  # a bad name fails at start, not as a server's 404
        if self.retries_infra < 0:
            raise ValueError(f"retries_infra {self.retries_infra}: must be 0 (none) or more")

    def policy_urls(self) -> list[str]:
        """Inference endpoints: `policy_url`, then the lines of `policy_url_file` (read now;
        blank lines and `#` comments skipped), without duplicates."""
        urls = [u.strip() for u in self.policy_url.split(",")]
        if self.policy_url_file:
            path = Path(self.policy_url_file)
            lines = path.read_text().splitlines() if path.is_file() else []
            urls += [line.split("#", 1)[0].strip() for line in lines]
        return list(dict.fromkeys(u.rstrip("/") for u in urls if u))


@dataclass(frozen=True)
class Bounds:
    """Bounds at the door (rollstream.bounds): checked by `publish`, INIT and RUN."""

    max_group_size: int = _setting(1024, "bounds", "largest group_size a task may ask for")
    max_turns_per_episode: int = _setting(256, "bounds", "largest max_turns a task may ask for")
    max_tokens_per_turn: int = _setting(
        32768, "bounds", "largest sampling.max_tokens a task may ask for")
    max_episode_tokens: int = _setting(
        1 << 20, "bounds", "largest max_turns x sampling.max_tokens: the worst-case trajectory "
        "must fit the trajectories topic")
    max_prompt_bytes: int = _setting(1 << 20, "bounds", "largest task prompt, UTF-8 bytes")
    max_task_id_bytes: int = _setting(
        512, "bounds", "longest task_id, UTF-8 bytes (it keys every event)")


@dataclass(frozen=True)
class KafkaSettings:
    """The connection every process has: the broker, its client properties, the job's topics."""

    bootstrap_servers: str = _setting(
        "", "kafka", "Kafka bootstrap servers (`local`: the bundled broker, started if needed)")
    kafka_config: str = _setting(
        "", "kafka", "Java-style properties file of Kafka client settings (SASL, TLS, any "
        "librdkafka key), e.g. a managed service's client.properties")
    prefix: str = _setting("rollstream", "kafka", "topic name prefix")
    timeout_s: float = _setting(
        30.0, "command", "seconds a command waits for the broker before it gives up with the "
        "cause (long-running processes keep retrying instead)", flag="--timeout")
    partitions: int = _setting(8, "topics", "partitions per topic (topics create)")
    # Resolved by `load` from the [kafka] table and the kafka_config file; no flag of its own.
    kafka_properties: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def topics(self) -> Topics:
        return Topics(self.prefix)

    def kafka(self) -> dict[str, Any]:
        """Base librdkafka configuration: the client properties and the broker address."""
        return {**self.kafka_properties, "bootstrap.servers": self.bootstrap_servers,
                "logger": CLIENT_LOG}

    def client_flags(self) -> list[str]:
        """The flags that give a child process this process's broker and client properties."""
        flags = ["--bootstrap-servers", self.bootstrap_servers, "--prefix", self.prefix]
        return flags + (["--kafka-config", self.kafka_config] if self.kafka_config else [])


# The components beside the connection, each handed to what it configures: the stage runtime
# takes `stage`, RUN's router and the controller `inference`, the sandboxes `sandbox`, the
# checks at the door `bounds`.
COMPONENTS: dict[str, type] = {"stage": StageSettings, "service": ServiceSettings,
                               "inference": InferenceSettings, "sandbox": SandboxSettings,
                               "bounds": Bounds}


@dataclass(frozen=True)
class Settings(KafkaSettings):
    """A process's settings: its Kafka connection, and one object per component."""

    stage: StageSettings = field(default_factory=StageSettings)
    service: ServiceSettings = field(default_factory=ServiceSettings)
    inference: InferenceSettings = field(default_factory=InferenceSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    bounds: Bounds = field(default_factory=Bounds)

    def override(self, **values: Any) -> Settings:
        """These settings with `values` (by their flat names, as flags and files name them)
        replaced, each in its component."""
        unknown = sorted(set(values) - set(_KEYS))
        if unknown:
            raise TypeError(f"unknown settings {unknown}")
        own = {k: v for k, v in values.items() if _KEYS[k][0] == ""}
        parts = {name: replace(getattr(self, name), **{
            _KEYS[k][1]: v for k, v in values.items() if _KEYS[k][0] == name})
            for name in COMPONENTS if any(_KEYS[k][0] == name for k in values)}
        return replace(self, **own, **parts)


ENV_PREFIX = "ROLLSTREAM_"


def _key(f: Field[Any]) -> str:
    return f.metadata.get("key") or f.name


# Every setting as flags, the environment and files name it (its flat key), with the component
# that holds it ("" for the connection's own) and its field there.
_FIELDS: list[tuple[str, Field[Any]]] = [
    ("", f) for f in fields(KafkaSettings) if "group" in f.metadata] + [
    (name, f) for name, cls in COMPONENTS.items() for f in fields(cls)]
_KEYS: dict[str, tuple[str, str]] = {_key(f): (name, f.name) for name, f in _FIELDS}


def env_var(key: str) -> str:
    """The environment variable of the setting `key` (e.g. sandbox_root), named in errors."""
    return ENV_PREFIX + key.upper()


# Keys whose values are secrets: never printed (logs, errors, status, the demo screen).
SECRET_MARKERS = ("password", "passphrase", "secret", "jaas", "oauthbearer.config", "key.pem",
                  "ssl_key")
# A token is a secret where the key names the token itself (`bearer.auth.token`), not where it
# names something about tokens (`sasl.oauthbearer.token.endpoint.url`).
SECRET_LAST_WORDS = ("token",)


def is_secret(key: str) -> bool:
    lowered = key.lower()
    return (any(marker in lowered for marker in SECRET_MARKERS)
            or lowered.rsplit(".", 1)[-1] in SECRET_LAST_WORDS)


def redacted(properties: dict[str, Any]) -> dict[str, Any]:
    """`properties` fit to print: every secret value replaced."""
    return {k: "[redacted]" if is_secret(k) else v for k, v in properties.items()}


def read_properties(path: Path) -> dict[str, str]:
    """A Java-style properties file (`key=value`, `#` comments), as Kafka's tools read it."""
    import javaproperties

    if not path.is_file():
        raise SystemExit(f"Kafka client properties file not found: {path}")
    with path.open(encoding="utf-8") as fh:
        return dict(javaproperties.load(fh))


def _coerce(value: str, like: Any) -> Any:
    if isinstance(like, bool):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    return value


def _flag(f: Field[Any]) -> str:
    return f.metadata.get("flag") or "--" + _key(f).replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, *groups: str) -> None:
    """Add the flags of the named components (all of them when none is named), one argument
    group each in `--help`; defaults stay None so unset flags don't override."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown setting groups {sorted(unknown)}; known: {list(GROUPS)}")
    chosen = [g for g in GROUPS if g in groups] if groups else list(GROUPS)
    parser.add_argument("--config", type=Path, help="TOML file with settings (top-level keys, "
                        "a [kafka] table of client properties)")
    for group in chosen:
        section = parser.add_argument_group(f"{GROUPS[group]} settings")
        for f in (f for _, f in _FIELDS if f.metadata["group"] == group):
            section.add_argument(
                _flag(f), dest=_key(f), type=type(f.default), default=None,
                help=f"{f.metadata['help']} (env {env_var(_key(f))})",
            )


def load(args: argparse.Namespace | None = None, **overrides: Any) -> Settings:
    """Resolve settings: defaults < file < environment < flags < overrides; then the Kafka
    client properties ([kafka] table < properties file), whose `bootstrap.servers` counts when
    no other setting names the broker."""
    values: dict[str, Any] = {}
    table: dict[str, Any] = {}
    config_file = getattr(args, "config", None) or os.environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise SystemExit(f"config file not found: {path}")
        data = tomllib.loads(path.read_text())
        table = data.pop("kafka", {})
        known = set(_KEYS)
        unknown = sorted(set(data) - known)
        if unknown:
            raise SystemExit(f"{path}: unknown settings {unknown}; known: {sorted(known)}")
        if not isinstance(table, dict):
            raise SystemExit(f"{path}: [kafka] must be a table of client properties")
        values.update(data)
    for _, f in _FIELDS:
        env = os.environ.get(env_var(_key(f)))
        if env is not None:
            values[_key(f)] = _coerce(env, f.default)
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        values["bootstrap_servers"] = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    if args is not None:
        for key in _KEYS:
            flag = getattr(args, key, None)
            if flag is not None:
                values[key] = flag
    properties_given = overrides.pop("kafka_properties", {})
    values.update(overrides)
    try:
        resolved = Settings().override(**values)
    except ValueError as exc:  # a setting __post_init__ refuses: the reason, not a traceback
        raise SystemExit(str(exc)) from exc
    properties = {k: str(v) for k, v in table.items()}
    if resolved.kafka_config:
        properties.update(read_properties(Path(resolved.kafka_config)))
    properties.update(properties_given)
    bootstrap = resolved.bootstrap_servers or properties.get("bootstrap.servers", "")
    properties.pop("bootstrap.servers", None)
    return replace(resolved, bootstrap_servers=bootstrap, kafka_properties=properties)
