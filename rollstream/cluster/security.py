"""The Kafka client properties (librdkafka's names) for the one client that does not take them:
faust-streaming's aiokafka, which runs `rollstream stats`. OAUTHBEARER maps where librdkafka
fetches the tokens itself (`sasl.oauthbearer.method=oidc`, rollstream/cluster/oidc.py)."""

from __future__ import annotations

import ssl
from typing import Any

AIOKAFKA_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class UnsupportedSecurity(ValueError):
    """A client property that faust-streaming's client cannot honour."""


def ssl_context(props: dict[str, str]) -> ssl.SSLContext:
    """The TLS settings librdkafka takes (CA, client certificate and key, hostname check)."""
    context = ssl.create_default_context(cafile=props.get("ssl.ca.location"))
    if props.get("ssl.certificate.location"):
        context.load_cert_chain(props["ssl.certificate.location"],
                                props.get("ssl.key.location"), props.get("ssl.key.password"))
    if props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    return context


def faust_credentials(props: dict[str, str]) -> Any:
    """faust's `broker_credentials` for librdkafka-style client properties (None: plaintext)."""
    from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials

    protocol = props.get("security.protocol", "plaintext").lower()
    if protocol == "plaintext":
        return None
    if protocol == "ssl":
        return SSLCredentials(ssl_context(props))
    if protocol not in ("sasl_plaintext", "sasl_ssl"):
        raise UnsupportedSecurity(f"security.protocol={protocol!r} is not a Kafka protocol")
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "GSSAPI")).upper()
    tls = ssl_context(props) if protocol == "sasl_ssl" else None
    if mechanism == "OAUTHBEARER" and props.get("sasl.oauthbearer.method", "").lower() == "oidc":
        from rollstream.cluster.oidc import OidcTokenProvider

        return OAuthCredentials(oauth_cb=OidcTokenProvider(props), ssl_context=tls)
    if mechanism not in AIOKAFKA_MECHANISMS:
        raise UnsupportedSecurity(
            f"`rollstream stats` supports sasl.mechanism {', '.join(AIOKAFKA_MECHANISMS)} and "
            f"OAUTHBEARER with sasl.oauthbearer.method=oidc, not {mechanism} as given: faust's "
            "client takes no Kerberos settings nor unsigned tokens (docs/security.md)")
    return SASLCredentials(
        username=props.get("sasl.username"), password=props.get("sasl.password"),
        mechanism=mechanism, ssl_context=tls)
