"""OAUTHBEARER for faust-streaming's aiokafka client, which takes a token-provider object where
librdkafka fetches tokens itself: the same OIDC client-credentials exchange as librdkafka's
`sasl.oauthbearer.method=oidc`, from the same properties."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from aiokafka.abc import AbstractTokenProvider

# librdkafka renews a token at 80% of its lifetime; a token endpoint that names no lifetime
# gets a short one assumed.
RENEW_AT = 0.8
DEFAULT_LIFETIME_S = 300.0
TIMEOUT_S = 30.0


class OidcError(RuntimeError):
    """The token endpoint refused or failed the exchange."""


class OidcTokenProvider(AbstractTokenProvider):
    """Client-credentials tokens from `sasl.oauthbearer.token.endpoint.url`, reused until 80% of
    their lifetime has passed."""

    def __init__(self, props: dict[str, str]) -> None:
        missing = [k for k in ("sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
                               "sasl.oauthbearer.token.endpoint.url") if not props.get(k)]
        if missing:
            raise ValueError(f"sasl.oauthbearer.method=oidc needs {', '.join(missing)}")
        self.endpoint = props["sasl.oauthbearer.token.endpoint.url"]
        self._client = (props["sasl.oauthbearer.client.id"],
                        props["sasl.oauthbearer.client.secret"])
        self._scope = props.get("sasl.oauthbearer.scope", "")
        self._extensions = dict(pair.split("=", 1) for pair in
                                props.get("sasl.oauthbearer.extensions", "").split(",") if pair)
        self._tls = ssl.create_default_context(cafile=props.get("https.ca.location"))
        self._token = ""
        self._renew_at = 0.0

    def __repr__(self) -> str:  # the client secret stays out of every log line
        return f"<OidcTokenProvider {self.endpoint}>"

    async def token(self) -> str:
        if time.monotonic() >= self._renew_at:
            self._token, lifetime = await asyncio.to_thread(self._fetch)
            self._renew_at = time.monotonic() + RENEW_AT * lifetime
        return self._token

    def extensions(self) -> dict[str, str]:
        return self._extensions

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self._scope}
                                                       if self._scope else {})}
        basic = base64.b64encode(":".join(self._client).encode()).decode()
        request = urllib.request.Request(
            self.endpoint, data=urllib.parse.urlencode(form).encode(), method="POST",
            headers={"Authorization": f"Basic {basic}",
                     "Content-Type": "application/x-www-form-urlencoded",
                     "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S,
                                        context=self._tls) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise OidcError(f"the token endpoint {self.endpoint} refused the client "
                            f"credentials: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise OidcError(f"no token from {self.endpoint}: {exc}") from None
        if not isinstance(body, dict) or not body.get("access_token"):
            raise OidcError(f"the token endpoint {self.endpoint} answered without an "
                            "access_token")
        return str(body["access_token"]), float(body.get("expires_in") or DEFAULT_LIFETIME_S)
