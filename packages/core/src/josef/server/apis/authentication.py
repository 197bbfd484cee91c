"""SaslHandshake (v0-1) and SaslAuthenticate (v0-2): a client proving who it is on a SASL listener.

As in Kafka's SaslServerAuthenticator, a connection on a SASL listener
answers ApiVersions, then SaslHandshake (the client names a mechanism), then
SaslAuthenticate (its tokens: one for PLAIN, two for SCRAM, the exchange
kept in the session between them); anything else before that closes the
connection (the dispatcher enforces it), and so does a failed
authentication, after its answer. On a listener without SASL (and after a
successful authentication) the SASL APIs are answered ILLEGAL_SASL_STATE.
Handshake v0 (raw tokens after it, without SaslAuthenticate) is answered, but
its raw tokens are not read, whatever the mechanism: every client josef is
tested with uses v1.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from josef.scram import ScramAlgorithm, ScramCredential
from josef.server.dispatch import RequestContext
from josef.server.sasl import SaslAuthenticationError

log = logging.getLogger(__name__)


async def sasl_handshake(ctx: RequestContext, request: Any) -> dict[str, Any]:
    session = ctx.session
    listener = ctx.broker.sasl.get(ctx.listener_name)
    if listener is None or session.authenticated or session.sasl_mechanism is not None:
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
    session.sasl_server = listener.mechanisms[request.mechanism].server(credentials)
    return {"error_code": ErrorCode.none, "mechanisms": enabled}


async def sasl_authenticate(ctx: RequestContext, request: Any) -> dict[str, Any]:
    session = ctx.session
    listener = ctx.broker.sasl.get(ctx.listener_name)
    exchange = session.sasl_server
    if listener is None or session.authenticated or exchange is None:
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
    session.principal = exchange.principal
    session.sasl_server = None
    session.authenticated = True
    log.debug("authenticated %s", session)
    return _answer(ErrorCode.none, None, challenge)


def _answer(error: ErrorCode, message: str | None, token: bytes = b"") -> dict[str, Any]:
    return {"error_code": error, "error_message": message, "auth_bytes": token, "session_lifetime_ms": 0}
