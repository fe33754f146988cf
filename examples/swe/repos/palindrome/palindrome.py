"""Palindromes."""


def is_palindrome(text: str) -> bool:
    """True if text reads the same backwards, ignoring case, spaces and punctuation."""
    return text == text[::-1]
