"""URL slugs."""

import re


def slugify(title: str) -> str:
    """Lowercase words joined by single dashes."""
    return re.sub(r"[^a-z0-9]", "-", title.lower())
