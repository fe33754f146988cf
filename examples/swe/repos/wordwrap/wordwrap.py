"""Greedy word wrapping."""


def wrap(text: str, width: int) -> list[str]:
    """Split text into lines of at most `width` characters, breaking between words."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}" if current else word
        if len(candidate) <= width:
            current = candidate
        else:
            lines.append(current)
            current = word
    return lines
