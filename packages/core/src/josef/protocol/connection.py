"""One TCP connection to one broker: requests pipelined, responses matched in order.

The protocol layer's client side, shared by josef's client and by brokers
calling other brokers (replica fetchers, controller calls, transaction
markers), so neither imports the other.

Kafka answers the requests of a connection in the order they were sent, so
pending requests wait in a FIFO and the reader resolves them one by one.
Versions are negotiated once with ApiVersions; every request is built from a
plain dict with :func:`josef.protocol.messages.build`, so callers write one
request shape for all versions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
import time
from typing import Any, Mapping

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map

from josef import __version__
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, UnsupportedVersionError
from josef.protocol.frames import FrameReader
from josef.protocol.messages import decode_response, encode_request
from josef.protocol.sasl_client import ClientSasl, authenticate

log = logging.getLogger(__name__)

class Connection:
    def __init__(self, host: str, port: int, client_id: str, request_timeout_ms: int,
                 max_versions: Mapping[int, int]) -> None:
        self.host, self.port = host, port
        self.max_versions = max_versions
        self.client_id = client_id.encode()
        self.request_timeout = request_timeout_ms / 1000
        self.versions: dict[int, tuple[int, int]] = {}
        self._transport: asyncio.Transport | None = None
        self._protocol: _FrameProtocol | None = None
        self._pending: collections.deque[tuple[int, int, int, asyncio.Future[Any]]] = collections.deque()
        self._correlation = 0
        self.closed = False
        #: What the connection authenticated with, and when (``time.monotonic()``) it re-authenticates (KIP-368).
        self._sasl: ClientSasl | None = None
        self._reauthenticate_at = 0.0
        self._reauthentication: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.host}:{self.port}>"

    @classmethod
    async def open(cls, host: str, port: int, *, client_id: str = "josef", request_timeout_ms: int = 30000,
                   connect_timeout_ms: int = 10000, max_versions: Mapping[int, int] | None = None,
                   ssl_context: ssl.SSLContext | None = None, sasl: ClientSasl | None = None) -> Connection:
        """Connect and negotiate versions; ``max_versions`` caps the version of an API key this side writes.

        Without a cap, an API is spoken at the newest version both kio and
        the broker know; callers that do not handle a newer version's
        semantics (topic ids, say) cap it. With ``ssl_context`` (an SSL
        listener, :mod:`josef.protocol.tls`) the connection is TLS, its
        handshake within the connect timeout. With ``sasl`` (a SASL
        listener) it authenticates before it is returned
        (:class:`josef.protocol.sasl_client.SaslAuthenticationFailed` when
        refused).
        """
        conn = cls(host, port, client_id, request_timeout_ms, max_versions or {})
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {} if ssl_context is None else {
            "ssl": ssl_context, "server_hostname": host, "ssl_handshake_timeout": connect_timeout_ms / 1000}
        try:
            transport, conn._protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _FrameProtocol(conn), host, port, **tls), connect_timeout_ms / 1000)
        except ssl.SSLError as exc:
            raise KafkaConnectionError(f"cannot connect to {host}:{port}: TLS handshake failed: "
                                       f"{exc.reason or exc}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            raise KafkaConnectionError(f"cannot connect to {host}:{port}: {exc or 'timed out'}") from None
        conn._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await conn._negotiate()
            if sasl is not None:
                conn._sasl = sasl
                conn._authenticated(await authenticate(conn, sasl))
        except BaseException:
            conn._fail(KafkaConnectionError(f"connection to {host}:{port} closed"))
            raise
        return conn

    async def _negotiate(self) -> None:
        """ApiVersions at our newest version; a v0 UNSUPPORTED_VERSION answer (KIP-511) still lists the broker's ranges."""
        version = self._newest_ours(ApiKey.API_VERSIONS)[1]
        response = await self.request(ApiKey.API_VERSIONS, {"client_software_name": "josef",
                                                           "client_software_version": __version__}, version=version)
        if response.error_code == ErrorCode.unsupported_version:
            response = await self.request(ApiKey.API_VERSIONS, {}, version=0)
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}

    def version(self, api_key: int) -> int:
        """The newest version both sides speak."""
        low, high = self._newest_ours(api_key)
        theirs = self.versions.get(api_key)
        if theirs is None or theirs[1] < low or theirs[0] > high:
            raise UnsupportedVersionError(
                f"broker {self.host}:{self.port} does not support {api_key_map[api_key]} in versions {low}-{high}"
                + (f" (it has {theirs[0]}-{theirs[1]})" if theirs else ""))
        return min(high, theirs[1])

    def _newest_ours(self, api_key: int) -> tuple[int, int]:
        ours = schema_name_map[api_key_map[api_key]]
        return min(ours), min(max(ours), self.max_versions.get(api_key, max(ours)))

    def _authenticated(self, lifetime_ms: int) -> None:
        """Re-authenticate at 85% of the session's lifetime, as Kafka's clients do (KIP-368)."""
        self._reauthenticate_at = time.monotonic() + lifetime_ms * 0.85 / 1000 if lifetime_ms > 0 else 0.0

    async def _reauthenticate(self) -> None:
        """SaslHandshake and SaslAuthenticate again, among the requests in flight (the broker answers in order)."""
        assert self._sasl is not None
        try:
            self._authenticated(await authenticate(self, self._sasl))
        except Exception as exc:  # noqa: BLE001 - the connection is unusable either way: fail it with the reason
            log.warning("re-authentication to %s:%d failed: %s", self.host, self.port, exc)
            self._fail(exc if isinstance(exc, KafkaError) else KafkaConnectionError(str(exc)))

    def send(self, api_key: int, body: Mapping[str, Any], *, version: int | None = None,
             expect_response: bool = True) -> asyncio.Future[Any] | None:
        """Write a request now; returns a future of its response (None when none is expected, acks=0)."""
        if self.closed or self._transport is None:
            raise KafkaConnectionError(f"connection to {self.host}:{self.port} is closed")
        if self._reauthenticate_at and time.monotonic() >= self._reauthenticate_at:
            self._reauthenticate_at = 0.0
            self._reauthentication = asyncio.get_running_loop().create_task(self._reauthenticate())
        if version is None:
            version = self.version(api_key)
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        self._transport.write(encode_request(api_key, version, self._correlation, self.client_id, body))
        if not expect_response:
            return None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((self._correlation, api_key, version, future))
        return future

    async def request(self, api_key: int, body: Mapping[str, Any], *, version: int | None = None) -> Any:
        future = self.send(api_key, body, version=version)
        assert future is not None
        return await self.wait(future)

    async def wait(self, future: asyncio.Future[Any]) -> Any:
        """The response, or :class:`KafkaTimeoutError` after request.timeout.ms (the connection is then closed, as its order is lost)."""
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.request_timeout)
        except asyncio.TimeoutError:
            self._fail(KafkaTimeoutError(f"no response from {self.host}:{self.port} within {self.request_timeout:.1f}s"))
            if future.done() and not future.cancelled():
                future.exception()  # retrieved here, or asyncio logs "Future exception was never retrieved"
            raise KafkaTimeoutError(f"no response from {self.host}:{self.port} within {self.request_timeout:.1f}s") from None

    async def drain(self) -> None:
        """Wait until the socket buffer accepts more (back-pressure from a slow broker)."""
        if self._protocol is not None and not self.closed:
            await self._protocol.writable()

    def _received(self, frame: bytes | memoryview) -> None:
        """A whole response frame arrived: it answers the oldest pending request."""
        try:
            correlation, api_key, version, future = self._pending.popleft()
        except IndexError:
            self._fail(KafkaConnectionError(f"unexpected response from {self.host}:{self.port}"))
            return
        try:
            answered, response = decode_response(api_key, version, frame)
            if answered != correlation:
                raise KafkaConnectionError(f"response {answered} came for request {correlation}")
        except Exception as exc:  # a response we cannot read breaks the connection's order
            self._pending.appendleft((correlation, api_key, version, future))
            self._fail(KafkaConnectionError(f"unreadable response from {self.host}:{self.port}: {exc!r}"))
            return
        if not future.done():
            future.set_result(response)

    def _fail(self, error: Exception) -> None:
        self.closed = True
        while self._pending:
            future = self._pending.popleft()[3]
            if not future.done():
                future.set_exception(error)
                future.exception()  # nobody may be waiting any more (a cancelled caller): no "never retrieved" noise
        if self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        self._fail(KafkaConnectionError(f"connection to {self.host}:{self.port} closed by the client"))
        if self._protocol is not None:
            await self._protocol.closed()

class _FrameProtocol(FrameReader):
    """The client side of a connection: each response frame answers the oldest request (see :class:`FrameReader`)."""

    BUFFER_SIZE = 1 << 16

    def __init__(self, conn: Connection) -> None:
        super().__init__(0x7FFFFFFF, self.BUFFER_SIZE)
        self.conn = conn
        self._writable: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._closed = asyncio.get_running_loop().create_future()

    def frame_received(self, frame: bytes | bytearray) -> None:
        # kio reads only read-only buffers
        self.conn._received(frame if isinstance(frame, bytes) else memoryview(frame).toreadonly())

    def frame_refused(self, size: int) -> None:
        self.conn._fail(KafkaConnectionError(f"frame size {size} from {self.conn.host}:{self.conn.port}"))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._fail(KafkaConnectionError(f"connection to {self.conn.host}:{self.conn.port} closed: {exc or 'EOF'}"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    async def writable(self) -> None:
        if self._writable is not None and not self._writable.done():
            await asyncio.shield(self._writable)

    async def closed(self) -> None:
        if self._closed is not None:
            await asyncio.shield(self._closed)
