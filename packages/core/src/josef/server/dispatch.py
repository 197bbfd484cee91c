"""Request dispatch: which API keys and versions this broker answers, and by what.

Handlers are plain ``async def handler(ctx, request) -> dict | None``
functions. They read the kio request object of whatever version arrived and
return the response as a dict, which :func:`josef.protocol.messages.build`
turns into that version's response type, so one handler serves every version
in its range. ``None`` means no response (acks=0 produce).

The two APIs that carry one entry per partition and arrive thousands of
times a second, Produce and Fetch, are read by their own codecs
(:mod:`josef.protocol.produce_codec`, :mod:`josef.protocol.fetch_codec`)
instead of kio: an API registered with a ``decode`` function gets what it
returns, and its handler answers with :class:`Encoded`, the response body
already written for the request's version, as a list of buffers (record
data among them as storage gave it). Requests that reach such a handler
from inside the process (:meth:`Dispatcher.call`) still go in and come out
as kio objects.

A handler whose answer must wait for something other requests do not
depend on (an acks=all produce waiting for the ISR) returns :class:`Later`:
its connection reads on and handles the requests the client pipelined
meanwhile, and the answers still go out in request order.

A handler that raises fails its request, not its connection: the request
is answered with UNKNOWN_SERVER_ERROR in every error code of its response
(:func:`josef.protocol.error_responses.error_response`) and the connection
serves the next one, as Kafka's ``KafkaApis`` does. So is a request whose
response cannot be encoded in its version (a value out of a field's range):
the response is only written here, and a dropped connection would tell the
client nothing. An exception that carries its Kafka error code (a
controller's NOT_CONTROLLER) is answered with that code instead, as Kafka
maps its ApiExceptions. Only a request no error response can answer (acks=0
produce) closes the connection, as do frames that cannot be parsed.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import attrs
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map

from josef.protocol.api_keys import ApiKey
from josef.protocol.error_responses import error_response
from josef.protocol.messages import (
    MalformedRequestError,
    build,
    decode_response,
    encode_body,
    encode_response,
    has_flexible_response_header,
    is_flexible,
    parse_body,
    parse_header,
    request_type,
    response_type,
)
from josef.protocol.wire import writable
from josef.security import KafkaPrincipal, Session

if TYPE_CHECKING:
    from josef.node.broker import Broker
    from josef.services import BrokerServices

log = logging.getLogger(__name__)
_INT32 = struct.Struct(">i")

Handler = Callable[["RequestContext", Any], Awaitable["dict[str, Any] | Encoded | Later | None"]]
#: Reads a request body: ``(version, frame, offset of the body) -> request``.
Decoder = Callable[[int, Any, int], Any]
#: A whole response frame as buffers to write in order.
Frame = list[Any]
#: A response ready to write, or one still being computed (see :class:`Later`).
Reply = Frame | Awaitable[Frame]

#: What a client is told of an unexpected failure (Kafka's text for UNKNOWN_SERVER_ERROR);
#: the exception itself goes to the broker's log, not to clients.
UNKNOWN_SERVER_ERROR_MESSAGE = "The server experienced an unexpected error when processing the request."


@attrs.frozen
class Later:
    """A response that is not ready yet: the handler did its part, ``body`` waits for the rest.

    The request's effects (an append) happened in order before the handler
    returned; only its answer waits. So the connection may handle the next
    request meanwhile, as Kafka could not without a round trip to the ISR
    per request.
    """

    body: Awaitable[dict[str, Any] | Encoded]


@attrs.frozen
class Encoded:
    """A response body already written in the request's version, as buffers (bytes-like objects) in order."""

    chunks: list[Any]
    #: Where the response's ``throttle_time_ms`` lies, (chunk, byte offset), for the quota stage to set it.
    throttle_at: tuple[int, int] | None = None

    def throttled(self, throttle_ms: int) -> Encoded:
        """This response with ``throttle_time_ms`` set (it is written as 0)."""
        if self.throttle_at is None:
            return self
        index, offset = self.throttle_at
        chunk = bytes(self.chunks[index])
        chunks = list(self.chunks)
        chunks[index] = chunk[:offset] + _INT32.pack(throttle_ms) + chunk[offset + 4:]
        return Encoded(chunks, self.throttle_at)


class UnanswerableRequestError(Exception):
    """A handler failed on a request that no error response can answer: its connection is closed."""


#: What a connection on a SASL listener may ask before it has authenticated.
BEFORE_AUTHENTICATION = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


@attrs.frozen
class RequestContext:
    """One request's origin, as its handler sees it. Plugins use :attr:`services`; ``broker`` is the core's."""

    broker: Broker
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: The connection's identity: listener, security protocol, client address and software, principal.
    session: Session
    #: The request's size on the wire, in bytes (what producer byte-rate quotas count).
    size: int = 0

    @property
    def services(self) -> BrokerServices:
        return self.broker.services

    @property
    def principal(self) -> KafkaPrincipal:
        return self.session.principal

    @property
    def client_host(self) -> str:
        return self.session.client_host

    @property
    def listener_name(self) -> str:
        return self.session.listener_name

    @property
    def security_protocol(self) -> str:
        return self.session.security_protocol


@attrs.frozen
class Api:
    key: int
    handler: Handler
    min_version: int
    max_version: int
    decode: Decoder | None = None


#: A stage of the request pipeline: ``stage(ctx, request, next)`` answers the request, usually by awaiting
#: ``next(ctx, request)`` (the next stage, the handler last) and acting before or after it.
Stage = Callable[["RequestContext", Any, Handler], Awaitable[Any]]


class Dispatcher:
    """Answers requests: each goes through the pipeline's stages (authorization, quotas...), then its handler.

    Cross-cutting concerns are stages (:meth:`add_stage`), never code in the
    handlers: a stage sees every request of every API, whoever registered
    its handler. Requests a node makes to itself (:meth:`call` without a
    client's context) skip the stages: they are the node's own.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.apis: dict[int, Api] = {}
        self.stages: list[Stage] = []
        self._chains: dict[int, Handler] = {}

    def add_stage(self, stage: Stage) -> None:
        """Run ``stage`` on every request, inside the stages added before it."""
        self.stages.append(stage)
        self._chains.clear()

    def _chain(self, key: int) -> Handler:
        chain = self._chains.get(key)
        if chain is None:
            chain = self.apis[key].handler
            for stage in reversed(self.stages):
                chain = _link(stage, chain)
            self._chains[key] = chain
        return chain

    def register(self, key: int, handler: Handler, min_version: int, max_version: int, *, replace: bool = False,
                 decode: Decoder | None = None) -> None:
        """Answer ``key`` with ``handler``; ``replace`` takes over a key already answered (one the core lets plugins own).

        With ``decode`` the handler gets what it reads from the frame instead of kio's request.
        """
        if key in self.apis and not replace:
            raise ValueError(f"API key {key} ({api_key_map.get(key)}) is answered twice")
        known = schema_name_map[api_key_map[key]]
        self._chains.pop(key, None)
        self.apis[key] = Api(key, handler, max(min_version, min(known)), min(max_version, max(known)), decode)

    async def call(self, api_key: int, body: Any, *, version: int | None = None,
                   ctx: RequestContext | None = None) -> Any:
        """Answer a request from inside this process (a node asking itself), as a kio response, as if it came by network.

        ``body`` is a dict, built at ``version`` (default: the newest this
        dispatcher answers), or a request already parsed at ``ctx``'s version
        (one forwarded as it arrived). An answer that waits (:class:`Later`)
        is awaited.
        """
        api = self.apis[api_key]
        handler = api.handler if ctx is None else self._chain(api_key)
        if ctx is None:
            ctx = RequestContext(self.broker, api_key, api.max_version if version is None else version, 0,
                                 f"broker-{self.broker.node_id}", Session("", "PLAINTEXT", ""))
        request = build(request_type(api_key, ctx.api_version), body)
        if api.decode is not None:
            request = api.decode(ctx.api_version, encode_body(request), 0)
        answer = await handler(ctx, request)
        if isinstance(answer, Later):
            answer = await answer.body
        if isinstance(answer, Encoded):
            frame = b"".join(bytes(chunk) for chunk in self._encode(ctx.correlation_id, api_key, ctx.api_version, answer))
            return decode_response(api_key, ctx.api_version, memoryview(frame)[4:])[1]
        return build(response_type(api_key, ctx.api_version), answer) if isinstance(answer, dict) else answer

    async def handle(self, session: Session, frame: bytes | memoryview) -> Reply | None:
        header = parse_header(frame, is_flexible)
        api = self.apis.get(header.api_key)
        if api is None:
            raise MalformedRequestError(f"unknown or unsupported API key {header.api_key} (client {header.client_id!r})")
        version = header.api_version
        if not session.authenticated and header.api_key not in BEFORE_AUTHENTICATION:
            # Kafka's SaslServerAuthenticator: "Unexpected Kafka request of type X during SASL handshake".
            raise MalformedRequestError(f"unexpected {api_key_map[header.api_key]} request before SASL authentication "
                                        f"(client {header.client_id!r})")
        if session.session_expires_at and header.api_key not in BEFORE_AUTHENTICATION \
                and time.monotonic() > session.session_expires_at:
            # KIP-368: the session ended and the client did not re-authenticate (or cannot).
            raise MalformedRequestError(f"{session.principal}'s SASL session expired without re-authentication "
                                        f"(client {header.client_id!r})")
        if not api.min_version <= version <= api.max_version:
            if header.api_key == ApiKey.API_VERSIONS:
                # KIP-511: answer in v0 with the ranges, so the client can pick a version we know.
                return self._encode(header.correlation_id, ApiKey.API_VERSIONS, 0,
                                    self.api_versions_body(ErrorCode.unsupported_version))
            raise MalformedRequestError(
                f"{api_key_map[header.api_key]} v{version} is not supported (v{api.min_version}-v{api.max_version}); client {header.client_id!r}"
            )
        if api.decode is None:
            request = parse_body(header.api_key, version, _read_only(frame), header.body_offset)
        else:
            request = api.decode(version, frame, header.body_offset)
        ctx = RequestContext(self.broker, header.api_key, version, header.correlation_id, header.client_id, session,
                             len(frame))
        try:
            body = await self._chain(header.api_key)(ctx, request)
        except UnanswerableRequestError:
            raise
        except Exception as exc:
            if _carried_code(exc) is not None:
                return self._refused(header, request, frame, exc)
            return self._failed(header, request, frame)
        if isinstance(body, Later):
            return self._later(header, request, frame, body.body)
        if body is None:
            return None
        return self._answer(header, request, frame, body)

    async def _later(self, header: Any, request: Any, frame: bytes | memoryview,
                     body: Awaitable[dict[str, Any] | Encoded]) -> Frame:
        try:
            answer = await body
        except Exception as exc:
            if _carried_code(exc) is not None:
                return self._refused(header, request, frame, exc)
            return self._failed(header, request, frame)
        return self._answer(header, request, frame, answer)

    def _answer(self, header: Any, request: Any, frame: bytes | memoryview, body: dict[str, Any] | Encoded) -> Frame:
        """The response frame of ``body``, or UNKNOWN_SERVER_ERROR when ``body`` cannot be written in the request's
        version (a value out of its field's wire range, a field missing: a bug of whatever built it). The client
        gets an answer it can act on, the log gets the request, and the connection goes on."""
        try:
            return self._encode(header.correlation_id, header.api_key, header.api_version, body)
        except Exception:
            return self._failed(header, request, frame, encoding=True)

    def _refused(self, header: Any, request: Any, frame: bytes | memoryview, exc: Exception) -> Frame:
        """The error a handler raised with its Kafka code (NOT_CONTROLLER from a controller that is not the
        active one), answered with that code as Kafka's ``Errors.forException`` maps its ApiExceptions: a
        refusal, logged in one line, not a failure of the broker."""
        code = _carried_code(exc)
        assert code is not None
        version = header.api_version
        name = api_key_map[header.api_key]
        try:
            if self.apis[header.api_key].decode is not None:
                request = parse_body(header.api_key, version, _read_only(frame), header.body_offset)
            response = error_response(header.api_key, version, request, code, str(exc) or code.name)
            answer = None if response is None else encode_response(header.api_key, version, header.correlation_id,
                                                                     response)
        except Exception:
            return self._failed(header, request, frame, encoding=True)
        outcome = "" if answer is not None else "; closing the connection: no error response can answer it"
        log.info("%s v%d request from client %r refused: %s (%s)%s", name, version, header.client_id,
                 code.name.upper(), exc, outcome)
        if answer is None:  # (acks=0 produce)
            raise UnanswerableRequestError(f"{name} v{version} request refused and cannot be answered")
        return [answer]

    def _failed(self, header: Any, request: Any, frame: bytes | memoryview, encoding: bool = False) -> Frame:
        """UNKNOWN_SERVER_ERROR for a request whose handler raised, or whose response could not be encoded
        (``encoding``); called in the ``except`` block, whose exception is logged, once."""
        version = header.api_version
        name = api_key_map[header.api_key]
        try:
            if self.apis[header.api_key].decode is not None:
                request = parse_body(header.api_key, version, _read_only(frame), header.body_offset)
            response = error_response(header.api_key, version, request, ErrorCode.unknown_server_error,
                                      UNKNOWN_SERVER_ERROR_MESSAGE)
            answer = None if response is None else encode_response(header.api_key, version, header.correlation_id,
                                                                     response)
        except Exception as exc:  # the error response cannot be built either: say so along with the first failure
            log.error("%s v%d request from client %r: no error response either (%r)", name, version,
                      header.client_id, exc)
            answer = None
        outcome = ("closing the connection: no error response can answer it" if answer is None
                   else "answering UNKNOWN_SERVER_ERROR")
        if encoding:
            log.exception("%s v%d response to client %r (correlation id %d) cannot be encoded; %s; the request: %s",
                          name, version, header.client_id, header.correlation_id, outcome, _shown(request))
        else:
            log.exception("%s v%d request from client %r failed; %s", name, version, header.client_id, outcome)
        if answer is None:
            raise UnanswerableRequestError(f"{name} v{version} request failed and cannot be answered") from None
        return [answer]

    def _encode(self, correlation_id: int, key: int, version: int, body: dict[str, Any] | Encoded) -> Frame:
        if isinstance(body, Encoded):
            head = _INT32.pack(correlation_id) + (b"\x00" if has_flexible_response_header(key, version) else b"")
            size = len(head) + sum(len(chunk) for chunk in body.chunks)
            return [_INT32.pack(size) + head, *body.chunks]
        response = build(response_type(key, version), body) if isinstance(body, dict) else body
        return [encode_response(key, version, correlation_id, response)]

    def api_versions_body(self, error: ErrorCode = ErrorCode.none) -> dict[str, Any]:
        return {
            "error_code": error,
            "api_keys": [
                {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
                for a in sorted(self.apis.values(), key=lambda a: a.key)
            ],
            "throttle_time": 0,
        }


def _link(stage: Stage, inner: Handler) -> Handler:
    async def linked(ctx: RequestContext, request: Any) -> Any:
        return await stage(ctx, request, inner)
    return linked


def _carried_code(exc: Exception) -> ErrorCode | None:
    """The Kafka error an exception carries (josef's errors that name one hold it as ``code``), unless it is
    UNKNOWN_SERVER_ERROR; None for any other exception, which is a failure."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, ErrorCode) and code not in (ErrorCode.unknown_server_error, ErrorCode.none) \
        else None


def _shown(request: Any, limit: int = 2000) -> str:
    """``request`` for a log line, cut at ``limit`` characters (a produce request's records would fill the log)."""
    text = repr(request)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def _read_only(frame: bytes | bytearray | memoryview) -> bytes | memoryview:
    """kio reads only read-only buffers; a large request is a bytearray of its own (see josef.protocol.frames)."""
    return memoryview(frame).toreadonly() if writable(frame) else frame
