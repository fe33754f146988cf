"""Run-length encoding: "aaab" <-> "3a1b"."""

import re


def encode(text: str) -> str:
    return "".join(f"{len(m.group(0))}{m.group(1)}" for m in re.finditer(r"(.)\1*", text))


def decode(encoded: str) -> str:
    return "".join(int(count) * ch for count, ch in re.findall(r"(\d)(\D)", encoded))
