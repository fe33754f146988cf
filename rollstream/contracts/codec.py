"""Avro single-object encoding (0xC3 0x01 + CRC-64-AVRO fingerprint + body) for every event.

The fingerprint is the spec's: of the Parsing Canonical Form of the self-contained schema (every
named type inlined at first use), so any Avro library finds the writer schema from the .avsc
files alone, and a change to a nested type (Turn) changes the fingerprint of every record that
holds it. The decoder looks up the writer schema by fingerprint and resolves it to the reader's
(current) schema, so events written with an older schema version, or with the non-spec
fingerprints of earlier releases (schemas/history/legacy_fingerprints.json), stay readable.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

import schemas

# Kafka record headers naming what a record is, for kcat or a Kafka UI (the value needs no
# header to be decoded: the single-object header already says it).
from rollstream.contracts.wire import FINGERPRINT_HEADER, RECORD_HEADER

if TYPE_CHECKING:
    from rollstream.contracts.events import (
        DeadLetter,
        Episode,
        Job,
        PolicyVersion,
        ScoredTrajectory,
        Task,
        Trajectory,
    )

MAGIC = b"\xc3\x01"
HEADER_LEN = 10


class DecodeError(ValueError):
    """An event's bytes are not a known Avro single-object encoded record."""


def spec_fingerprint(schema: dict) -> bytes:
    """CRC-64-AVRO of a self-contained schema's Parsing Canonical Form, in wire (little-endian)
    byte order (fastavro returns it as hex in that order)."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


class Codec:
    """Encoder/decoder for the Rollstream event types."""

    def __init__(self, raw: dict[str, dict] | None = None) -> None:
        """`raw`: the schemas by record name (default: the .avsc files)."""
        # A record's parsed schema is an object (fastavro types it as any schema).
        self.schemas: dict[str, dict] = {
            name: cast(dict, parse_schema(s)) for name, s in schemas.self_contained(raw).items()
        }
        self._headers = {name: MAGIC + spec_fingerprint(s) for name, s in self.schemas.items()}
        # Writer schemas by fingerprint: current ones, retired versions from history/, then the
        # legacy aliases. setdefault: a retired version with the current layout changes nothing.
        self._writers: dict[bytes, tuple[str, dict]] = {
            h[2:]: (name, self.schemas[name]) for name, h in self._headers.items()
        }
        history = {}
        for path in schemas.history_files():
            retired = cast(dict, parse_schema(schemas.read_history(path), _write_hint=False))
            history[path] = retired
            self._writers.setdefault(spec_fingerprint(retired), (_record(retired), retired))
        for fp, alias in schemas.legacy_fingerprints().items():
            self._writers.setdefault(bytes.fromhex(fp), (alias["record"], history[alias["schema"]]))
        self._kafka_headers = {
            fp: [(RECORD_HEADER, f"{schemas.NAMESPACE}.{record}".encode()),
                 (FINGERPRINT_HEADER, fp.hex().encode())]
            for fp, (record, _) in self._writers.items()
        }

    def header(self, record: str) -> bytes:
        return self._headers[record]

    def fingerprints(self) -> dict[str, str]:
        """Record name -> the fingerprint new events are written with (hex, wire order)."""
        return {name: h[2:].hex() for name, h in self._headers.items()}

    def encode(self, record: str, value: Mapping[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(self._headers[record])
        schemaless_writer(out, self.schemas[record], value)
        return out.getvalue()

    def headers_for(self, data: bytes | None) -> list[tuple[str, bytes]] | None:
        """Kafka headers naming the record type and fingerprint of an encoded event (None when
        `data` is not one)."""
        if data is None or data[:2] != MAGIC:
            return None
        return self._kafka_headers.get(data[2:HEADER_LEN])

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
        body = io.BytesIO(data[HEADER_LEN:])  # type: ignore[index]
        try:
            value = schemaless_reader(body, writer, self.schemas[record])
        except Exception as exc:  # fastavro raises several types on corrupt bodies
            raise DecodeError(f"corrupt {record} body: {exc}") from exc
        extra = len(data) - HEADER_LEN - body.tell()  # type: ignore[arg-type]
        if extra:
            # Bytes the schema does not account for: a framing error or a writer schema other
            # than the one its fingerprint names; taking the prefix would hide it.
            raise DecodeError(f"{extra} trailing bytes after the {record} body")
        return record, cast(dict, value)  # a record decodes as an object

    # The event records decode as their TypedDicts (rollstream.contracts.events).
    @overload
    def decode_as(self, record: Literal["Task"], data: bytes | None) -> Task: ...
    @overload
    def decode_as(self, record: Literal["Episode"], data: bytes | None) -> Episode: ...
    @overload
    def decode_as(self, record: Literal["Trajectory"], data: bytes | None) -> Trajectory: ...
    @overload
    def decode_as(self, record: Literal["ScoredTrajectory"],
                  data: bytes | None) -> ScoredTrajectory: ...
    @overload
    def decode_as(self, record: Literal["PolicyVersion"], data: bytes | None) -> PolicyVersion: ...
    @overload
    def decode_as(self, record: Literal["DeadLetter"], data: bytes | None) -> DeadLetter: ...
    @overload
    def decode_as(self, record: Literal["Job"], data: bytes | None) -> Job: ...
    @overload
    def decode_as(self, record: str, data: bytes | None) -> Any: ...

    def decode_as(self, record: str, data: bytes | None) -> Any:
        """The event, which must be a `record`; raises DecodeError naming what was wrong."""
        return self.decode(data, expect=record)[1]


def _record(parsed: dict) -> str:
    return parsed["name"].rsplit(".", 1)[-1]


_codec: Codec | None = None


def codec() -> Codec:
    """The process-wide codec (schema parsing happens once)."""
    global _codec
    if _codec is None:
        _codec = Codec()
    return _codec


def headers_for(data: bytes | None) -> list[tuple[str, bytes]] | None:
    """Kafka record headers for an encoded event (see Codec.headers_for)."""
    return codec().headers_for(data)


_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")


def pack_ids(ids: Any) -> bytes:
    """Token ids as little-endian int32 bytes (the Turn schema's layout)."""
    if isinstance(ids, list):  # struct packs a list ~4x faster than building an array first
        return struct.pack(f"<{len(ids)}i", *ids)
    return np.asarray(ids, dtype=_I32).tobytes()


def unpack_ids(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_I32)


# Token ids: a list, or an int32 array (RUN's contexts).
Ids = Sequence[int] | np.ndarray


def id_list(ids: Ids) -> list[int]:
    """Token ids as a list of Python ints: an array's through tolist (iterating one makes a numpy
    scalar per id: comparing 30k ids with a list took 6.4 ms that way, 1.0 ms through tolist)."""
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


def pack_logprobs(values: Any) -> bytes:
    if isinstance(values, list):
        return struct.pack(f"<{len(values)}f", *values)
    return np.asarray(values, dtype=_F32).tobytes()


def unpack_logprobs(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_F32)

