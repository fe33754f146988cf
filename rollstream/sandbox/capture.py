"""Bounded capture of command output: keep the head and the tail, count what was dropped.

A sandboxed command may print without end (`yes`, a 100 MB log); the reader must neither hold it
all in memory nor stop reading (a full pipe would block the command until its timeout). So the
capture keeps the first and last `limit // 2` bytes and only counts the middle.
"""

from __future__ import annotations


class HeadTail:
    """Streaming head+tail buffer of at most `limit` bytes."""

    def __init__(self, limit: int) -> None:
        if limit < 2:
            raise ValueError(f"output limit must be at least 2 bytes, got {limit}")
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def value(self, marker: bytes | None = None) -> bytes:
        """The kept bytes; where bytes were dropped, `marker` (default: a count) joins the two."""
        if not self.dropped:
            return bytes(self.head + self.tail)
        if marker is None:
            marker = f"\n[... {self.dropped} bytes of output omitted ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


def head_tail_text(text: str, limit: int) -> str:
    """`text` cut to at most about `limit` characters: its head and tail around a note saying
    how many characters were left out (what mini-swe-agent and OpenHands show a model)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    omitted = len(text) - 2 * half
    return f"{text[:half]}\n[... {omitted} characters omitted ...]\n{text[len(text) - half:]}"
