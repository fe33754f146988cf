"""What a consume loop produces, and the errors that send an input to the dead-letter topic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class InvalidEvent(ValueError):
    """A decodable event this stage cannot accept; it goes to the dead-letter topic."""


class OutputTooLarge(InvalidEvent):
    """An output over its topic's size limit: its input goes to the dead-letter topic."""


@dataclass(slots=True)
class Output:
    """One record to produce: an event (a TypedDict of rollstream.contracts.events) encoded as
    `record`, bytes sent as they are (a stage that forwards events unchanged), or None, a
    tombstone (compacted topics)."""

    topic: str
    key: str | bytes
    record: str | None
    value: Mapping[str, Any] | bytes | None
    partition: int | None = None
