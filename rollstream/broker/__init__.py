"""The bundled single-node Kafka broker, for laptops and CI without Docker (see local.py)."""

from rollstream.broker.local import (
    BrokerError,
    is_running,
    resolve_bootstrap,
    start,
    status,
    stop,
    with_broker,
)

__all__ = ["BrokerError", "is_running", "resolve_bootstrap", "start", "status", "stop",
           "with_broker"]
