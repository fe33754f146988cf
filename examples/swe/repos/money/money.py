"""Format amounts of money held in cents."""


def format_cents(cents: int) -> str:
    """e.g. 123456 -> "$1,234.56"."""
    dollars, rest = divmod(cents, 100)
    return f"${dollars:,}.{rest:02d}"
