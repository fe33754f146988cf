"""Identifier case conversion."""

import re


def to_snake(name: str) -> str:
    """CamelCase -> snake_case."""
    return re.sub(r"([A-Z])", r"_\1", name).lower().lstrip("_")
