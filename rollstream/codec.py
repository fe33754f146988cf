"""Avro single-object encoding (0xC3 0x01 + CRC-64-AVRO fingerprint + body) for every event.

The decoder looks up the writer schema by the fingerprint in the header and resolves it to the
reader's (current) schema, so events written with an older schema version stay readable.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

import schemas

MAGIC = b"\xc3\x01"
HEADER_LEN = 10


class DecodeError(ValueError):
    """An event's bytes are not a known Avro single-object encoded record."""


def _fingerprint(parsed: dict) -> bytes:
    # fastavro returns the CRC-64-AVRO fingerprint as hex, already in little-endian byte order.
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


class Codec:
    """Encoder/decoder for the Rollstream event types."""

    def __init__(self) -> None:
        named: dict[str, Any] = {}
        self.schemas: dict[str, dict] = {}
        for name, raw in schemas.raw_schemas().items():
            self.schemas[name] = parse_schema(raw, named_schemas=named)
        self._headers = {name: MAGIC + _fingerprint(s) for name, s in self.schemas.items()}
        # Writer schemas by fingerprint: current ones, then retired versions from history/.
        self._writers: dict[bytes, tuple[str, dict]] = {
            h[2:]: (name, self.schemas[name]) for name, h in self._headers.items()
        }
        for path in schemas.history_files():
            raw = schemas.read_history(path)
            parsed = parse_schema(raw, named_schemas=dict(named), _write_hint=False)
            record = raw["name"].rsplit(".", 1)[-1]
            self._writers.setdefault(_fingerprint(parsed), (record, parsed))

    def header(self, record: str) -> bytes:
        return self._headers[record]

    def encode(self, record: str, value: dict) -> bytes:
        out = io.BytesIO()
        out.write(self._headers[record])
        schemaless_writer(out, self.schemas[record], value)
        return out.getvalue()

    def decode(self, data: bytes | None, expect: str | None = None) -> tuple[str, dict]:
        """Return (record name, value). Raises DecodeError naming what was wrong."""
        if data is None:
            raise DecodeError("empty value (null)")
        if len(data) < HEADER_LEN or data[:2] != MAGIC:
            raise DecodeError("not Avro single-object encoded (missing 0xC3 0x01 header)")
        found = self._writers.get(bytes(data[2:HEADER_LEN]))
        if found is None:
            raise DecodeError(f"unknown writer schema fingerprint {data[2:HEADER_LEN].hex()}")
        record, writer = found
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
    return np.asarray(ids, dtype=_I32).tobytes()


def unpack_ids(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_I32)


def pack_logprobs(values: Any) -> bytes:
    return np.asarray(values, dtype=_F32).tobytes()


def unpack_logprobs(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_F32)

