"""SASL authentication on a broker's SASL listeners: the mechanisms and their configuration.

A listener's mechanisms are Kafka's: ``sasl.enabled.mechanisms`` (or
``listener.name.<listener>.sasl.enabled.mechanisms``), each configured by
``listener.name.<listener>.<mechanism>.sasl.jaas.config`` in Kafka's JAAS
syntax. PLAIN checks the ``user_<name>="<password>"`` options of
``PlainLoginModule``, as Kafka's PlainServerCallbackHandler does.
SCRAM-SHA-256 and SCRAM-SHA-512 need ``ScramLoginModule`` there, as Kafka
does, and check the credentials of the metadata log
(:mod:`josef.server.scram`). OAUTHBEARER needs ``OAuthBearerLoginModule``
and validates bearer tokens, unsecured or against a JWKS
(:mod:`josef.server.oauthbearer`); a mechanism with work of its own while
the broker runs (the JWKS refresh) does it in :meth:`ListenerSasl.run`.

Each connection gets its own exchange (:class:`SaslServer`) at
SaslHandshake: PLAIN's takes one token, SCRAM's two, and the exchange keeps
its state in the session between SaslAuthenticate requests.

Nothing here may put a password into a log line or an error message: a
failed authentication is answered with Kafka's fixed message and logged
with the client's address alone.
"""

from __future__ import annotations

import hmac
import re
from typing import Mapping, Protocol

import anyio
import anyio.abc
import attrs

from josef.config import Config, ConfigError
from josef.protocol.jaas import parse_jaas
from josef.scram import BY_NAME as SCRAM_ALGORITHMS
from josef.scram import ScramAlgorithm
from josef.security import KafkaPrincipal, SaslAuthenticationError
from josef.server.oauthbearer import MECHANISM as OAUTHBEARER
from josef.server.oauthbearer import OAuthBearerMechanism
from josef.server.scram import CredentialLookup, ScramServer

__all__ = ["SaslAuthenticationError", "ListenerSasl", "OAuthBearerMechanism", "PlainMechanism", "ScramMechanism"]

#: Kafka's per-listener (and per-mechanism) SASL keys, which the SASL listeners read although no ConfigKey declares
#: them (their names are open-ended): ``listener.name.<l>.sasl.enabled.mechanisms``,
#: ``listener.name.<l>.<mechanism>.sasl.jaas.config`` and the like.
LISTENER_SASL_KEY = re.compile(r"listener\.name\.[^.]+\.(?:sasl\.enabled\.mechanisms|[a-z0-9-]+\.(?:sasl\.jaas\.config|"
                               r"sasl\.server\.callback\.handler\.class|connections\.max\.reauth\.ms))")
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
#: The mechanisms josef's brokers answer.
SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER)
#: Kafka's answer to any failed PLAIN authentication: it says nothing about which part was wrong.
INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"

class SaslServer(Protocol):
    """One connection's exchange of one mechanism."""

    #: Who the client proved to be, once :attr:`complete`.
    principal: KafkaPrincipal | None

    @property
    def complete(self) -> bool:
        """Whether the exchange ended in success (the client is :attr:`principal`)."""

    def evaluate(self, token: bytes) -> bytes:
        """The answer to the client's next token; :class:`SaslAuthenticationError` ends the exchange."""


class Mechanism(Protocol):
    """A mechanism as a listener is configured with it."""

    def server(self, credentials: CredentialLookup) -> SaslServer:
        """A new exchange for one connection; ``credentials`` reads the SCRAM credentials of the current image."""


class _OneStep:
    """The exchange of a single-token mechanism (PLAIN)."""

    def __init__(self, mechanism: PlainMechanism) -> None:
        self._mechanism = mechanism
        self.principal: KafkaPrincipal | None = None
        self._used = False

    @property
    def complete(self) -> bool:
        return self.principal is not None

    def evaluate(self, token: bytes) -> bytes:
        if self._used:
            raise SaslAuthenticationError(INVALID_CREDENTIALS, "a second PLAIN token")
        self._used = True
        self.principal = self._mechanism.authenticate(token)
        return b""


class PlainMechanism:
    """SASL/PLAIN (RFC 4616) against the users of a PlainLoginModule JAAS entry."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = dict(users)

    @classmethod
    def from_jaas(cls, text: str, key: str) -> PlainMechanism:
        module, options = parse_jaas(text, key)
        if module != PLAIN_LOGIN_MODULE:
            raise ConfigError(f"{key}: PLAIN needs {PLAIN_LOGIN_MODULE}, not {module}")
        users = {name.removeprefix("user_"): password for name, password in options.items() if name.startswith("user_")}
        if not users:
            raise ConfigError(f"{key}: {PLAIN_LOGIN_MODULE} lists no user_<name>=\"<password>\" option")
        return cls(users)

    def server(self, credentials: CredentialLookup) -> SaslServer:
        return _OneStep(self)

    def authenticate(self, token: bytes) -> KafkaPrincipal:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, username, password = (part.decode() for part in parts)
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: not UTF-8") from None
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        # Compared in constant time, against "" for an unknown user, so timing tells little.
        if not hmac.compare_digest(self._users.get(username, "").encode(), password.encode()):
            raise SaslAuthenticationError(INVALID_CREDENTIALS)
        if authzid and authzid != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        return KafkaPrincipal("User", username)


class ScramMechanism:
    """SCRAM-SHA-256 or SCRAM-SHA-512 against the credentials of the metadata log (Kafka's ScramLoginModule)."""

    def __init__(self, algorithm: ScramAlgorithm) -> None:
        self.algorithm = algorithm

    @classmethod
    def from_jaas(cls, name: str, text: str, key: str) -> ScramMechanism:
        """Kafka requires a ScramLoginModule entry for the listener; its options (a client's username and
        password, for inter-broker SASL) are not the broker's users: those live in the metadata log."""
        module, _ = parse_jaas(text, key)
        if module != SCRAM_LOGIN_MODULE:
            raise ConfigError(f"{key}: {name} needs {SCRAM_LOGIN_MODULE}, not {module}")
        return cls(SCRAM_ALGORITHMS[name])

    def server(self, credentials: CredentialLookup) -> SaslServer:
        return ScramServer(self.algorithm, credentials)


@attrs.frozen
class ListenerSasl:
    """The SASL mechanisms one listener offers, in configured order."""

    listener: str
    mechanisms: Mapping[str, Mechanism]

    @classmethod
    def from_config(cls, config: Config, listener: str) -> ListenerSasl:
        """The listener's mechanisms; :class:`ConfigError` for one josef does not offer or a missing JAAS entry."""
        prefix = f"listener.name.{listener.lower()}."
        override = config.unknown.get(prefix + "sasl.enabled.mechanisms")
        enabled = [m.strip() for m in override.split(",") if m.strip()] if override is not None \
            else list(config["sasl.enabled.mechanisms"])
        if not enabled:
            raise ConfigError(f"listener {listener}: no SASL mechanism is enabled (sasl.enabled.mechanisms)")
        mechanisms: dict[str, Mechanism] = {}
        for name in enabled:
            if name not in SUPPORTED_MECHANISMS:
                raise ConfigError(f"listener {listener}: SASL mechanism {name} is not supported yet; josef offers "
                                  f"{', '.join(SUPPORTED_MECHANISMS)} (sasl.enabled.mechanisms)")
            key = f"{prefix}{name.lower()}.sasl.jaas.config"
            jaas = config.unknown.get(key)
            if jaas is None:
                raise ConfigError(f"listener {listener}: {name} needs {key}")
            if name == "PLAIN":
                mechanisms[name] = PlainMechanism.from_jaas(jaas, key)
            elif name == OAUTHBEARER:
                mechanisms[name] = OAuthBearerMechanism.from_config(config, listener, jaas, key)
            else:
                mechanisms[name] = ScramMechanism.from_jaas(name, jaas, key)
        return cls(listener, mechanisms)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The mechanisms' background work while the broker runs (OAUTHBEARER's JWKS refresh), reported started
        once each is ready to authenticate (the JWKS fetched), so no client is refused for a cache still empty."""
        async with anyio.create_task_group() as tg:
            for mechanism in self.mechanisms.values():
                if isinstance(mechanism, OAuthBearerMechanism):
                    await tg.start(mechanism.run)
            task_status.started()
