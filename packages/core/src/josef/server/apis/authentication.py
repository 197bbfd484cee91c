"""SaslHandshake (v0-1) and SaslAuthenticate (v0-2): a client proving who it is on a SASL listener.

As in Kafka's SaslServerAuthenticator, a connection on a SASL listener
answers ApiVersions, then SaslHandshake (the client names a mechanism), then
SaslAuthenticate (its token); anything else before that closes the
connection (the dispatcher enforces it), and so does a failed
authentication, after its answer. On a listener without SASL (and after a
successful authentication) the SASL APIs are answered ILLEGAL_SASL_STATE.
Handshake v0 (raw tokens after it, without SaslAuthenticate) is answered, but
its raw tokens are not read: every client josef is tested with uses v1.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

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
    session.sasl_mechanism = request.mechanism
    return {"error_code": ErrorCode.none, "mechanisms": enabled}


async def sasl_authenticate(ctx: RequestContext, request: Any) -> dict[str, Any]:
    session = ctx.session
    listener = ctx.broker.sasl.get(ctx.listener_name)
    if listener is None or session.authenticated or session.sasl_mechanism is None:
        return _answer(ErrorCode.illegal_sasl_state, "SaslAuthenticate is not expected in this state: authenticate "
                                                     "once, after a SaslHandshake, on a SASL listener")
    try:
        principal = listener.mechanisms[session.sasl_mechanism].authenticate(bytes(request.auth_bytes))
    except SaslAuthenticationError as exc:
        # One line, with the client's address and mechanism only: never the user name or the password.
        log.info("failed authentication with %s:%d on %s (%s): %s", session.client_host, session.client_port,
                 ctx.listener_name, session.sasl_mechanism, exc)
        session.close_after_reply = True
        return _answer(ErrorCode.sasl_authentication_failed, str(exc))
    session.principal = principal
    session.authenticated = True
    log.debug("authenticated %s", session)
    return _answer(ErrorCode.none, None)


def _answer(error: ErrorCode, message: str | None) -> dict[str, Any]:
    return {"error_code": error, "error_message": message, "auth_bytes": b"", "session_lifetime_ms": 0}
