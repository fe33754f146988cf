"""Apache Avro's reference Python library reading and writing Rollstream events from the .avsc
files and the single-object encoding spec alone: the independent implementation the codec is
checked against. Nothing here uses rollstream.contracts.codec."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import avro.io
import avro.schema

from schemas import SCHEMA_FILES

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
MAGIC = b"\xc3\x01"


def parse_files(folder: Path = SCHEMAS) -> dict[str, avro.schema.RecordSchema]:
    """The current schemas by record name, parsed the way Avro tools parse several files
    (one shared name table, so a later file can use an earlier file's types)."""
    names = avro.schema.Names()
    parsed = {}
    for file in SCHEMA_FILES.values():  # in order: a file names only types defined before it
        schema = avro.schema.make_avsc_object(json.loads((folder / file).read_text()), names)
        parsed[schema.name] = schema
    return parsed


class Reference:
    def __init__(self, folder: Path = SCHEMAS) -> None:
        self.current = parse_files(folder)
        self.writers: dict[bytes, avro.schema.Schema] = {
            s.fingerprint(): s for s in self.current.values()}
        history = {p.name: avro.schema.parse(p.read_text())
                   for p in sorted((folder / "history").glob("*.avsc"))}
        for schema in history.values():
            self.writers.setdefault(schema.fingerprint(), schema)
        legacy = json.loads((folder / "history" / "legacy_fingerprints.json").read_text())
        for fp, alias in legacy["aliases"].items():
            self.writers[bytes.fromhex(fp)] = history[alias["schema"].removeprefix("history/")]

    def encode(self, record: str, value: dict) -> bytes:
        schema = self.current[record]
        out = io.BytesIO()
        out.write(MAGIC + schema.fingerprint())
        avro.io.DatumWriter(schema).write(value, avro.io.BinaryEncoder(out))
        return out.getvalue()

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        assert data[:2] == MAGIC, "no single-object header"
        writer = self.writers[data[2:10]]  # KeyError: a fingerprint the spec does not explain
        body = io.BytesIO(data[10:])
        reader = self.current[writer.name]
        value = avro.io.DatumReader(writer, reader).read(avro.io.BinaryDecoder(body))
        assert body.tell() == len(data) - 10, "trailing bytes after the body"
        return writer.name, value
