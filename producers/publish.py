"""Publish tasks to <prefix>.tasks: validate the whole task file, then send it in one transaction.

Validation happens before anything is sent so a typo on line 9,000 does not leave 8,999 tasks
half-published; the transaction makes the send itself all-or-nothing too.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastavro.validation import ValidationError, validate

from rollstream.bounds import check_task
from rollstream.cluster.kafka import process_id, produce, transaction, transactional_producer
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.contracts.events import TASK
from rollstream.envs.base import Environment
from rollstream.envs.registry import UnknownEnv, get_env
from rollstream.envs.swe import sources as swe_sources


class TaskFileError(ValueError):
    """A task source is invalid; the message names the location (file:line) and the field."""


# A loader turns a task source into (location, candidate Task dict) pairs, or (location,
# ValueError) for an entry it cannot read; load_tasks validates every candidate the same way
# whatever the source, so a new format only maps fields.
Loader = Callable[[Path], Iterator[tuple[str, dict[str, Any] | ValueError]]]
MAX_REPORTED = 20  # bad entries listed in one error; the count says how many there are


def _read_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any] | ValueError]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            if not isinstance(item, dict):
                yield where, ValueError(f"expected a JSON object, got {_show(item)}")
                continue
            yield where, item


def _swe_loader(source: str) -> Loader:
    """SWE-bench-family instance files (rollstream.envs.swe.sources), errors as TaskFileError."""
    def load(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
        try:
            yield from swe_sources.loader(source)(path)
        except swe_sources.SourceError as exc:
            raise TaskFileError(str(exc)) from None
    return load


FORMATS: dict[str, Loader] = {
    "rollstream": _read_jsonl,
    **{source: _swe_loader(source) for source in swe_sources.SOURCES},
}


def _show(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(schema: Any) -> str:
    if isinstance(schema, list):
        return " or ".join(_type_name(s) for s in schema)
    if isinstance(schema, dict):
        return schema.get("name") or schema["type"]
    return str(schema).rpartition(".")[2]  # named types without their namespace


def _record_fields(schema: Any, named: dict[str, Any]) -> list[dict] | None:
    """The fields of a record type (parsed schemas refer to named records by name), else None."""
    schema = named.get(schema, schema) if isinstance(schema, str) else schema
    if isinstance(schema, dict) and schema.get("type") == "record":
        return schema["fields"]
    return None


def _fill_defaults(
    fields: list[dict], named: dict[str, Any], value: dict[str, Any], path: str = ""
) -> dict[str, Any]:
    """A copy of `value` with schema defaults filled in, nested records too.

    Unknown fields are rejected: a misspelt optional field would silently take its default.
    """
    known = {f["name"]: f for f in fields}
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"unknown field '{path}{unknown[0]}'; known: {', '.join(known)}")
    out: dict[str, Any] = {}
    for name, f in known.items():
        inner = _record_fields(f["type"], named)
        if name not in value:
            if "default" not in f:
                raise ValueError(f"field '{path}{name}': missing (required, no default)")
            out[name] = copy.deepcopy(f["default"])  # never share the schema's own objects
        elif inner is not None and isinstance(value[name], dict):
            out[name] = _fill_defaults(inner, named, value[name], f"{path}{name}.")
        else:
            out[name] = value[name]
    return out


def _field_paths(schema: dict, named: dict[str, Any], path: str = "") -> dict[str, str]:
    """Record type name -> dotted path of the Task field holding it ("" for Task itself)."""
    paths = {schema["name"]: path}
    for f in schema["fields"]:
        if _record_fields(f["type"], named) is not None:
            inner = named.get(f["type"], f["type"]) if isinstance(f["type"], str) else f["type"]
            paths.update(_field_paths(inner, named, f"{path}{f['name']}."))
    return paths


def _check_types(schema: dict, task: dict[str, Any]) -> None:
    try:
        validate(task, schema)
    except ValidationError as exc:
        errors = exc.errors
        # fastavro names the field "<record type>.<field>"; users know the path from Task.
        record, _, name = errors[0].field.rpartition(".")
        field = _field_paths(schema, schema["__named_schemas"]).get(record, "") + name
        expected = " or ".join(dict.fromkeys(_type_name(e.schema) for e in errors))
        got = _show(errors[0].datum)
        raise ValueError(f"field '{field}': expected {expected}, got {got}") from None


def _normalize_data(data: Any) -> str:
    """Task.data travels as a JSON string; accept the object itself or a string holding one."""
    if isinstance(data, str):
        try:
            parsed = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"field 'data': string is not valid JSON: {exc.msg}") from None
    else:
        parsed = data
    if not isinstance(parsed, dict):
        raise ValueError(f"field 'data': expected a JSON object, got {_show(data)}")
    return data if isinstance(data, str) else json.dumps(data)


def _check_env(name: str, known: dict[str, Environment]) -> Environment:
    if name not in known:
        try:
            known[name] = get_env(name)
        except UnknownEnv as exc:
            raise ValueError(f"field 'env': {exc}") from None
    return known[name]


def _check_env_data(task: dict[str, Any], known_envs: dict[str, Environment]) -> None:
    """The task's environment accepts its data: the check INIT makes, so a task it would
    dead-letter (an arithmetic task without `answer`) is refused before sending."""
    try:
        _check_env(task["env"], known_envs).validate_task(task)
    except ValueError as exc:  # InvalidTask names the field
        raise ValueError(f"env {task['env']!r}: {exc}") from None


def validate_task(item: dict[str, Any], known_envs: dict[str, Environment] | None = None,
                  settings: Settings | None = None) -> dict[str, Any]:
    """A complete Task (defaults filled, data as a JSON string); ValueError names the bad field.

    Beyond the schema, the task must meet the bounds of `settings` (rollstream.bounds; the
    default settings when None), the same check INIT applies (`load_tasks` adds the
    environment's own check of the task's data).
    """
    schema = codec().schemas[TASK]
    task = _fill_defaults(schema["fields"], schema["__named_schemas"], item)
    if "data" in item:
        task["data"] = _normalize_data(item["data"])
    _check_types(schema, task)
    check_task(task, (settings or Settings()).bounds)
    _check_env(task["env"], {} if known_envs is None else known_envs)
    return task


def checked_task(item: dict[str, Any], known_envs: dict[str, Environment],
                 settings: Settings | None = None) -> dict[str, Any]:
    """validate_task, then the environment's own check of the task's data: every check INIT
    makes, so what passes is never dead-lettered for its content (publish and the HTTP API)."""
    task = validate_task(item, known_envs, settings)
    _check_env_data(task, known_envs)
    return task


def load_tasks(path: str | Path, fmt: str = "rollstream",
               settings: Settings | None = None) -> list[dict[str, Any]]:
    """Read and validate every task in `path` (against the bounds of `settings`); raises
    TaskFileError listing the bad ones (the first MAX_REPORTED, and how many there are)."""
    if fmt not in FORMATS:
        raise TaskFileError(f"unknown task format {fmt!r}; known: {', '.join(FORMATS)}")
    tasks: list[dict[str, Any]] = []
    bad: list[str] = []
    first_seen: dict[str, str] = {}
    known_envs: dict[str, Environment] = {}
    for where, item in FORMATS[fmt](Path(path)):
        try:
            if isinstance(item, ValueError):
                raise item
            task = checked_task(item, known_envs, settings)
            # Episode ids derive from task ids, so a duplicate would collide downstream.
            if task["task_id"] in first_seen:
                raise ValueError(f"field 'task_id': duplicate {task['task_id']!r} "
                                 f"(first at {first_seen[task['task_id']]})")
        except ValueError as exc:
            bad.append(f"{where}: {exc}")
            continue
        first_seen[task["task_id"]] = where
        tasks.append(task)
    if bad:
        shown = "" if len(bad) <= MAX_REPORTED else f", the first {MAX_REPORTED} above"
        raise TaskFileError("\n".join(bad[:MAX_REPORTED])
                            + f"\n{len(bad)} bad task(s) in {path}{shown}; nothing sent")
    return tasks


def publish(settings: Settings, tasks: list[dict[str, Any]]) -> int:
    """Send validated tasks to <prefix>.tasks keyed by task_id, all in one transaction."""
    topic = settings.topics.tasks
    now_ms = int(time.time() * 1000)
    values = [
        codec().encode(TASK, {**t, "created_at_ms": t["created_at_ms"] or now_ms}) for t in tasks
    ]
    p = transactional_producer(settings, process_id(settings, settings.topics.group("publish")))
    # The topic must exist, or the send would only fail at commit, after a delivery timeout.
    # Listing all topics, not this one, so a broker with auto-create on does not create it.
    found = p.list_topics(timeout=10).topics.get(topic)
    if found is None or found.error is not None:
        raise RuntimeError(f"topic {topic} does not exist (create it: rollstream topics create)")
    with transaction(p):
        for task, value in zip(tasks, values, strict=True):
            produce(p, topic, value, key=task["task_id"])
    return len(tasks)


def already_handled(settings: Settings, task_ids: list[str]) -> list[str]:
    """Which of `task_ids` INIT has already handled (its markers on <prefix>.seen, committed
    ones): it drops a task it has handled as a duplicate, so a re-published file sends tasks
    that never run again. In the order given."""
    from rollstream.cluster.kafka import reader
    from rollstream.dedup import SeenIds

    probe = reader(settings, [])
    try:
        found = probe.list_topics(settings.topics.seen, timeout=10).topics[settings.topics.seen]
    finally:
        probe.close()
    if found.error is not None:  # no seen topic: nothing handled yet
        return []
    seen = SeenIds(settings, "init").read(sorted(found.partitions), attempts=1)
    return [t for t in task_ids if any(t in ids for ids in seen.values())]
