import io

import numpy as np
import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

import schemas
from rollstream.contracts.codec import (
    MAGIC,
    DecodeError,
    codec,
    pack_ids,
    pack_logprobs,
    unpack_ids,
    unpack_logprobs,
)
from tests.helpers.avro_reference import parse_files


def turn(n: int) -> dict:
    rng = np.random.default_rng(n)
    return {
        "index": 0, "prompt_ids": pack_ids(rng.integers(0, 150_000, n)),
        "completion_ids": pack_ids(rng.integers(0, 150_000, n)),
        "logprobs": pack_logprobs(rng.standard_normal(n)), "policy_version": 3,
        "finish_reason": "stop", "started_at_ms": 1, "inference_ms": 2.5,
    }


def test_single_object_header_is_magic_plus_crc64_fingerprint() -> None:
    c = codec()
    data = c.encode("Task", {"task_id": "t", "env": "arithmetic", "prompt": "?"})
    # Of the whole writer schema (SamplingParams, from another file, inlined), as Apache's
    # reference library computes it from the .avsc files.
    assert data[:2] == MAGIC == b"\xc3\x01"
    assert data[2:10] == parse_files()["Task"].fingerprint()


def test_round_trip_keeps_token_ids_and_logprobs_exact() -> None:
    t = turn(32_000)
    record, value = codec().decode(codec().encode("Turn", t))
    assert record == "Turn"
    assert np.array_equal(unpack_ids(value["completion_ids"]), unpack_ids(t["completion_ids"]))
    assert np.array_equal(unpack_logprobs(value["logprobs"]), unpack_logprobs(t["logprobs"]))
    assert value["tool_call"] is None and value["env_ms"] == 0.0  # defaults filled


def test_reads_events_written_with_an_older_schema_version() -> None:
    old = schemas.read_history("history/task.v0.avsc")
    parsed = parse_schema(old)
    body = io.BytesIO()
    schemaless_writer(body, parsed, {"task_id": "old-1", "env": "arithmetic", "prompt": "2+2?",
                                     "data": '{"answer": "4"}', "group_size": 2})
    header = MAGIC + bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
    task = codec().decode_as("Task", header + body.getvalue())
    assert task["task_id"] == "old-1" and task["group_size"] == 2
    assert task["max_turns"] == 4 and task["sampling"]["max_tokens"] == 64  # reader defaults
    assert task["metadata"] == {}


@pytest.mark.parametrize(("data", "message"), [
    (None, "empty value"),
    (b"{\"json\": 1}", "missing 0xC3 0x01 header"),
    (MAGIC + b"\x00" * 8 + b"x", "unknown writer schema fingerprint"),
])
def test_bad_bytes_raise_a_clear_decode_error(data, message) -> None:
    with pytest.raises(DecodeError, match=message):
        codec().decode(data)


def test_corrupt_body_names_the_record() -> None:
    data = codec().encode("Turn", turn(10))
    with pytest.raises(DecodeError, match="corrupt Turn body"):
        codec().decode(data[:20])
