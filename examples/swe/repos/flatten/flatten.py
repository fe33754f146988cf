"""Flatten nested lists."""


def flatten(items: list) -> list:
    """All leaves of arbitrarily nested lists and tuples, in order."""
    out: list = []
    for item in items:
        if hasattr(item, "__iter__"):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
