"""SaslHandshake (v0-1) and SaslAuthenticate (v0-2): a client proving who it is on a SASL listener.

As in Kafka's SaslServerAuthenticator, a connection on a SASL listener
answers ApiVersions, then SaslHandshake (the client names a mechanism), then
SaslAuthenticate (its tokens: one for PLAIN, two for SCRAM, the exchange
kept in the session between them); anything else before that closes the
connection (the dispatcher enforces it), and so does a failed
authentication, after its answer. On a listener without SASL (and after a
successful authentication, unless re-authenticating) the SASL APIs are
answered ILLEGAL_SASL_STATE.

KIP-368 re-authentication: with ``connections.max.reauth.ms`` (or a
credential that expires: an OAUTHBEARER token) an authenticated session has
a lifetime, told to the client in SaslAuthenticate v1+ (``session_lifetime_ms``).
Before it ends the client sends SaslHandshake and SaslAuthenticate again on
the same connection, with the same mechanism, and must prove to be the same
principal; its other requests are served meanwhile. A connection whose
session ended without that is closed at its next request (the dispatcher
checks), which is also how clients that cannot re-authenticate are held to
the lifetime, as Kafka does.
Handshake v0 (raw tokens after it, without SaslAuthenticate) is answered, but
its raw tokens are not read, whatever the mechanism: every client josef is
tested with uses v1.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kio.schema.errors import ErrorCode

from josef import delegation_tokens
from josef.scram import ScramAlgorithm, ScramCredential
from josef.security import AuthenticationContext
from josef.server.dispatch import RequestContext
from josef.server.sasl import SaslAuthenticationError
from josef.server.scram import ScramServer

log = logging.getLogger(__name__)


async def sasl_handshake(ctx: RequestContext, request: Any) -> dict[str, Any]:
    session = ctx.session
    listener = ctx.broker.sasl.get(ctx.listener_name)
    if listener is None or session.sasl_server is not None:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
    if session.authenticated:
        # KIP-368: only a session that expires is re-authenticated, and with the mechanism it began with.
        if not session.session_expires_at or request.mechanism != session.sasl_mechanism:
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
        session.reauthenticating = True
    elif session.sasl_mechanism is not None:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
    enabled = list(listener.mechanisms)
    if request.mechanism not in listener.mechanisms:
        log.info("closing connection from %s:%d on %s: SASL mechanism %r is not enabled (%s)", session.client_host,
                 session.client_port, ctx.listener_name, request.mechanism, ", ".join(enabled))
        session.close_after_reply = True
        return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled}
    broker = ctx.broker

    def credentials(user: str, algorithm: ScramAlgorithm) -> ScramCredential | None:
        # The image of the moment the client asks: a credential created a moment ago on any broker counts.
        return broker.image.scram_credentials.get((user, algorithm.type))

    session.sasl_mechanism = request.mechanism
    exchange = listener.mechanisms[request.mechanism].server(credentials)
    secret = broker.config[delegation_tokens.SECRET_KEY]
    if isinstance(exchange, ScramServer) and secret:
        def tokens(token_id: str, algorithm: ScramAlgorithm) -> delegation_tokens.TokenCredential | None:
            # SCRAM with tokenauth=true: the token as the image has it now (expired or removed: no credential).
            return delegation_tokens.token_credential(broker.image.delegation_tokens, str(secret), token_id,
                                                      algorithm, time.time_ns() // 1_000_000)
        exchange.tokens = tokens
    session.sasl_server = exchange
    return {"error_code": ErrorCode.none, "mechanisms": enabled}


async def sasl_authenticate(ctx: RequestContext, request: Any) -> dict[str, Any]:
    session = ctx.session
    listener = ctx.broker.sasl.get(ctx.listener_name)
    exchange = session.sasl_server
    if listener is None or (session.authenticated and not session.reauthenticating) or exchange is None:
        return _answer(ErrorCode.illegal_sasl_state, "SaslAuthenticate is not expected in this state: authenticate "
                                                     "once, after a SaslHandshake, on a SASL listener")
    try:
        challenge = exchange.evaluate(bytes(request.auth_bytes))
    except SaslAuthenticationError as exc:
        # One line, with the client's address and mechanism only: never the user name or the password.
        reason = f" ({exc.reason})" if exc.reason else ""
        log.info("failed authentication with %s:%d on %s (%s): %s%s", session.client_host, session.client_port,
                 ctx.listener_name, session.sasl_mechanism, exc, reason)
        session.sasl_server = None
        session.close_after_reply = True
        return _answer(ErrorCode.sasl_authentication_failed, str(exc))
    if not exchange.complete:
        return _answer(ErrorCode.none, None, challenge)  # SCRAM's server-first: the client answers it
    assert exchange.principal is not None
    session.sasl_server = None
    try:
        principal = ctx.broker.principal_builder.build(AuthenticationContext(
            session.security_protocol, ctx.listener_name, session.client_host, peer_subject=session.peer_subject,
            sasl_mechanism=session.sasl_mechanism, sasl_authorization_id=exchange.principal.name))
    except (LookupError, ValueError) as exc:
        log.info("failed authentication with %s:%d on %s (%s): no principal: %s", session.client_host,
                 session.client_port, ctx.listener_name, session.sasl_mechanism, exc)
        session.close_after_reply = True
        return _answer(ErrorCode.sasl_authentication_failed, "Authentication failed: no principal")
    if session.reauthenticating:
        session.reauthenticating = False
        if principal != session.principal:
            log.info("failed re-authentication with %s:%d on %s (%s): another principal", session.client_host,
                     session.client_port, ctx.listener_name, session.sasl_mechanism)
            session.close_after_reply = True
            return _answer(ErrorCode.sasl_authentication_failed,
                           f"Cannot change principals during re-authentication from {session.principal}: "
                           f"{principal}")
        log.debug("re-authenticated %s", session)
    else:
        session.principal = principal
        session.authenticated = True
        log.debug("authenticated %s", session)
    # A connection authenticated with a delegation token may not ask for tokens (Kafka's allowTokenRequests).
    session.token_authenticated = bool(getattr(exchange, "token_authenticated", False))
    lifetime_ms = _session_lifetime_ms(ctx, exchange)
    if lifetime_ms is not None and lifetime_ms <= 0:
        session.close_after_reply = True
        return _answer(ErrorCode.sasl_authentication_failed, "Authentication failed: the credential has expired")
    session.session_expires_at = time.monotonic() + lifetime_ms / 1000 if lifetime_ms else 0.0
    return _answer(ErrorCode.none, None, challenge, lifetime_ms or 0)


def _session_lifetime_ms(ctx: RequestContext, exchange: Any) -> int | None:
    """How long the session lasts (KIP-368): the shorter of ``connections.max.reauth.ms`` (per listener and
    mechanism, as Kafka allows) and what is left of the credential's life; None when neither limits it."""
    mechanism = (ctx.session.sasl_mechanism or "").lower()
    config = ctx.broker.config
    override = config.unknown.get(f"listener.name.{ctx.listener_name.lower()}.{mechanism}.connections.max.reauth.ms")
    limits = []
    max_reauth_ms = int(override) if override is not None else config["connections.max.reauth.ms"]
    if max_reauth_ms > 0:
        limits.append(max_reauth_ms)
    expires_at_ms = getattr(exchange, "expires_at_ms", None)
    if expires_at_ms is not None:
        limits.append(expires_at_ms - int(time.time() * 1000))
    return min(limits) if limits else None


def _answer(error: ErrorCode, message: str | None, token: bytes = b"", lifetime_ms: int = 0) -> dict[str, Any]:
    return {"error_code": error, "error_message": message, "auth_bytes": token, "session_lifetime": lifetime_ms}
