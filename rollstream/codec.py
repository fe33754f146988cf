"""Avro single-object encoding (0xC3 0x01 + CRC-64-AVRO fingerprint + body) for every event.

The decoder looks up the writer schema by the fingerprint in the header and resolves it to the
reader's (current) schema, so events written with an older schema version stay readable.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import expand_schema, fingerprint, to_parsing_canonical_form

import schemas

MAGIC = b"\xc3\x01"
HEADER_LEN = 10


class DecodeError(ValueError):
    """An event's bytes are not a known Avro single-object encoded record."""


def _crc(parsed: dict) -> bytes:
    # fastavro returns the CRC-64-AVRO fingerprint as hex, already in little-endian byte order.
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


def _fingerprint(parsed: dict) -> bytes:
    """Of the expanded schema: a type from another .avsc (Turn inside Trajectory) is part of the
    byte layout, so changing it must change the fingerprint of every record that holds it."""
    return _crc(expand_schema(parsed))


def _by_name(raw: Any, top: bool = True) -> Any:
    """`raw` with the types of other schema files collapsed to their names: the form whose
    fingerprint codecs before `_fingerprint` expanded wrote, so their events stay readable."""
    if isinstance(raw, list):
        return [_by_name(r, False) for r in raw]
    if not isinstance(raw, dict):
        return raw
    if not top and raw.get("name") in schemas.SCHEMA_FILES:
        return f"{raw.get('namespace', 'rollstream')}.{raw['name']}"
    return {k: _by_name(v, False) if k in ("type", "items", "values", "fields") else v
            for k, v in raw.items()}


class Codec:
    """Encoder/decoder for the Rollstream event types."""

    def __init__(self) -> None:
        named: dict[str, Any] = {}
        self.schemas: dict[str, dict] = {}
        for name, raw in schemas.raw_schemas().items():
            self.schemas[name] = parse_schema(raw, named_schemas=named)
        self._headers = {name: MAGIC + _fingerprint(s) for name, s in self.schemas.items()}
        # Writer schemas by fingerprint: current ones, then retired versions from history/,
        # then the by-name fingerprints older codecs wrote (a retired version first: events
        # with those were written before the current version existed).
        self._writers: dict[bytes, tuple[str, dict]] = {
            h[2:]: (name, self.schemas[name]) for name, h in self._headers.items()
        }
        by_name: dict[bytes, tuple[str, dict]] = {}
        for path in schemas.history_files():
            raw = schemas.read_history(path)
            parsed = parse_schema(raw, named_schemas=dict(named), _write_hint=False)
            record = raw["name"].rsplit(".", 1)[-1]
            self._writers.setdefault(_fingerprint(parsed), (record, parsed))
            legacy = parse_schema(_by_name(raw), named_schemas=dict(named))
            by_name.setdefault(_crc(legacy), (record, parsed))
        for name, raw in schemas.raw_schemas().items():
            legacy = parse_schema(raw, named_schemas=dict(named))
            by_name.setdefault(_crc(legacy), (name, self.schemas[name]))
        for fp, writer in by_name.items():
            self._writers.setdefault(fp, writer)

    def header(self, record: str) -> bytes:
        return self._headers[record]

    def encode(self, record: str, value: dict) -> bytes:
        out = io.BytesIO()
        out.write(self._headers[record])
        schemaless_writer(out, self.schemas[record], value)
        return out.getvalue()

    def check_header(self, data: bytes | None) -> bytes:
        """Return `data` if it is single-object encoded with a known schema (body not read)."""
        self._writer(data)
        return data  # type: ignore[return-value]

    def _writer(self, data: bytes | None) -> tuple[str, dict]:
        if data is None:
            raise DecodeError("empty value (null)")
        if len(data) < HEADER_LEN or data[:2] != MAGIC:
            raise DecodeError("not Avro single-object encoded (missing 0xC3 0x01 header)")
        found = self._writers.get(data[2:HEADER_LEN])
        if found is None:
            raise DecodeError(f"unknown writer schema fingerprint {data[2:HEADER_LEN].hex()}")
        return found

    def decode(self, data: bytes | None, expect: str | None = None) -> tuple[str, dict]:
        """Return (record name, value). Raises DecodeError naming what was wrong."""
        record, writer = self._writer(data)
        if expect is not None and record != expect:
            raise DecodeError(f"expected a {expect} event, got {record}")
        try:
            value = schemaless_reader(
                io.BytesIO(data[HEADER_LEN:]), writer, self.schemas[record]
            )
        except Exception as exc:  # fastavro raises several types on corrupt bodies
            raise DecodeError(f"corrupt {record} body: {exc}") from exc
        return record, value

    def decode_as(self, record: str, data: bytes | None) -> dict:
        return self.decode(data, expect=record)[1]


_codec: Codec | None = None


def codec() -> Codec:
    """The process-wide codec (schema parsing happens once)."""
    global _codec
    if _codec is None:
        _codec = Codec()
    return _codec


_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")


def pack_ids(ids: Any) -> bytes:
    """Token ids as little-endian int32 bytes (the Turn schema's layout)."""
    if isinstance(ids, list):  # struct packs a list ~4x faster than building an array first
        return struct.pack(f"<{len(ids)}i", *ids)
    return np.asarray(ids, dtype=_I32).tobytes()


def unpack_ids(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_I32)


def pack_logprobs(values: Any) -> bytes:
    if isinstance(values, list):
        return struct.pack(f"<{len(values)}f", *values)
    return np.asarray(values, dtype=_F32).tobytes()


def unpack_logprobs(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_F32)

