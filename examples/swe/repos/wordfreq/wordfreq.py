"""Word frequencies."""

from collections import Counter


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    """The n most common words, ignoring case and punctuation."""
    return Counter(text.split()).most_common(n)
