"""OAUTHBEARER for `rollstream stats` (faust's client): librdkafka's OIDC properties become a
token provider that exchanges the client credentials at the token endpoint, as librdkafka does,
here against a real HTTP endpoint on loopback. (No broker: the bundled one has no identity
provider to check such tokens; docs/security.md.)"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollstream.cluster.oidc import OidcError, OidcTokenProvider
from rollstream.cluster.security import faust_credentials

CLIENT, SECRET = "fleet", "hush-7f3a"


class TokenEndpoint(BaseHTTPRequestHandler):
    requests: list[dict[str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        form = dict(urllib.parse.parse_qsl(self.rfile.read(
            int(self.headers["Content-Length"])).decode()))
        self.requests.append(form)
        expected = "Basic " + base64.b64encode(f"{CLIENT}:{SECRET}".encode()).decode()
        ok = self.headers["Authorization"] == expected
        body = json.dumps({"access_token": f"tok-{len(self.requests)}", "expires_in": 3600}
                          if ok else {"error": "invalid_client"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    TokenEndpoint.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), TokenEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token"
    finally:
        server.shutdown()
        server.server_close()


def oidc_props(url: str, secret: str = SECRET) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": CLIENT,
            "sasl.oauthbearer.client.secret": secret, "sasl.oauthbearer.token.endpoint.url": url,
            "sasl.oauthbearer.scope": "kafka", "sasl.oauthbearer.extensions": "logicalCluster=lc-1"}


def test_client_credentials_become_a_token_reused_until_renewal(endpoint: str) -> None:
    from faust.auth import OAuthCredentials

    creds = faust_credentials(oidc_props(endpoint))
    assert isinstance(creds, OAuthCredentials) and creds.ssl_context is None
    provider = creds.oauth_cb
    assert asyncio.run(provider.token()) == "tok-1"
    assert asyncio.run(provider.token()) == "tok-1"  # one exchange for a fresh token
    assert TokenEndpoint.requests == [{"grant_type": "client_credentials", "scope": "kafka"}]
    assert provider.extensions() == {"logicalCluster": "lc-1"}
    assert SECRET not in repr(creds) + repr(provider)


def test_refused_credentials_name_the_endpoint_not_the_secret(endpoint: str) -> None:
    provider = OidcTokenProvider(oidc_props(endpoint, secret="wrong-secret"))
    with pytest.raises(OidcError, match="refused the client credentials: HTTP 401") as caught:
        asyncio.run(provider.token())
    assert endpoint in str(caught.value) and "wrong-secret" not in str(caught.value)


def test_missing_oidc_properties_are_named() -> None:
    props = oidc_props("http://127.0.0.1:1/token")
    del props["sasl.oauthbearer.client.secret"]
    with pytest.raises(ValueError, match="needs sasl.oauthbearer.client.secret"):
        faust_credentials(props)
