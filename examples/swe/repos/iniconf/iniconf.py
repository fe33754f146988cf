"""Read `key = value` settings."""


def parse(text: str) -> dict[str, str]:
    """Settings from lines `key = value`; blank lines and lines starting with # are skipped."""
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split("=")
        settings[parts[0].strip()] = parts[1].strip()
    return settings
