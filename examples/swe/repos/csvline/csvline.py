"""Parse one line of comma-separated values."""


def split_fields(line: str) -> list[str]:
    """The fields of a CSV line; double quotes protect commas inside a field."""
    return [field.strip('"') for field in line.split(",")]
