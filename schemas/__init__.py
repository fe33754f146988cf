"""Avro event contracts: the .avsc files beside this module are the single source of truth.

`history/` keeps every schema version that was ever written to a topic, so events written by an
older release can still be read (the decoder finds the writer schema by fingerprint).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

# Order matters: a schema may only name types defined before it.
SCHEMA_FILES = {
    "SamplingParams": "sampling.avsc",
    "Task": "task.avsc",
    "Episode": "episode.avsc",
    "Turn": "turn.avsc",
    "Trajectory": "trajectory.avsc",
    "ScoredTrajectory": "scored_trajectory.avsc",
    "PolicyVersion": "policy_version.avsc",
    "DeadLetter": "dead_letter.avsc",
}


def _read(path: str) -> dict:
    return json.loads(resources.files(__name__).joinpath(path).read_text())


@cache
def raw_schemas() -> dict[str, dict]:
    """Current schemas as JSON objects, by record name."""
    return {name: _read(path) for name, path in SCHEMA_FILES.items()}


def history_files() -> list[str]:
    """Paths (relative to this package) of retired schema versions."""
    folder = resources.files(__name__).joinpath("history")
    if not folder.is_dir():
        return []
    return sorted(f"history/{p.name}" for p in folder.iterdir() if p.name.endswith(".avsc"))


def read_history(path: str) -> dict:
    return _read(path)
