"""Dead letters, the size check every output passes before it is produced, and poison inputs.

An output is encoded and checked against its topic's max.message.bytes before anything is
produced, so one the client would refuse dead-letters its input instead of failing the
transaction. A record the broker alone refuses (a topic configured smaller than declared) fails
its transaction once; `Poison` remembers which input it came from, and when that input comes
again it is dead-lettered. A dead letter too large for its topic keeps its coordinates and
reason, its original bytes cut and marked so.
"""

from __future__ import annotations

import time

from confluent_kafka import Message

from rollstream.cluster.topics import record_limits
from rollstream.cluster.transaction import Transaction
from rollstream.config import Settings, Topics
from rollstream.consume.records import Output, OutputTooLarge
from rollstream.contracts.codec import Codec
from rollstream.contracts.events import DEAD_LETTER

DEAD_LETTER_ROOM = 64 * 1024  # bytes kept free in a dead letter for everything but key and value


def dead_letter(topics: Topics, stage: str, msg: Message, reason: str,
                limit: int | None = None) -> Output:
    """The dead-letter record for an input event: reason, coordinates and the original bytes.

    With `limit` (the dead-letter topic's record limit), key and value are cut so the record
    fits, and `truncated_from` says how many bytes they had: never dropped for its size."""
    key, value = msg.key() or b"", msg.value()
    if isinstance(key, str):
        key = key.encode()
    size = len(key) + len(value or b"")
    truncated_from = None
    # The key travels twice: as the record's key and in its field.
    if limit is not None and size + len(key) > limit - DEAD_LETTER_ROOM:
        truncated_from = size
        room = max(limit - DEAD_LETTER_ROOM, 0)
        key = key[: min(len(key), room // 4)]
        value = None if value is None else value[: room - 2 * len(key)]
        reason = f"{reason} [key and value truncated from {size} bytes]"
    return Output(topics.dlq, key, DEAD_LETTER, {
        "stage": stage,
        "reason": reason,
        "source_topic": msg.topic(),
        "source_partition": msg.partition(),
        "source_offset": msg.offset(),
        "key": key,
        "value": value,
        "failed_at_ms": int(time.time() * 1000),
        "truncated_from": truncated_from,
    })


class Encoder:
    """Encodes outputs, checked against their topics' record limits."""

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.codec = codec
        self.limits = record_limits(settings.topics)
        self.dlq_limit = self.limits.get(settings.topics.dlq)

    def encode(self, out: Output) -> bytes | None:
        """The output's bytes; raises OutputTooLarge over its topic's limit."""
        value = out.value
        if value is not None and not isinstance(value, bytes):  # an event
            if out.record is None:
                raise ValueError(f"an output to {out.topic} holds an event but names no record")
            value = self.codec.encode(out.record, value)
        limit = self.limits.get(out.topic)
        if limit is not None and value is not None and len(value) > limit // 4:  # cheap first
            key = out.key.encode() if isinstance(out.key, str) else out.key
            if len(value) + len(key) > limit:
                raise OutputTooLarge(
                    f"{out.record or 'a record'} for {out.topic} would be "
                    f"{len(value) + len(key)} bytes, over that topic's limit of {limit}")
        return value


class Poison:
    """Inputs whose output the broker refused: when they come again they are dead-lettered.

    Which input each output came from is kept only while the transaction is `tracking` (redoing
    a transaction that a refused record failed): outside that, a Python call per record for
    nothing."""

    def __init__(self, transaction: Transaction) -> None:
        self.transaction = transaction
        self._sources: dict[tuple[str, str | bytes], tuple[int, int]] = {}
        self._poison: dict[tuple[int, int], str] = {}

    def produced_for(self, msg: Message, outputs: list[Output]) -> None:
        if self.transaction.tracking:
            source = (msg.partition(), msg.offset())
            self._sources.update(((out.topic, out.key), source) for out in outputs)

    def clear_sources(self) -> None:
        self._sources.clear()

    def note_refused(self) -> None:
        """After a failed transaction: the inputs whose output the broker refused are poison."""
        for topic, key, err in self.transaction.refused:
            source = self._sources.get((topic, key)) if key is not None else None
            if source is None and key is not None:
                source = self._sources.get((topic, key.decode(errors="replace")))
            if source is not None:
                self._poison[source] = f"output cannot be produced: {topic}: {err.str()}"
        self.transaction.refused.clear()
        self._sources.clear()

    def reason(self, msg: Message) -> str | None:
        """Why this input is poison, once (it is then dead-lettered); None when it is not."""
        if not self._poison:
            return None
        return self._poison.pop((msg.partition(), msg.offset()), None)
