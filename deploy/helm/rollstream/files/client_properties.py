"""Write the Kafka client properties file of a Rollstream pod (the chart's kafka-config init
container): the SASL settings and the CA's path from this container's environment, the
password included, then the release's own kafka.clientProperties over them.

    python client_properties.py BASE OUT

The environment variables come from the chart: KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM,
KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD (from the KafkaUser's Secret or the user's own),
KAFKA_SSL_CA_LOCATION (the mounted cluster CA). OUT is written owner-only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import javaproperties

# Environment variable -> librdkafka property, the first four required.
PROPERTIES = {
    "KAFKA_SECURITY_PROTOCOL": "security.protocol",
    "KAFKA_SASL_MECHANISM": "sasl.mechanism",
    "KAFKA_SASL_USERNAME": "sasl.username",
    "KAFKA_SASL_PASSWORD": "sasl.password",
    "KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
}
REQUIRED = tuple(PROPERTIES)[:4]


def properties(environ: dict[str, str], base: Path) -> dict[str, str]:
    missing = [name for name in REQUIRED if not environ.get(name)]
    if missing:
        raise SystemExit(f"client_properties: {', '.join(missing)} not set or empty")
    out = {prop: environ[name] for name, prop in PROPERTIES.items() if environ.get(name)}
    with base.open(encoding="utf-8") as fh:
        out.update(javaproperties.load(fh))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: client_properties.py BASE OUT")
    base, out = Path(argv[0]), Path(argv[1])
    props = properties(dict(os.environ), base)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        javaproperties.dump(props, fh, timestamp=False)
    print(f"client_properties: wrote {out} ({', '.join(sorted(props))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
