"""Split sequences into fixed-size pieces."""


def chunked(items: list, size: int) -> list[list]:
    """Consecutive pieces of `size` items; the last one may be shorter."""
    return [items[i:i + size] for i in range(0, len(items) - size + 1, size)]
