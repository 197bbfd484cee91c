"""An OAuth identity provider for tests of OAUTHBEARER: a JWKS endpoint and a client-credentials token endpoint.

A real HTTP server on a free port of 127.0.0.1, serving ``GET /jwks`` (the
public half of every key added) and ``POST /token`` (RFC 6749's client
credentials grant with HTTP Basic, for Kafka's OAuthBearerLoginCallbackHandler),
and signing tokens with its keys. Use it as a context manager::

    with IdentityProvider(client_secrets={"app": "s3cret"}) as idp:
        idp.add_key("k1")
        broker_config["sasl.oauthbearer.jwks.endpoint.url"] = idp.url
        token = idp.token("k1", sub="alice")
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = ["IdentityProvider"]

#: The claims every token gets unless the call overrides them.
DEFAULT_AUDIENCE, DEFAULT_ISSUER = "josef", "https://idp.test"


class IdentityProvider:
    """Keys, tokens signed with them, and the HTTP endpoints that publish the keys and issue tokens."""

    def __init__(self, client_secrets: Mapping[str, str] | None = None, lifetime_s: int = 300) -> None:
        self.keys: dict[str, tuple[Any, str]] = {}
        self.client_secrets = dict(client_secrets or {})
        self.lifetime_s = lifetime_s
        #: How often the JWKS was fetched and tokens issued (a broker must not fetch per authentication).
        self.fetches = 0
        self.tokens_issued = 0
        self._changed = threading.Condition()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url, self.token_url = f"{base}/jwks", f"{base}/token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> IdentityProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def add_key(self, kid: str, alg: str = "RS256") -> Any:
        """A new signing key (RSA for RS*, P-256 for ES*), published at once."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if alg.startswith("RS") \
            else ec.generate_private_key(ec.SECP256R1())
        self.keys[kid] = (key, alg)
        return key

    def token(self, kid: str, **claims: Any) -> str:
        """A token signed with key ``kid``: ``sub`` alice, ``aud``, ``iss``, ``iat`` and ``exp`` unless given."""
        key, alg = self.keys[kid]
        now = int(time.time())
        payload = {"sub": "alice", "iat": now, "exp": now + self.lifetime_s, "aud": DEFAULT_AUDIENCE,
                   "iss": DEFAULT_ISSUER, **claims}
        return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})

    def jwks(self) -> dict[str, Any]:
        return {"keys": [jwt.algorithms.get_default_algorithms()[alg].to_jwk(key.public_key(), as_dict=True)
                         | {"kid": kid, "alg": alg, "use": "sig"} for kid, (key, alg) in self.keys.items()]}

    def wait_for_fetches(self, count: int, timeout: float = 30) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.fetches >= count, timeout=timeout), self.fetches

    def _count(self, what: str) -> None:
        with self._changed:
            setattr(self, what, getattr(self, what) + 1)
            self._changed.notify_all()


def _handler(provider: IdentityProvider) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _json(self, status: int, value: Any) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._json(200, provider.jwks())
            provider._count("fetches")

        def do_POST(self) -> None:  # noqa: N802
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            user, _, secret = base64.b64decode(self.headers.get("Authorization", "Basic ")[6:]).decode().partition(":")
            if form.get("grant_type") != ["client_credentials"] or provider.client_secrets.get(user) != secret:
                self._json(401, {"error": "invalid_client"})
                return
            provider._count("tokens_issued")
            kid = next(iter(provider.keys))
            self._json(200, {"access_token": provider.token(kid, sub=user), "token_type": "Bearer",
                             "expires_in": provider.lifetime_s})

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
