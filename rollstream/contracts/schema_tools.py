"""`rollstream schemas`: check schema evolution and export the event contracts for other languages.

The compatibility rules are Apache Avro's own (the reference library's checker), so "compatible"
here means what it means to a Java or Go reader of the topics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import parse_schema

import schemas
from rollstream.contracts.codec import Codec, spec_fingerprint

DEFAULT_DIR = Path(schemas.__file__).parent
TABLE = "fingerprints.json"


@dataclass
class SchemaSet:
    """The current schemas (by record name) and the retired versions (by file name) of one
    schemas directory."""

    current: dict[str, dict]
    retired: dict[str, dict]
    aliases: dict[str, dict]

    @classmethod
    def load(cls, folder: Path = DEFAULT_DIR) -> SchemaSet:
        def read(path: Path) -> Any:
            return json.loads(path.read_text())

        raw = {name: read(folder / file) for name, file in schemas.SCHEMA_FILES.items()}
        history = folder / "history"
        retired = {p.name: read(p) for p in sorted(history.glob("*.avsc"))}
        legacy = history / "legacy_fingerprints.json"
        aliases = read(legacy)["aliases"] if legacy.exists() else {}
        return cls(schemas.self_contained(raw), retired, aliases)


def _parse(schema: dict) -> avro.schema.Schema:
    return avro.schema.parse(json.dumps(schema))


def _record(schema: dict) -> str:
    return schema["name"].rsplit(".", 1)[-1]


def check(found: SchemaSet) -> list[str]:
    """Problems found (empty: all good). Every retired version must be readable by the current
    schema (backward) and able to read events written with it (forward)."""
    problems = []
    current = {name: _parse(s) for name, s in found.current.items()}
    for file, raw in found.retired.items():
        record = _record(raw)
        if record not in current:
            problems.append(f"history/{file}: no current schema for record {record}")
            continue
        old = _parse(raw)
        for direction, reader, writer in (("backward (current reads it)", current[record], old),
                                          ("forward (it reads current)", old, current[record])):
            # A fresh checker per pair: it memoizes by pair, and our pairs share names.
            result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
            if result.compatibility is not SchemaCompatibilityType.compatible:
                where = "; ".join(f"{'/'.join(loc)}: {msg}" for loc, msg in
                                  zip(result.locations, result.messages, strict=False))
                problems.append(f"{record} vs history/{file}: not {direction}: {where}")
    for fp, alias in found.aliases.items():
        target = found.retired.get(alias["schema"].removeprefix("history/"))
        if target is None:
            problems.append(f"legacy fingerprint {fp}: {alias['schema']} is not in history/")
        elif _record(target) != alias["record"]:
            problems.append(f"legacy fingerprint {fp}: {alias['schema']} is not a "
                            f"{alias['record']}")
    return problems


def export(found: SchemaSet, out: Path) -> dict[str, str]:
    """Write one self-contained .avsc per record and the fingerprint table; returns the table."""
    out.mkdir(parents=True, exist_ok=True)
    table = Codec(found.current).fingerprints()
    table = {name: table[name] for name in schemas.TOP_LEVEL}
    for name in schemas.TOP_LEVEL:
        schema = found.current[name]
        (out / f"{schemas.NAMESPACE}.{name}.avsc").write_text(json.dumps(schema, indent=2) + "\n")
    # Readers of old logs need every retired writer schema too (legacy aliases point at them).
    (out / "history").mkdir(exist_ok=True)
    for file, schema in found.retired.items():
        (out / "history" / file).write_text(json.dumps(schema, indent=2) + "\n")
    (out / TABLE).write_text(json.dumps({
        "doc": "Avro single-object encoding: every value is C3 01, then this 8-byte CRC-64-AVRO "
               "fingerprint (little endian, shown as hex in wire order), then the Avro binary "
               "body. retired: older writer schemas (their own spec fingerprints). legacy: "
               "read-only non-spec fingerprints of earlier releases and the retired schema "
               "each was written with.",
        "fingerprints": {f"{schemas.NAMESPACE}.{name}": fp for name, fp in table.items()},
        "retired": {f"history/{file}": spec_fingerprint(cast(dict, parse_schema(schema))).hex()
                    for file, schema in found.retired.items()},
        "legacy": {fp: {"record": f"{schemas.NAMESPACE}.{a['record']}", "schema": a["schema"]}
                   for fp, a in found.aliases.items()},
    }, indent=2) + "\n")
    return table
