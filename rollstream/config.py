"""Settings for every Rollstream process: defaults < config file (TOML) < environment < flags.

Environment variables are ROLLSTREAM_<FIELD> (e.g. ROLLSTREAM_PREFIX), plus the conventional
KAFKA_BOOTSTRAP_SERVERS for the broker address.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from rollstream.graph import Topics


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str = field(
        default="", metadata={"help": "Kafka bootstrap servers; empty: the bundled local broker"}
    )
    prefix: str = field(default="rollstream", metadata={"help": "topic name prefix"})
    partitions: int = field(default=8, metadata={"help": "partitions per topic (topics create)"})
    max_in_flight: int = field(
        default=64, metadata={"help": "events a stage process works on at once (backpressure)"}
    )
    commit_interval_ms: int = field(
        default=200, metadata={"help": "how often a stage commits its transaction"}
    )
    admission_window: int = field(
        default=0,
        metadata={"help": "INIT admits at most this many tasks beyond what the trainer has "
                          "consumed (bounds staleness); 0: no limit"},
    )
    instance_id: str = field(
        default="",
        metadata={"help": "stable id for static group membership and the transactional id"},
    )
    policy_url: str = field(
        default="http://127.0.0.1:8011",
        metadata={"help": "inference endpoint(s), comma separated (vLLM-compatible)"},
    )
    policy_url_file: str = field(
        default="",
        metadata={"help": "file listing more inference endpoints, one per line; re-read while "
                          "running, so servers can be added and removed"},
    )
    request_timeout_s: float = field(
        default=60.0, metadata={"help": "per inference request timeout"}
    )
    server_max_in_flight: int = field(
        default=64,
        metadata={"help": "requests one RUN process sends one inference server at once; when "
                          "every server is at it, RUN stops taking episodes"},
    )
    health_interval_s: float = field(
        default=2.0, metadata={"help": "how often inference servers' health and load are read"}
    )
    metrics_port: int = field(
        default=0,
        metadata={"help": "port of a long-running process's /metrics, /health and /ready "
                          "(0: a free port, logged at start; -1: off)"},
    )
    tokenizer_path: str = field(
        default="",
        metadata={"help": "local Hugging Face tokenizer directory whose chat template RUN "
                          "renders (empty: the embedded policy's template)"},
    )
    gateway_port: int = field(
        default=0,
        metadata={"help": "port of RUN's OpenAI-compatible gateway for harness episodes, on "
                          "127.0.0.1 (0: a free port)"},
    )
    chat_template: str = field(
        default="",
        metadata={"help": "a Jinja chat template file used instead of the tokenizer's (e.g. "
                          "one that keeps earlier reasoning: rollstream/inference/templates/)"},
    )
    chat_template_kwargs: str = field(
        default="",
        metadata={"help": 'JSON object passed to the chat template, e.g. '
                          '\'{"enable_thinking": false}\''},
    )
    # Bounds at the door (rollstream.bounds): checked by `publish`, INIT and RUN.
    max_group_size: int = field(
        default=1024, metadata={"help": "largest group_size a task may ask for"}
    )
    max_turns_per_episode: int = field(
        default=256, metadata={"help": "largest max_turns a task may ask for"}
    )
    max_tokens_per_turn: int = field(
        default=32768, metadata={"help": "largest sampling.max_tokens a task may ask for"}
    )
    max_episode_tokens: int = field(
        default=1 << 20,
        metadata={"help": "largest max_turns x sampling.max_tokens: the worst-case trajectory "
                          "must fit the trajectories topic"},
    )
    max_prompt_bytes: int = field(
        default=1 << 20, metadata={"help": "largest task prompt, UTF-8 bytes"}
    )
    max_task_id_bytes: int = field(
        default=512, metadata={"help": "longest task_id, UTF-8 bytes (it keys every event)"}
    )
    dedup_window: int = field(
        default=100_000,
        metadata={"help": "ids INIT and EVAL remember per input partition to drop duplicates "
                          "(rollstream.dedup)"},
    )

    @cached_property
    def topics(self) -> Topics:
        return Topics(self.prefix)

    def policy_urls(self) -> list[str]:
        """Inference endpoints: `policy_url`, then the lines of `policy_url_file` (read now;
        blank lines and `#` comments skipped), without duplicates."""
        urls = [u.strip() for u in self.policy_url.split(",")]
        if self.policy_url_file:
            path = Path(self.policy_url_file)
            lines = path.read_text().splitlines() if path.is_file() else []
            urls += [line.split("#", 1)[0].strip() for line in lines]
        return list(dict.fromkeys(u.rstrip("/") for u in urls if u))

    def kafka(self) -> dict[str, Any]:
        """Base librdkafka configuration."""
        return {"bootstrap.servers": self.bootstrap_servers}


ENV_PREFIX = "ROLLSTREAM_"


def _coerce(value: str, like: Any) -> Any:
    if isinstance(like, bool):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one --flag per setting (defaults stay None so unset flags don't override)."""
    parser.add_argument("--config", type=Path, help="TOML file with settings (top-level keys)")
    for f in fields(Settings):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=type(f.default),
            default=None,
            help=f"{f.metadata.get('help', '')} (env {ENV_PREFIX}{f.name.upper()})",
        )


def load(args: argparse.Namespace | None = None, **overrides: Any) -> Settings:
    """Resolve settings: defaults < file < environment < flags < overrides."""
    settings = Settings()
    values: dict[str, Any] = {}
    config_file = getattr(args, "config", None) or os.environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise SystemExit(f"config file not found: {path}")
        data = tomllib.loads(path.read_text())
        known = {f.name for f in fields(Settings)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SystemExit(f"{path}: unknown settings {unknown}; known: {sorted(known)}")
        values.update(data)
    for f in fields(Settings):
        env = os.environ.get(ENV_PREFIX + f.name.upper())
        if env is not None:
            values[f.name] = _coerce(env, f.default)
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        values["bootstrap_servers"] = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    if args is not None:
        for f in fields(Settings):
            flag = getattr(args, f.name, None)
            if flag is not None:
                values[f.name] = flag
    values.update(overrides)
    return replace(settings, **values)
