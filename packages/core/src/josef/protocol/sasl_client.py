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
"""

from __future__ import annotations

import base64
import hmac
import secrets
from typing import Any, Callable, Protocol

import attrs
from kio.schema.errors import ErrorCode

from josef.config import ConfigError
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError
from josef.protocol.jaas import parse_jaas
from josef.scram import BY_NAME as SCRAM_ALGORITHMS
from josef.scram import ScramAlgorithm, client_key, salted_password

#: The mechanisms josef can authenticate with.
MECHANISMS = ("PLAIN", *SCRAM_ALGORITHMS)
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

    def __repr__(self) -> str:
        return f"SaslCredentials({self.mechanism}, {self.username!r})"

    @classmethod
    def from_client_config(cls, get: Lookup, where: str = "client") -> SaslCredentials:
        """From Kafka's client keys (``sasl.mechanism``, ``sasl.jaas.config``) or librdkafka's user name and password."""
        mechanism = (get("sasl.mechanism") or "GSSAPI").upper()
        if mechanism not in MECHANISMS:
            raise ConfigError(f"{where}: sasl.mechanism {mechanism} is not supported; josef offers {', '.join(MECHANISMS)}")
        jaas = get("sasl.jaas.config")
        if jaas:
            _, options = parse_jaas(str(jaas), f"{where}: sasl.jaas.config")
            username, password = options.get("username"), options.get("password")
        else:
            username, password = get("sasl.username"), get("sasl.password")
        if not username or password is None:
            raise ConfigError(f"{where}: SASL needs a user name and password: sasl.jaas.config with username and "
                              f"password options, or sasl.username and sasl.password")
        return cls(mechanism, str(username), str(password))

    def exchange(self) -> SaslExchange:
        if self.mechanism == "PLAIN":
            return _Plain(self)
        return _Scram(self, SCRAM_ALGORITHMS[self.mechanism])


def outbound_sasl(config: Any, listener: str, mechanism_key: str) -> SaslCredentials | None:
    """What a broker or controller authenticates with to ``listener`` of other nodes: None unless the listener is
    SASL (``listener.security.protocol.map``); else ``mechanism_key``'s mechanism
    (``sasl.mechanism.inter.broker.protocol`` or ``sasl.mechanism.controller.protocol``) and the ``username`` and
    ``password`` of the listener's JAAS entry for it, as Kafka's brokers take theirs."""
    protocols = dict(entry.upper().split(":", 1) for entry in config["listener.security.protocol.map"])
    if not protocols.get(listener.upper(), "").startswith("SASL_"):
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
    return SaslCredentials.from_client_config(
        {"sasl.mechanism": mechanism, "sasl.jaas.config": jaas}.get, where)


class SaslExchange(Protocol):
    def first(self) -> bytes:
        """The client's first message."""

    def respond(self, challenge: bytes) -> bytes | None:
        """The answer to the server's message; None when the exchange is over (the server is verified)."""


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
        self.client_first_bare = f"n={user},r={self.nonce}"
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


async def authenticate(conn: Any, credentials: SaslCredentials) -> int:
    """SaslHandshake and SaslAuthenticate on ``conn`` (a :class:`josef.protocol.connection.Connection`, versions
    negotiated); :class:`SaslAuthenticationFailed` with the broker's message when it refuses. Returns the session's
    lifetime in ms (KIP-368; 0: it does not expire)."""
    handshake = await conn.request(ApiKey.SASL_HANDSHAKE, {"mechanism": credentials.mechanism}, version=1)
    if handshake.error_code != ErrorCode.none:
        raise SaslAuthenticationFailed(handshake.error_code,
                                       f"the broker does not offer {credentials.mechanism} (it offers "
                                       f"{', '.join(handshake.mechanisms) or 'nothing'})")
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
