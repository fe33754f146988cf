"""Calendar helpers."""

from datetime import date, timedelta


def days_between(start: date, end: date) -> list[date]:
    """Every day from start to end, both included."""
    return [start + timedelta(days=i) for i in range((end - start).days)]
