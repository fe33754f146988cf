"""Avro event contracts: the .avsc files beside this module are the single source of truth.

A schema may name a type defined in an earlier file (Episode holds a `rollstream.Task`); what is
written to a topic, fingerprinted and exported is the self-contained form, with every named type
inlined at its first use.

`history/` keeps every schema version that was ever written to a topic, so events written by an
older release can still be read (the decoder finds the writer schema by fingerprint), and
`history/legacy_fingerprints.json` lists the non-spec fingerprints earlier releases wrote, each
a read-only alias of one of those versions.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

NAMESPACE = "rollstream"
# Records written to topics on their own; SamplingParams and Turn only ever inside them.
TOP_LEVEL = ("Task", "Episode", "Trajectory", "TurnCheckpoint", "ScoredTrajectory",
             "PolicyVersion", "DeadLetter", "Job")

# Order matters: a schema may only name types defined before it.
SCHEMA_FILES = {
    "SamplingParams": "sampling.avsc",
    "Task": "task.avsc",
    "Episode": "episode.avsc",
    "Turn": "turn.avsc",
    "Trajectory": "trajectory.avsc",
    "TurnCheckpoint": "turn_checkpoint.avsc",
    "ScoredTrajectory": "scored_trajectory.avsc",
    "PolicyVersion": "policy_version.avsc",
    "DeadLetter": "dead_letter.avsc",
    "Job": "job.avsc",
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


def legacy_fingerprints() -> dict[str, dict]:
    """Read-only aliases: fingerprint (hex, as on the wire) -> {"record", "schema", "why"}."""
    return _read("history/legacy_fingerprints.json")["aliases"]


NAMED = ("record", "error", "enum", "fixed")


def _full_name(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def inline(schema: Any, files: dict[str, dict], namespace: str | None = None,
           defined: set[str] | None = None) -> Any:
    """`schema` with every reference to a type in `files` (full name -> schema) replaced by that
    type's definition at its first use, recursively, as the Avro spec's Parsing Canonical Form
    and every other reader expect; later uses stay names."""
    defined = set() if defined is None else defined
    if isinstance(schema, str):
        full = _full_name(schema, namespace)
        if full in files and full not in defined:
            return inline(files[full], files, namespace, defined)
        return schema
    if isinstance(schema, list):
        return [inline(s, files, namespace, defined) for s in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind in NAMED:
        full = _full_name(schema["name"], schema.get("namespace", namespace))
        defined.add(full)
        inner = full.rsplit(".", 1)[0] if "." in full else None
        if "fields" not in schema:
            return schema
        return {**schema, "fields": [{**f, "type": inline(f["type"], files, inner, defined)}
                                     for f in schema["fields"]]}
    if kind == "array":
        return {**schema, "items": inline(schema["items"], files, namespace, defined)}
    if kind == "map":
        return {**schema, "values": inline(schema["values"], files, namespace, defined)}
    return {**schema, "type": inline(kind, files, namespace, defined)}


def self_contained(raw: dict[str, dict] | None = None) -> dict[str, dict]:
    """Every schema (by record name) with the types of other files inlined: what a reader in
    any language needs, with no other file. A copy: changing it changes no cached schema."""
    raw = copy.deepcopy(raw_schemas() if raw is None else raw)
    files = {_full_name(s["name"], s.get("namespace")): s for s in raw.values()}
    return {name: inline(s, files) for name, s in raw.items()}
