"""The client side of SASL: how josef's client, its tools and a broker connecting to other nodes authenticate.

A connection to a SASL listener (``SASL_PLAINTEXT``, ``SASL_SSL``) sends
SaslHandshake (v1) with the mechanism, then SaslAuthenticate (v2) until the
mechanism is done, before any other request, as Kafka's
SaslClientAuthenticator does. The credentials come from Kafka's client keys:
``sasl.mechanism`` and ``sasl.jaas.config`` (``PlainLoginModule`` or
``ScramLoginModule`` with ``username``/``password``), or librdkafka's
``sasl.username``/``sasl.password``. A broker takes its own from
``sasl.mechanism.inter.broker.protocol`` (or ``sasl.mechanism.controller.protocol``)
and the ``username``/``password`` options of the listener's JAAS entry
(:func:`outbound_sasl`), as Kafka's brokers do.

SCRAM (RFC 5802) checks the server too: a broker that cannot prove it knows
the credential (a wrong ``v=`` in the server-final message) is refused.
Passwords never reach a log line, an error message or a repr.

OAUTHBEARER (RFC 7628, KIP-255) sends a bearer token
(:class:`OAuthBearerCredentials`), obtained afresh for every authentication
(and so every KIP-368 re-authentication) in a worker thread, from one of:
Kafka's unsecured login options (``OAuthBearerLoginModule required
unsecuredLoginStringClaim_sub="alice";``, an ``alg: none`` token for brokers
that validate unsecured tokens); a callable of josef's client
(``sasl.oauthbearer.token.provider``) returning the token; or Kafka's
client-credentials flow (``sasl.oauthbearer.token.endpoint.url`` with
``sasl.login.callback.handler.class`` set to OAuthBearerLoginCallbackHandler
and the ``clientId``/``clientSecret``/``scope`` JAAS options), its token
reused until 80 % of its lifetime (Kafka's ``sasl.login.refresh.window.factor``).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import secrets
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Callable, Mapping, Protocol, Union

import attrs
from kio.schema.errors import ErrorCode

from josef.config import ConfigError
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError
from josef.protocol.jaas import parse_jaas
from josef.protocol.tls import listener_security_protocol
from josef.scram import BY_NAME as SCRAM_ALGORITHMS
from josef.scram import ScramAlgorithm, client_key, salted_password

#: The mechanisms that authenticate with a user name and a password (:class:`SaslCredentials`).
PASSWORD_MECHANISMS = ("PLAIN", *SCRAM_ALGORITHMS)
#: The mechanisms josef can authenticate with.
MECHANISMS = (*PASSWORD_MECHANISMS, "OAUTHBEARER")
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
#: Kafka's login callback handler of the client-credentials flow (and its name before Kafka 3.4).
OAUTHBEARER_LOGIN_HANDLERS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
                              "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler")
#: A callable giving a bearer token (a JWT's compact serialization); it may block: it is called in a worker thread.
TokenProvider = Callable[[], str]
Lookup = Callable[[str], Any]


class SaslAuthenticationFailed(KafkaError):
    """The broker refused the credentials (or the mechanism); the message is the broker's, which names no secret."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)

    @property
    def retriable(self) -> bool:
        return False


@attrs.frozen(repr=False)
class SaslCredentials:
    """A mechanism, a user name and a password."""

    mechanism: str
    username: str
    password: str
    #: SCRAM with a delegation token (Kafka's ScramLoginModule ``tokenauth="true"``): the user name is the token id,
    #: the password its HMAC (base64), and the client-first message carries the ``tokenauth=true`` extension.
    token_auth: bool = False

    def __repr__(self) -> str:
        return f"SaslCredentials({self.mechanism}, {self.username!r}{', tokenauth' if self.token_auth else ''})"

    @classmethod
    def from_client_config(cls, get: Lookup, where: str = "client") -> SaslCredentials:
        """From Kafka's client keys (``sasl.mechanism``, ``sasl.jaas.config``) or librdkafka's user name and password."""
        mechanism = (get("sasl.mechanism") or "GSSAPI").upper()
        if mechanism not in PASSWORD_MECHANISMS:
            raise ConfigError(f"{where}: sasl.mechanism {mechanism} is not supported; josef offers {', '.join(MECHANISMS)}")
        jaas = get("sasl.jaas.config")
        token_auth = False
        if jaas:
            _, options = parse_jaas(str(jaas), f"{where}: sasl.jaas.config")
            username, password = options.get("username"), options.get("password")
            token_auth = mechanism in SCRAM_ALGORITHMS and options.get("tokenauth", "").lower() == "true"
        else:
            username, password = get("sasl.username"), get("sasl.password")
        if not username or password is None:
            raise ConfigError(f"{where}: SASL needs a user name and password: sasl.jaas.config with username and "
                              f"password options, or sasl.username and sasl.password")
        return cls(mechanism, str(username), str(password), token_auth)

    def exchange(self) -> SaslExchange:
        if self.mechanism == "PLAIN":
            return _Plain(self)
        return _Scram(self, SCRAM_ALGORITHMS[self.mechanism])


def _unsecured_token(options: Mapping[str, str], where: str) -> str:
    """An ``alg: none`` JWT from Kafka's OAuthBearerUnsecuredLoginCallbackHandler options: the
    ``unsecuredLogin{String,Number,List}Claim_<name>`` claims, ``iat`` now, ``exp`` after
    ``unsecuredLoginLifetimeSeconds`` (3600); the principal claim (``unsecuredLoginPrincipalClaimName``, sub) must
    be there."""
    claims: dict[str, Any] = {}
    for key, value in options.items():
        for prefix, convert in (("unsecuredLoginStringClaim_", str), ("unsecuredLoginNumberClaim_", float),
                                ("unsecuredLoginListClaim_", lambda v: [e for e in v[1:].split(v[0]) if e] if v else [])):
            if key.startswith(prefix) and len(key) > len(prefix):
                name = key[len(prefix):]
                if name in ("iat", "exp"):
                    raise ConfigError(f"{where}: sasl.jaas.config: the {name} claim is set by the login module")
                try:
                    claims[name] = convert(value)
                except ValueError:
                    raise ConfigError(f"{where}: sasl.jaas.config: {key} is not a number") from None
    principal_claim = options.get("unsecuredLoginPrincipalClaimName", "").strip() or "sub"
    if not str(claims.get(principal_claim, "")).strip():
        raise ConfigError(f"{where}: OAUTHBEARER needs a token: unsecuredLoginStringClaim_{principal_claim} in "
                          f"sasl.jaas.config, sasl.oauthbearer.token.provider, or sasl.oauthbearer.token.endpoint.url")
    try:
        lifetime = int(options.get("unsecuredLoginLifetimeSeconds", "3600"))
    except ValueError:
        raise ConfigError(f"{where}: sasl.jaas.config: unsecuredLoginLifetimeSeconds is not an integer") from None
    now_ms = time.time_ns() // 1_000_000  # iat in whole milliseconds, as Kafka writes it: never after the broker's now
    claims.update(iat=now_ms / 1000, exp=now_ms // 1000 + lifetime)

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none'})}.{part(claims)}."


class ClientCredentialsTokens:
    """Kafka's OAuthBearerLoginCallbackHandler: access tokens of the OAuth client-credentials grant, POSTed for at the
    token endpoint with HTTP Basic authentication (RFC 6749 4.4), reused until 80 % of their lifetime."""

    def __init__(self, url: str, client_id: str, client_secret: str, scope: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.url, self.client_id, self._secret, self.scope, self.timeout_s = url, client_id, client_secret, scope, timeout_s
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0

    def __repr__(self) -> str:
        return f"ClientCredentialsTokens({self.url!r}, {self.client_id!r})"

    def __call__(self) -> str:
        with self._lock:
            now = time.time()
            if self._token is None or now >= self._renew_at:
                self._token, expires_in = self._request()
                self._renew_at = now + 0.8 * expires_in
            return self._token

    def _request(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        basic = base64.b64encode(f"{self.client_id}:{self._secret}".encode()).decode()
        request = urllib.request.Request(self.url, urllib.parse.urlencode(form).encode(), method="POST", headers={
            "Authorization": f"Basic {basic}", "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310
                body = json.loads(answer.read())
        except (OSError, ValueError) as exc:  # the secret is in no part of these messages
            raise SaslAuthenticationFailed(ErrorCode.sasl_authentication_failed,
                                           f"cannot get an access token from {self.url}: {exc}") from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise SaslAuthenticationFailed(ErrorCode.sasl_authentication_failed,
                                           f"the token endpoint {self.url} answered without an access_token")
        expires_in = body.get("expires_in")
        return token, float(expires_in) if isinstance(expires_in, (int, float)) and expires_in > 0 else 3600.0


@attrs.frozen(repr=False)
class OAuthBearerCredentials:
    """OAUTHBEARER: where tokens come from, and the SASL extensions sent with them."""

    #: Called for every authentication, in a worker thread; returns the token.
    token_provider: TokenProvider
    #: ``unsecuredLoginExtension_<key>`` options (Kafka's ``sasl.extensions``): sent as key=value pairs.
    extensions: Mapping[str, str] = attrs.field(factory=dict)
    #: Where the tokens come from, for repr and errors (never a token or a secret).
    source: str = "a token provider"
    mechanism: str = "OAUTHBEARER"

    def __repr__(self) -> str:
        return f"OAuthBearerCredentials({self.source})"

    @classmethod
    def from_client_config(cls, get: Lookup, where: str = "client") -> OAuthBearerCredentials:
        """From josef's ``sasl.oauthbearer.token.provider`` callable, Kafka's client-credentials keys, or Kafka's
        unsecured login options in ``sasl.jaas.config``, in that order."""
        jaas = get("sasl.jaas.config")
        options: dict[str, str] = {}
        if jaas:
            module, options = parse_jaas(str(jaas), f"{where}: sasl.jaas.config")
            if module != OAUTHBEARER_LOGIN_MODULE:
                raise ConfigError(f"{where}: OAUTHBEARER needs {OAUTHBEARER_LOGIN_MODULE} in sasl.jaas.config, "
                                  f"not {module}")
        extensions = {k.removeprefix("unsecuredLoginExtension_"): v for k, v in options.items()
                      if k.startswith("unsecuredLoginExtension_") and k != "unsecuredLoginExtension_"}
        if "auth" in extensions:
            raise ConfigError(f"{where}: sasl.jaas.config: auth cannot be a SASL extension")
        provider = get("sasl.oauthbearer.token.provider")
        if provider is not None:
            if not callable(provider):
                raise ConfigError(f"{where}: sasl.oauthbearer.token.provider must be a callable returning a token")
            return cls(provider, extensions, "sasl.oauthbearer.token.provider")
        url = get("sasl.oauthbearer.token.endpoint.url")
        if url:
            handler = get("sasl.login.callback.handler.class")
            if handler not in OAUTHBEARER_LOGIN_HANDLERS:
                raise ConfigError(f"{where}: sasl.oauthbearer.token.endpoint.url needs sasl.login.callback.handler."
                                  f"class={OAUTHBEARER_LOGIN_HANDLERS[0]}, as Kafka's clients do")
            if not options.get("clientId") or not options.get("clientSecret"):
                raise ConfigError(f"{where}: the client-credentials flow needs the clientId and clientSecret "
                                  f"options of {OAUTHBEARER_LOGIN_MODULE} in sasl.jaas.config")
            tokens = ClientCredentialsTokens(str(url), options["clientId"], options["clientSecret"],
                                             options.get("scope"))
            return cls(tokens, extensions, f"client credentials of {options['clientId']} at {url}")
        _unsecured_token(options, where)  # refuses options that make no token now, not at the first connection
        return cls(lambda: _unsecured_token(options, where), extensions, "an unsecured token")

    def first_message(self, token: str) -> bytes:
        """RFC 7628's client first message, as OAuthBearerClientInitialResponse writes it."""
        extensions = "".join(f"\x01{key}={value}" for key, value in self.extensions.items())
        return f"n,,\x01auth=Bearer {token}{extensions}\x01\x01".encode()


#: What a connection authenticates with.
ClientSasl = Union[SaslCredentials, OAuthBearerCredentials]


def client_sasl(get: Lookup, where: str = "client") -> ClientSasl:
    """The credentials of Kafka's client keys, for any mechanism josef offers."""
    if str(get("sasl.mechanism") or "").upper() == "OAUTHBEARER":
        return OAuthBearerCredentials.from_client_config(get, where)
    return SaslCredentials.from_client_config(get, where)


def outbound_sasl(config: Any, listener: str, mechanism_key: str) -> ClientSasl | None:
    """What a broker or controller authenticates with to ``listener`` of other nodes: None unless the listener is
    SASL (``listener.security.protocol.map``); else ``mechanism_key``'s mechanism
    (``sasl.mechanism.inter.broker.protocol`` or ``sasl.mechanism.controller.protocol``) and the ``username`` and
    ``password`` of the listener's JAAS entry for it, as Kafka's brokers take theirs."""
    if not (listener_security_protocol(config, listener) or "").startswith("SASL_"):
        return None
    mechanism = str(config[mechanism_key]).upper()
    key = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
    where = f"listener {listener} ({mechanism_key}={mechanism})"
    if mechanism not in MECHANISMS:
        raise ConfigError(f"{where}: brokers and controllers cannot authenticate to each other with {mechanism}; "
                          f"set {mechanism_key} to one of {', '.join(MECHANISMS)}")
    jaas = config.unknown.get(key)
    if not jaas:
        raise ConfigError(f"{where}: brokers authenticate to each other with the username and password options of "
                          f"{key}, which is not set")
    return client_sasl({"sasl.mechanism": mechanism, "sasl.jaas.config": jaas}.get, where)


def refused_by_controller(node_id: int, controller_id: int, listener: str, sasl: ClientSasl,
                          exc: SaslAuthenticationFailed) -> ConfigError:
    """What a node stops with when a controller refuses its credentials: they are its configuration, so no retry
    mends them (a voter of the quorum and a broker registering say the same)."""
    who = f" as {sasl.username!r}" if isinstance(sasl, SaslCredentials) else f" with {sasl.source}"
    return ConfigError(f"node {node_id} cannot authenticate to controller {controller_id} on {listener} with "
                       f"{sasl.mechanism}{who}: {exc} (its credentials are the options of "
                       f"listener.name.{listener.lower()}.{sasl.mechanism.lower()}.sasl.jaas.config)")


def unauthorized_by_controller(controller_id: int, sasl: ClientSasl | None) -> ConfigError:
    """What a node stops with when a controller answers its own request CLUSTER_AUTHORIZATION_FAILED: the principal
    it authenticates as may not CLUSTER_ACTION, which is configuration too (fatal, as in Kafka's KafkaRaftClient)."""
    who = f"User:{sasl.username}" if isinstance(sasl, SaslCredentials) else "this node's principal"
    return ConfigError(f"controller {controller_id} answered CLUSTER_AUTHORIZATION_FAILED: {who} may not "
                       f"CLUSTER_ACTION on the cluster (make it a super user or grant it ClusterAction)")


class SaslExchange(Protocol):
    def first(self) -> bytes:
        """The client's first message."""

    def respond(self, challenge: bytes) -> bytes | None:
        """The answer to the server's message; None when the exchange is over (the server is verified)."""


class _OAuthBearer:
    """The client side of OAuthBearerSaslClient: the token, then ``\x01`` to acknowledge an error challenge."""

    def __init__(self, message: bytes) -> None:
        self._message = message

    def first(self) -> bytes:
        return self._message

    def respond(self, challenge: bytes) -> bytes | None:
        # A successful exchange ends with SaslAuthenticate's empty answer; a challenge is the broker's JSON error,
        # acknowledged so that the broker fails the exchange with it as the message.
        return b"\x01" if challenge else None


class _Plain:
    def __init__(self, credentials: SaslCredentials) -> None:
        self.credentials = credentials

    def first(self) -> bytes:
        return b"\x00" + self.credentials.username.encode() + b"\x00" + self.credentials.password.encode()

    def respond(self, challenge: bytes) -> bytes | None:
        return None


class _Scram:
    """RFC 5802's client: client-first, then client-final with the proof, then the server's signature checked."""

    def __init__(self, credentials: SaslCredentials, algorithm: ScramAlgorithm) -> None:
        self.credentials = credentials
        self.algorithm = algorithm
        self.nonce = base64.b64encode(secrets.token_bytes(24)).decode()
        user = credentials.username.replace("=", "=3D").replace(",", "=2C")
        self.client_first_bare = f"n={user},r={self.nonce}" + (",tokenauth=true" if credentials.token_auth else "")
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return ("n,," + self.client_first_bare).encode()

    def respond(self, challenge: bytes) -> bytes | None:
        if self._server_signature is None:
            return self._final(challenge.decode())
        fields = _attributes(challenge.decode())
        if "e" in fields:
            raise SaslAuthenticationFailed(ErrorCode.sasl_authentication_failed, f"SCRAM server error: {fields['e']}")
        if not hmac.compare_digest(base64.b64decode(fields.get("v", "")), self._server_signature):
            raise SaslAuthenticationFailed(ErrorCode.sasl_authentication_failed,
                                           "the broker's SCRAM signature is wrong: it does not know the credential")
        return None

    def _final(self, server_first: str) -> bytes:
        fields = _attributes(server_first)
        nonce, salt, iterations = fields.get("r", ""), fields.get("s"), fields.get("i")
        if not nonce.startswith(self.nonce) or salt is None or iterations is None:
            raise SaslAuthenticationFailed(ErrorCode.sasl_authentication_failed,
                                           "the broker's SCRAM server-first message is invalid")
        a = self.algorithm
        salted = salted_password(a, self.credentials.password, base64.b64decode(salt), int(iterations))
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self.client_first_bare},{server_first},{without_proof}".encode()
        key = client_key(a, salted)
        signature = a.hmac(a.digest(key), auth_message)
        proof = bytes(x ^ y for x, y in zip(key, signature))
        self._server_signature = a.hmac(a.hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def _attributes(message: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in message.split(",") if "=" in part)


async def authenticate(conn: Any, credentials: ClientSasl) -> int:
    """SaslHandshake and SaslAuthenticate on ``conn`` (a :class:`josef.protocol.connection.Connection`, versions
    negotiated); :class:`SaslAuthenticationFailed` with the broker's message when it refuses. Returns the session's
    lifetime in ms (KIP-368; 0: it does not expire)."""
    handshake = await conn.request(ApiKey.SASL_HANDSHAKE, {"mechanism": credentials.mechanism}, version=1)
    if handshake.error_code != ErrorCode.none:
        raise SaslAuthenticationFailed(handshake.error_code,
                                       f"the broker does not offer {credentials.mechanism} (it offers "
                                       f"{', '.join(handshake.mechanisms) or 'nothing'})")
    exchange: SaslExchange
    if isinstance(credentials, OAuthBearerCredentials):
        # The provider may block (an HTTP request to the token endpoint): never on the event loop.
        exchange = _OAuthBearer(credentials.first_message(await asyncio.to_thread(credentials.token_provider)))
    else:
        exchange = credentials.exchange()
    token: bytes | None = exchange.first()
    version = min(conn.versions.get(ApiKey.SASL_AUTHENTICATE, (0, 2))[1], 2)
    lifetime_ms = 0
    while token is not None:
        answer = await conn.request(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": token}, version=version)
        if answer.error_code != ErrorCode.none:
            raise SaslAuthenticationFailed(answer.error_code, answer.error_message or answer.error_code.name)
        lifetime_ms = int(answer.session_lifetime.total_seconds() * 1000) if version >= 1 else 0
        token = exchange.respond(answer.auth_bytes)
    return lifetime_ms
