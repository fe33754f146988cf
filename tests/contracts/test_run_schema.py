"""Turn.new_sample: trajectories written before the field existed stay readable."""

from __future__ import annotations

import io

from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

import schemas
from rollstream.contracts.codec import MAGIC, codec
from tests.helpers.schema_helpers import encode_with, old_trajectory


def test_trajectory_written_before_new_sample_decodes_with_the_default() -> None:
    old = schemas.read_history("history/trajectory.v0.avsc")
    decoded = codec().decode_as("Trajectory", encode_with(old, old, old_trajectory()))
    assert decoded["turns"][0]["new_sample"] is False
    assert decoded["turns"][0]["policy_version"] == 2


def test_events_from_codecs_that_fingerprinted_types_by_name_stay_readable() -> None:
    # Before fingerprints expanded other files' types, Trajectory's named Turn only by name:
    # that fingerprint (the by-name one of Trajectory's layout until attempt was added) now
    # means the layout of its time, the v0 one.
    old = schemas.read_history("history/trajectory.v0.avsc")
    named: dict = {}
    for raw in schemas.raw_schemas().values():
        parse_schema(raw, named_schemas=named)
    layout = schemas.raw_schemas()["Trajectory"]
    layout = {**layout, "fields": [f for f in layout["fields"] if f["name"] != "attempt"]}
    by_name = parse_schema(layout, named_schemas=named)
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(old), old_trajectory())
    crc = fingerprint(to_parsing_canonical_form(by_name), "CRC-64-AVRO")
    assert schemas.legacy_fingerprints()[crc]["schema"] == "history/trajectory.v0.avsc"
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
