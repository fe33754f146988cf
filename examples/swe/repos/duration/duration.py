"""Parse durations such as "1h30m" or "45s"."""

import re

UNITS = {"h": 3600, "m": 60, "s": 1}


def parse_seconds(text: str) -> int:
    match = re.fullmatch(r"(\d+)([hms])", text.strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    return int(match.group(1)) * UNITS[match.group(2)]
