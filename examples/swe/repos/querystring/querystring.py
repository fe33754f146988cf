"""Build URL query strings."""


def build_query(params: dict[str, str]) -> str:
    """`a=1&b=2`, keys in the given order, values URL-encoded."""
    return "&".join(f"{key}={value}" for key, value in params.items())
