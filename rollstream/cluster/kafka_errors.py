"""What a Kafka error means to the person running Rollstream: one line naming the cause and
the address, and an exit code (sysexits(3), documented in docs/security.md).

One-shot commands check the broker first (`check_broker`, bounded by `--timeout`) and end with
that line; long-running processes ride out an unreachable broker (logged every few seconds)
but stop on a refused login or authorization (`AccessDenied`, exit 77): retrying cannot mend
credentials or ACLs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

log = logging.getLogger("rollstream.cluster.kafka")

EX_UNAVAILABLE = 69  # no broker answered
EX_NOPERM = 77  # authentication, TLS trust or authorization refused
EX_CONFIG = 78  # nothing names a broker, or the pipeline's topics are missing

_AUTHENTICATION = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                             KafkaError._SSL})
_AUTHORIZATION = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
}
_UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                          KafkaError._RESOLVE, KafkaError._TIMED_OUT})
REFUSED_S = 3.0  # how long a one-shot command waits on an address that refuses connections
_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


class KafkaProblem(Exception):
    """A Kafka failure a command reports as one line and an exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class AccessDenied(SystemExit):
    """A long-running process's credentials or rights were refused: it stops (exit 77). A
    SystemExit, so no handler that retries ordinary errors holds it back."""

    def __init__(self, message: str) -> None:
        super().__init__(EX_NOPERM)
        self.message = message


def problem(err: KafkaError, bootstrap: str, resource: str = "") -> KafkaProblem:
    """The line and exit code for `err`, met talking to `bootstrap` (about `resource`)."""
    code, text = err.code(), err.str()
    about = f" ({resource})" if resource else ""
    if code == KafkaError._SSL:
        return KafkaProblem(f"TLS with the Kafka broker at {bootstrap} failed: {text} (check "
                            "ssl.ca.location and the client certificate)", EX_NOPERM)
    if code in _AUTHENTICATION:
        return KafkaProblem(f"authentication to the Kafka broker at {bootstrap} failed: {text}",
                            EX_NOPERM)
    if code in _AUTHORIZATION:
        return KafkaProblem(f"not authorized on the Kafka broker at {bootstrap}: "
                            f"{_AUTHORIZATION[code]} access refused{about}: {text}", EX_NOPERM)
    if code in _UNREACHABLE:
        return KafkaProblem(f"cannot reach the Kafka broker at {bootstrap}: {text}",
                            EX_UNAVAILABLE)
    if code in _MISSING:
        return KafkaProblem(f"missing on the Kafka broker at {bootstrap}{about}: {text}; "
                            "`rollstream topics create` makes the pipeline's topics", EX_CONFIG)
    return KafkaProblem(f"Kafka error at {bootstrap}{about}: {err.name()}: {text}", 1)


def denied(err: KafkaError) -> bool:
    return err.code() in _AUTHENTICATION or err.code() in _AUTHORIZATION


def raise_if_denied(err: KafkaError, bootstrap: str, resource: str = "") -> None:
    """In a long-running process: stop on a refusal, which no retry can mend."""
    if denied(err):
        raise AccessDenied(problem(err, bootstrap, resource).args[0])


class ErrorWatch:
    """A client's `error_cb`: keeps the most telling error seen, logs an unreachable broker at
    most every `every_s`, and (with `stop_on_denied`) stops on a refused login."""

    def __init__(self, bootstrap: str, stop_on_denied: bool = False,
                 every_s: float | None = 5.0) -> None:
        self.bootstrap = bootstrap
        self.stop_on_denied = stop_on_denied
        self.every_s = every_s
        self.worst: KafkaError | None = None
        self._logged = 0.0

    def __call__(self, err: KafkaError) -> None:
        if self.worst is None or denied(err) or not denied(self.worst):
            self.worst = err
        if denied(err) and self.stop_on_denied:
            raise_if_denied(err, self.bootstrap)
        now = time.monotonic()
        if (err.code() in _UNREACHABLE and self.every_s is not None
                and now - self._logged >= self.every_s):
            self._logged = now
            log.warning("Kafka broker at %s unreachable (%s); retrying", self.bootstrap,
                        err.str())


def check_broker(conf: dict[str, Any], timeout_s: float, topics: tuple[str, ...] = ()) -> None:
    """Raise KafkaProblem unless the broker in `conf` answers within `timeout_s` with this
    client's credentials and shows `topics` to it."""
    from confluent_kafka.admin import AdminClient

    bootstrap = conf.get("bootstrap.servers", "")
    watch = ErrorWatch(bootstrap, every_s=None)  # the command's one line says it
    # librdkafka logs every failed connection itself; the one line below says it all.
    admin = AdminClient({**conf, "error_cb": watch, "log_level": 0})
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        try:
            admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            break
        except KafkaException as exc:
            admin.poll(0.1)  # serves error_cb: the cause (a refused login) arrives there
            if watch.worst is not None and denied(watch.worst):
                raise problem(watch.worst, bootstrap) from None
            # Nothing listens at the address: said at once rather than after the whole
            # timeout, once a broker restarting there had time to open its port again.
            refused = watch.worst is not None and "Connection refused" in watch.worst.str()
            if time.monotonic() >= (min(deadline, start + REFUSED_S) if refused else deadline):
                raise problem(watch.worst or exc.args[0], bootstrap) from None
    for name in topics:  # asked by name: a refusal then says so, where a listing omits it
        found = admin.list_topics(name, timeout=max(1.0, deadline - time.monotonic())
                                  ).topics.get(name)
        if found is not None and found.error is not None:
            raise problem(found.error, bootstrap, f"topic {name}")
