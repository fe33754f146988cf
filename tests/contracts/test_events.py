"""rollstream/contracts/events.py's TypedDicts and record names against the .avsc files they
mirror."""

from __future__ import annotations

import typing

import schemas
from rollstream.contracts import events

PRIMITIVES = {"string": "str", "int": "int", "long": "int", "double": "float", "float": "float",
              "boolean": "bool", "bytes": "bytes"}


def annotation(avro: object, enums: dict[str, list[str]]) -> str:
    """The Python annotation (as written in events.py) of an Avro type."""
    if isinstance(avro, list):
        branches = [annotation(t, enums) for t in avro if t != "null"]
        return " | ".join(branches + (["None"] if "null" in avro else []))
    if isinstance(avro, dict):
        if avro["type"] == "enum":
            enums[avro["name"]] = avro["symbols"]
            return avro["name"]
        if avro["type"] == "map":
            return f"dict[str, {annotation(avro['values'], enums)}]"
        if avro["type"] == "array":
            return f"list[{annotation(avro['items'], enums)}]"
        return annotation(avro["type"], enums)
    assert isinstance(avro, str)
    return PRIMITIVES.get(avro, avro.removeprefix("rollstream."))


def test_every_record_has_a_typed_dict_with_the_schemas_fields() -> None:
    enums: dict[str, list[str]] = {}
    for name, schema in schemas.raw_schemas().items():
        typed = getattr(events, name)
        assert typing.is_typeddict(typed), name
        expected = [(f["name"], annotation(f["type"], enums)) for f in schema["fields"]]
        # Annotations are strings (postponed evaluation), which TypedDict wraps in ForwardRef.
        actual = [(k, getattr(v, "__forward_arg__", v)) for k, v in typed.__annotations__.items()]
        assert actual == expected, name
    for name, symbols in enums.items():
        assert list(typing.get_args(getattr(events, name))) == symbols, name


def test_record_name_constants_name_every_schema() -> None:
    constants = {v for k, v in vars(events).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(schemas.raw_schemas())
