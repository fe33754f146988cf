"""The event contracts against independent implementations: the Avro spec's fingerprint test
vectors and Apache's reference library (tests/helpers/avro_reference.py), not our own codec's
output."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import avro.schema
import pytest
from fastavro import parse_schema, schemaless_reader

import schemas
from rollstream.cli import main as cli
from rollstream.contracts.codec import Codec, DecodeError, codec, headers_for, spec_fingerprint
from rollstream.contracts.schema_tools import SchemaSet, check
from tests.helpers.avro_reference import SCHEMAS, Reference, parse_files
from tests.helpers.scored_factory import scored

FIXTURE = Path(__file__).parents[1] / "fixtures" / "legacy_events.json"


def samples() -> dict[str, dict]:
    s = scored("c-1", 2, 0.5, version=3)
    return {
        "Task": s["trajectory"]["task"],
        "Episode": {"episode_id": "c-1#2", "task": s["trajectory"]["task"], "sample_index": 2,
                    "created_at_ms": 7},
        "Trajectory": s["trajectory"],
        "TurnCheckpoint": {"episode_id": "c-1#2", "turn": s["trajectory"]["turns"][0],
                           "env_state": "{}", "previous_observation": "ok",
                           "started_at_ms": 5},
        "ScoredTrajectory": s,
        "PolicyVersion": {"version": 3, "kind": "lora", "uri": "/ckpt/3", "step_id": "s3",
                          "metrics": {"loss": 0.25}, "created_at_ms": 9},
        "DeadLetter": {"stage": "run", "reason": "r", "source_topic": "t", "source_partition": 1,
                       "source_offset": 5, "key": b"k", "value": b"\x00", "failed_at_ms": 3},
    }


def test_fingerprints_match_the_spec_test_vectors() -> None:
    # From the Avro specification: "int" -> 8f5c393f1ad57572 (wire order), and Java's
    # SchemaNormalization.parsingFingerprint64("null") = 7195948357588979594.
    assert spec_fingerprint("int").hex() == "8f5c393f1ad57572"  # type: ignore[arg-type]
    assert int.from_bytes(spec_fingerprint("null"), "little", signed=True) == 7195948357588979594  # type: ignore[arg-type]
    assert avro.schema.parse('"int"').fingerprint().hex() == "8f5c393f1ad57572"


def test_every_record_fingerprint_matches_apache_avro() -> None:
    reference = parse_files()
    ours = codec().fingerprints()
    assert set(ours) == set(reference)
    for name, schema in reference.items():
        assert ours[name] == schema.fingerprint().hex(), name
    # The records that hold other files' types, named in the issue as wrong before.
    assert ours["Episode"] == "7ccef1b90536349f"  # since Episode.attempt
    assert ours["ScoredTrajectory"] == "b05c2ffd95748748"  # since Trajectory.attempt


def test_apache_avro_reads_our_events_and_we_read_theirs() -> None:
    ref = Reference()
    for record, value in samples().items():
        ours = codec().encode(record, value)
        full = codec().decode_as(record, ours)  # with every default filled in
        assert ref.decode(ours) == (record, full)
        assert ref.encode(record, full) == ours  # byte for byte, header included


@pytest.mark.parametrize(("nested", "containers"), [
    ("turn.avsc", {"Turn", "Trajectory", "TurnCheckpoint", "ScoredTrajectory"}),
    ("sampling.avsc", {"SamplingParams", "Task", "Episode", "Trajectory", "ScoredTrajectory"}),
])
def test_a_nested_type_change_changes_every_containing_fingerprint(
        tmp_path: Path, nested: str, containers: set[str]) -> None:
    copy = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    raw = json.loads((copy / nested).read_text())
    raw["fields"].append({"name": "added", "type": "string", "default": ""})
    (copy / nested).write_text(json.dumps(raw))

    before = codec().fingerprints()
    after = Codec(SchemaSet.load(copy).current).fingerprints()
    changed = {name for name in before if before[name] != after[name]}
    assert changed == containers
    reference = parse_files(copy)
    assert all(after[name] == reference[name].fingerprint().hex() for name in after)
    # Adding a defaulted field is a compatible change: the checker agrees.
    assert check(SchemaSet.load(copy)) == []


def test_events_written_by_earlier_releases_still_decode() -> None:
    events = json.loads(FIXTURE.read_text())["events"]
    aliases = schemas.legacy_fingerprints()
    written_now = set(codec().fingerprints().values())
    for event in events:
        data = base64.b64decode(event["base64"])
        assert data[2:10].hex() == event["fingerprint"] not in written_now
        record, value = codec().decode(data)
        assert record == event["record"]
        task = value["task"] if "task" in value else value.get("trajectory", {}).get("task", value)
        assert task["task_id"] == "legacy-1"
        # The reference library reads them too, through the same documented aliases.
        assert Reference().decode(data)[0] == record
    # Every alias is proven by a real old event.
    assert set(aliases) <= {e["fingerprint"] for e in events}


def test_trailing_bytes_after_a_body_are_a_decode_error() -> None:
    data = codec().encode("Task", samples()["Task"])
    with pytest.raises(DecodeError, match="1 trailing bytes after the Task body"):
        codec().decode(data + b"\x00")


def test_a_failure_class_added_later_reads_as_infra() -> None:
    # A newer writer with one more symbol: a reader of today's schema (given the writer schema,
    # as a Java SchemaStore or a later history/ entry gives it) falls back to the enum default.
    raw = schemas.self_contained()["ScoredTrajectory"]
    enum = next(f["type"] for f in raw["fields"] if f["name"] == "failure_class")
    enum["symbols"].append("timeout")
    ref = Reference()
    ref.current["ScoredTrajectory"] = avro.schema.parse(json.dumps(raw))
    full = codec().decode_as("ScoredTrajectory",
                             codec().encode("ScoredTrajectory", samples()["ScoredTrajectory"]))
    data = ref.encode("ScoredTrajectory", {**full, "failure_class": "timeout"})
    body = io.BytesIO(data[10:])
    value = schemaless_reader(body, parse_schema(raw), codec().schemas["ScoredTrajectory"])
    assert value["failure_class"] == "infra"
    # (Apache's Python DatumReader does not apply reader enum defaults yet; Java's does.)


def test_headers_name_the_record_and_fingerprint() -> None:
    data = codec().encode("Episode", samples()["Episode"])
    assert dict(headers_for(data)) == {"rollstream.record": b"rollstream.Episode",
                                       "rollstream.fingerprint": b"7ccef1b90536349f"}
    assert headers_for(b"not avro") is None and headers_for(None) is None


def test_schemas_check_passes_on_the_current_schemas(capsys: pytest.CaptureFixture) -> None:
    assert cli(["schemas", "check"]) == 0
    assert "ok:" in capsys.readouterr().out


@pytest.mark.parametrize(("file", "change", "expect"), [
    # A field without a default: the current schema cannot read old events.
    ("turn.avsc", lambda s: s["fields"].append({"name": "x", "type": "int"}), "backward"),
    # A removed field that old readers need (it has no default there).
    ("trajectory.avsc", lambda s: s["fields"].pop(0), "forward"),
    # A field's type changed to one old readers cannot promote from.
    ("task.avsc", lambda s: next(f for f in s["fields"] if f["name"] == "group_size")
     .update(type="string", default="4"), "forward"),
])
def test_schemas_check_fails_on_an_incompatible_change(
        tmp_path: Path, capsys: pytest.CaptureFixture, file: str, change, expect: str) -> None:
    copy = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    raw = json.loads((copy / file).read_text())
    change(raw)
    (copy / file).write_text(json.dumps(raw))
    assert cli(["schemas", "check", "--schemas", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "INCOMPATIBLE" in out and f"not {expect}" in out


def test_export_writes_self_contained_schemas_any_avro_library_reads(tmp_path: Path) -> None:
    assert cli(["schemas", "export", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "fingerprints.json").read_text())
    assert set(table["fingerprints"]) == {f"rollstream.{r}" for r in schemas.TOP_LEVEL}
    for full, fp in table["fingerprints"].items():
        alone = avro.schema.parse((tmp_path / f"{full}.avsc").read_text())  # no other file
        assert alone.fingerprint().hex() == fp
        doc = json.dumps(json.loads((tmp_path / f"{full}.avsc").read_text()))
        if full.endswith("Trajectory"):
            assert "int32 LE" in doc and "float32 LE" in doc
    for file, fp in table["retired"].items():
        assert avro.schema.parse((tmp_path / file).read_text()).fingerprint().hex() == fp
    for fp, legacy in table["legacy"].items():
        assert legacy["schema"] in table["retired"], fp
