"""Who is on a connection: Kafka's principal and the connection-level half of its RequestContext.

Every request a handler sees carries its connection's :class:`Session`
(``ctx.session``): the listener and its security protocol, the client's
address, the software it says it is (ApiVersions v3+, KIP-511) and the
principal it authenticated as (``User:ANONYMOUS`` until a listener
authenticates). Authorizers and quotas decide on these, as Kafka's do.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from josef.server.sasl import SaslServer

#: KIP-511: what ApiVersions v3+ accepts as a client software name or version.
SOFTWARE_PATTERN = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


@attrs.frozen
class KafkaPrincipal:
    """A principal as Kafka names it: ``User:alice`` (type ``User``, name ``alice``)."""

    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """``User:alice`` -> KafkaPrincipal("User", "alice"); ValueError without a ``type:`` prefix."""
        principal_type, sep, name = text.partition(":")
        if not sep or not principal_type:
            raise ValueError(f"{text!r} is not a principal (expected TYPE:NAME, e.g. User:alice)")
        return cls(principal_type, name)


class SaslAuthenticationError(Exception):
    """Credentials refused. The message is what the client is told (it names no secret); ``reason``, if any, is for
    the broker's log only: it says which check failed, naming no user and no secret."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


#: The principal of an unauthenticated connection (a PLAINTEXT listener).
ANONYMOUS = KafkaPrincipal("User", "ANONYMOUS")


@attrs.frozen
class AuthenticationContext:
    """What a principal builder knows of a connection that just authenticated (Kafka's AuthenticationContext)."""

    #: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    security_protocol: str
    listener_name: str
    client_address: str
    #: The client certificate's subject (RFC 2253) on a TLS listener, when the client presented one.
    peer_subject: str | None = None
    #: On a SASL listener: the mechanism and the authorization id it authenticated (the user name).
    sasl_mechanism: str | None = None
    sasl_authorization_id: str | None = None


class PrincipalBuilder(Protocol):
    """Kafka's ``KafkaPrincipalBuilder`` (``principal.builder.class``): who a connection is, once it authenticated.

    Called on the event loop once per connection (SSL: after the TLS
    handshake; SASL: after each successful authentication): must not block.
    A :class:`LookupError` or :class:`ValueError` refuses the connection.
    """

    def build(self, context: AuthenticationContext) -> KafkaPrincipal: ...


@attrs.define
class Session:
    """One connection's identity; the broker fills it in as the connection goes (authentication, ApiVersions)."""

    listener_name: str
    #: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (``listener.security.protocol.map``).
    security_protocol: str
    client_host: str
    client_port: int = -1
    principal: KafkaPrincipal = ANONYMOUS
    client_software_name: str = "unknown"
    client_software_version: str = "unknown"
    #: False on a SASL listener until the client authenticates: only ApiVersions and the SASL APIs are answered.
    authenticated: bool = True
    #: The SASL mechanism the client chose with SaslHandshake (None before).
    sasl_mechanism: str | None = None
    #: The exchange of that mechanism (``josef.server.sasl.SaslServer``): a multi-step one (SCRAM) keeps its state
    #: here between SaslAuthenticate requests; None before the handshake and once authenticated.
    sasl_server: SaslServer | None = None
    #: Set by a handler whose answer must be the connection's last (failed authentication), as Kafka closes it.
    close_after_reply: bool = False
    #: Set by the quota stage: read no further request before this ``time.monotonic()`` (KIP-219); 0: not throttled.
    throttled_until: float = 0.0
    #: When the authenticated session ends (``time.monotonic()``, KIP-368): a request after it, other than a
    #: re-authentication, closes the connection; 0: never.
    session_expires_at: float = 0.0
    #: Whether an authenticated client is re-authenticating (KIP-368): SaslHandshake began a new exchange.
    reauthenticating: bool = False
    #: The subject of the client's certificate (RFC 2253) on a TLS listener, for the principal builder.
    peer_subject: str | None = None
    #: Whether the client authenticated with a delegation token (SCRAM ``tokenauth=true``): it may not create,
    #: renew, expire or describe tokens, as in Kafka (a token must not beget tokens or outlive itself).
    token_authenticated: bool = False
    #: Whether this is the client of a request a broker forwarded in an Envelope (the controller's view of it).
    forwarded: bool = False

    def __str__(self) -> str:
        return (f"{self.principal} from {self.client_host}:{self.client_port} on {self.listener_name} "
                f"({self.security_protocol}), {self.client_software_name} {self.client_software_version}")
