"""Compare semantic versions."""


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version a is lower than, equal to or higher than b."""
    left, right = a.split("."), b.split(".")
    return (left > right) - (left < right)
