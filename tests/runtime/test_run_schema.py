"""Turn.new_sample: trajectories written before the field existed stay readable."""

from __future__ import annotations

import io

from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

import schemas
from rollstream.codec import MAGIC, codec, pack_ids, pack_logprobs


def old_trajectory() -> dict:
    turn = {"index": 0, "prompt_ids": pack_ids([258, 65, 260, 259]),
            "completion_ids": pack_ids([66, 260]), "logprobs": pack_logprobs([-0.1, -0.2]),
            "policy_version": 2, "finish_reason": "stop", "completion_text": "B",
            "tool_call": None, "observation": None, "server": "s", "started_at_ms": 1,
            "inference_ms": 1.0, "env_ms": 0.0}
    task = {"task_id": "t", "env": "arithmetic", "prompt": "A", "data": "{}", "group_size": 1,
            "max_turns": 1, "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                         "max_tokens": 8, "seed": None},
            "metadata": {}, "created_at_ms": 0}
    return {"episode_id": "t#0", "task": task, "sample_index": 0, "turns": [turn],
            "termination": "DONE", "termination_detail": "", "env_state": "{}",
            "started_at_ms": 1, "finished_at_ms": 2}


def encode_with(schema: dict, canonical_of: dict, value: dict) -> bytes:
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(schema), value)
    crc = fingerprint(to_parsing_canonical_form(parse_schema(canonical_of)), "CRC-64-AVRO")
    return MAGIC + bytes.fromhex(crc) + body.getvalue()


def test_trajectory_written_before_new_sample_decodes_with_the_default() -> None:
    old = schemas.read_history("history/trajectory.v0.avsc")
    decoded = codec().decode_as("Trajectory", encode_with(old, old, old_trajectory()))
    assert decoded["turns"][0]["new_sample"] is False
    assert decoded["turns"][0]["policy_version"] == 2


def test_events_from_codecs_that_fingerprinted_types_by_name_stay_readable() -> None:
    # Before fingerprints expanded other files' types, Trajectory's named Turn only by name:
    # that fingerprint now means the layout of its time, the v0 one.
    old = schemas.read_history("history/trajectory.v0.avsc")
    named: dict = {}
    for raw in schemas.raw_schemas().values():
        parse_schema(raw, named_schemas=named)
    by_name = parse_schema(schemas.raw_schemas()["Trajectory"], named_schemas=named)
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(old), old_trajectory())
    crc = fingerprint(to_parsing_canonical_form(by_name), "CRC-64-AVRO")
    decoded = codec().decode_as("Trajectory", MAGIC + bytes.fromhex(crc) + body.getvalue())
    assert decoded["turns"][0]["completion_text"] == "B" and not decoded["turns"][0]["new_sample"]
    scored_old = schemas.read_history("history/scored_trajectory.v0.avsc")
    scored = {"trajectory": old_trajectory(), "reward": 1.0, "failure_class": "ok",
              "verifier": "{}", "scored_at_ms": 3}
    value = codec().decode_as("ScoredTrajectory", encode_with(scored_old, scored_old, scored))
    assert value["trajectory"]["turns"][0]["new_sample"] is False


def test_a_change_to_turn_changes_the_trajectory_fingerprint() -> None:
    c = codec()
    old = parse_schema(schemas.read_history("history/trajectory.v0.avsc"))
    old_fp = fingerprint(to_parsing_canonical_form(old), "CRC-64-AVRO")
    assert c.header("Trajectory")[2:].hex() != old_fp
    new = c.encode("Trajectory", {**old_trajectory(), "turns": [
        {**old_trajectory()["turns"][0], "new_sample": True}]})
    assert c.decode_as("Trajectory", new)["turns"][0]["new_sample"] is True
