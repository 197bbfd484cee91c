"""Kafka's wire protocol over TCP: one task per connection, requests answered in order.

As in Kafka, a connection handles one request at a time, in the order they
arrive, and answers them in that order. One exception to Kafka's strictness:
a response that only waits (:class:`josef.server.dispatch.Later`, an acks=all
produce waiting for the ISR) does not hold up reading and handling the next
requests; up to ``MAX_PENDING_REPLIES`` answers queue behind it. Followers
then replicate several of a producer's batches per round trip instead of
one. acks=0 produce requests get no response. Anything malformed closes
that connection with a log line; it never reaches the rest of the broker. A
request whose handler fails is answered with an error by the dispatcher and
the connection goes on, unless no error response can answer it.

A connection idle for ``connections.max.idle.ms`` (no request received, no
answer sent, nothing owed) is closed, as Kafka's Selector does; a request
still being answered (a long-poll fetch) keeps it open.

On an SSL or SASL_SSL listener (:mod:`josef.server.tls`) each accepted
socket is wrapped in anyio's TLS stream after a handshake that must finish
within the listener's deadline; a failed handshake (a plaintext client, no
client certificate where one is required, an untrusted one) closes it with
one log line. Such a connection reads and writes through the stream (the
frame-cutting :class:`_Wire` and ``os.sendfile`` need the raw socket, and
TLS must encrypt every byte): record files are read in slices and sent
through TLS. PLAINTEXT connections take none of these paths.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
import time
from collections import deque
from typing import Any

import anyio
import anyio.abc
from anyio.streams.stapled import MultiListener
from anyio.streams.tls import TLSAttribute, TLSStream

from josef.log import FileRegion
from josef.protocol.frames import FrameReader
from josef.protocol.messages import MalformedRequestError
from josef.security import ANONYMOUS, AuthenticationContext, KafkaPrincipal, PrincipalBuilder, Session
from josef.server.dispatch import Dispatcher, Frame, Reply, UnanswerableRequestError
from josef.server.tls import ListenerTls

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
#: The request header's first fields: API key and version.
_KEY_VERSION = struct.Struct(">hh")
#: A request whose answer the writer task sends: (answer, API key, version, arrival, handler start, handler end,
#: throttle), times in ``time.monotonic()`` seconds.
_Pending = tuple[Reply, int, int, float, float, float, float]
_RECEIVE_CHUNK = 1 << 20
#: Answers a connection may owe before it stops reading (clients pipeline 5 by default).
MAX_PENDING_REPLIES = 8


class FrameTooLargeError(Exception):
    pass


class Connection:
    def __init__(
        self,
        stream: anyio.abc.SocketStream,
        dispatcher: Dispatcher,
        listener_name: str,
        max_frame: int,
        max_idle_ms: int | None = None,
        security_protocol: str = "PLAINTEXT",
        principal: KafkaPrincipal = ANONYMOUS,
        peer_subject: str | None = None,
    ) -> None:
        self.stream = stream
        self.dispatcher = dispatcher
        self.max_frame = max_frame
        remote = stream.extra(anyio.abc.SocketAttribute.remote_address, "?")
        self.peer = f"{remote[0]}:{remote[1]}" if isinstance(remote, tuple) else str(remote)
        self.session = Session(listener_name, security_protocol, remote[0] if isinstance(remote, tuple) else str(remote),
                               remote[1] if isinstance(remote, tuple) else -1,
                               principal=principal, authenticated=not security_protocol.startswith("SASL_"),
                               peer_subject=peer_subject)
        self._buffer = b""
        self._pos = 0
        self._max_idle = None if max_idle_ms is None or max_idle_ms < 0 else max_idle_ms / 1000
        #: ``time.monotonic()``, not ``anyio.current_time()``: this runs per request, and anyio's asks which
        #: event loop library is running every time.
        self._last_active = time.monotonic()
        #: Requests read and not yet answered (or dropped, for acks=0 produce).
        self._owed = 0
        #: Answers handed to the writer task and not written yet.
        self._queued = 0
        self._writer: _Writer | None = None
        #: Before SASL authentication a request may be no larger than sasl.server.max.receive.size, as in Kafka:
        #: a client that has proved nothing cannot make the broker buffer socket.request.max.bytes.
        self._authenticated_max_frame = max_frame
        if not self.session.authenticated:
            max_frame = min(max_frame, dispatcher.broker.config["sasl.server.max.receive.size"])
        self.max_frame = max_frame
        self._wire = _Wire.attach(stream, max_frame, self.peer, self.session.authenticated)
        self._requests = dispatcher.broker.request_metrics

    async def _read_frame(self) -> bytes | bytearray | memoryview | None:
        """The next request, without its size prefix; None when the connection closes first."""
        if self._wire is not None:
            frame = await self._wire.read_frame()
        else:
            frame = await self._read_stream_frame()
        if frame is not None:
            self._last_active = time.monotonic()
        return frame

    async def _read_stream_frame(self) -> bytes | bytearray | memoryview | None:
        """:meth:`_read_frame` for a stream that is not anyio's asyncio socket stream (no :class:`_Wire`)."""
        size_bytes = await self._read_exactly(4)
        if size_bytes is None:
            return None
        (size,) = _SIZE.unpack(size_bytes)
        if size < 0 or size > self.max_frame:
            raise FrameTooLargeError(_too_large(size, self.max_frame, self.session.authenticated))
        return await self._read_exactly(size)

    async def _read_exactly(self, n: int) -> bytes | bytearray | memoryview | None:
        buffer, pos = self._buffer, self._pos
        if len(buffer) - pos >= n:
            self._pos = pos + n
            return buffer[pos : pos + n]
        parts = [buffer[pos:]]
        have = len(parts[0])
        while have < n:
            try:
                chunk = await self.stream.receive(_RECEIVE_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                if have:
                    log.info("connection %s closed in the middle of a request", self.peer)
                return None
            parts.append(chunk)
            have += len(chunk)
        data = bytearray().join(parts)  # writable: a produce request's batches get their offsets where they lie
        self._buffer, self._pos = data, n
        return memoryview(data)[:n] if have > n else data

    async def serve(self) -> None:
        try:
            async with anyio.create_task_group() as watchdog:
                if self._max_idle is not None:
                    watchdog.start_soon(self._close_when_idle, watchdog.cancel_scope, self._max_idle)
                await self._serve_requests()
                watchdog.cancel_scope.cancel()
        except* (MalformedRequestError, FrameTooLargeError, UnanswerableRequestError) as group:
            log.warning("closing connection from %s: %s", self.peer, _first(group))
        except* (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as group:
            log.debug("connection %s broke: %s", self.peer, _first(group))
        finally:
            if self._writer is not None:
                self._writer.close()
            await self.stream.aclose()

    async def _serve_requests(self) -> None:
        """Read, handle, answer. An answer ready while none is queued is written here at once; the writer
        task takes over behind one that waits (:class:`josef.server.dispatch.Later`), to keep the order.

        Each request's times go to Kafka's RequestMetrics (:mod:`josef.metrics.requests`): a few clock reads
        and one record per request."""
        send, receive = anyio.create_memory_object_stream[_Pending](MAX_PENDING_REPLIES)
        writer = self._writer = _Writer(self.stream, self._wire)
        wire = self._wire
        session = self.session
        clock = time.monotonic
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._write_replies, receive)
            async with send:
                while True:
                    if session.throttled_until:
                        await self._sit_out_throttle()
                    frame = await self._read_frame()
                    if frame is None:
                        writer.flush_held()
                        return
                    self._owed += 1
                    started = clock()
                    arrived = wire.arrived if wire is not None else started
                    reply = await self.dispatcher.handle(session, frame)
                    handled = clock()
                    key, version = _KEY_VERSION.unpack_from(frame)
                    throttle = max(session.throttled_until - handled, 0.0)
                    if self.max_frame != self._authenticated_max_frame and session.authenticated:
                        self._authenticated()
                    if reply is None:
                        self._owed -= 1
                        self._requests.of(key).record(version, (arrived, started, handled, handled, handled, handled,
                                                                throttle))
                    elif not self._queued and isinstance(reply, list):
                        if not (self._next_frame_received() and writer.hold(reply)):
                            await writer.write([reply])
                        self._answered(1)
                        sent = clock()
                        self._requests.of(key).record(version, (arrived, started, handled, handled, handled, sent,
                                                                throttle))
                    else:
                        writer.flush_held()
                        self._queued += 1
                        await send.send((reply, key, version, arrived, started, handled, throttle))
                    if self.session.close_after_reply:  # its last answer goes out with the rest, then it closes
                        writer.flush_held()
                        log.debug("closing connection from %s after its last answer", self.peer)
                        return

    def _authenticated(self) -> None:
        """The client authenticated: it may now send requests up to socket.request.max.bytes."""
        self.max_frame = self._authenticated_max_frame
        if self._wire is not None:
            self._wire.max_frame = self.max_frame
            self._wire.authenticated = True

    async def _sit_out_throttle(self) -> None:
        """Read nothing from a client over its quota until its throttle time is over (Kafka mutes the channel, KIP-219).

        A client that closes the connection meanwhile ends the wait: a
        throttle can last hours (a tiny byte-rate quota, a large request),
        and the connection would be held, half-closed, all that time.
        """
        self._writer.flush_held()
        delay = self.session.throttled_until - time.monotonic()
        self.session.throttled_until = 0.0
        if delay <= 0:
            return
        if self._wire is None:
            await anyio.sleep(delay)
            return
        with anyio.move_on_after(delay):
            await self._wire.ended()

    def _next_frame_received(self) -> bool:
        """Whether the next request is already here whole (pipelined behind the one just answered)."""
        return self._wire is not None and self._wire.has_frame()  # (without a _Wire nothing is held anyway)

    async def _write_replies(self, replies: anyio.abc.ObjectReceiveStream[_Pending]) -> None:
        """Write the queued answers in request order, each once it is ready; answers ready together go out in one write."""
        async with replies:
            async for pending in replies:
                ready = [await self._ready(pending)]
                while True:
                    try:
                        pending = replies.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    if not isinstance(pending[0], list):
                        await self._write_ready(ready)
                        ready = []
                    ready.append(await self._ready(pending))
                await self._write_ready(ready)

    async def _ready(self, pending: _Pending) -> tuple[Frame, _Pending, float]:
        """The answer of a queued request, once there, with the time it was (its handler's wait ends there)."""
        reply = pending[0]
        frame = reply if isinstance(reply, list) else await reply
        return frame, pending, time.monotonic()

    async def _write_ready(self, ready: list[tuple[Frame, _Pending, float]]) -> None:
        """Write answers in one go, and record each one's request times."""
        start = time.monotonic()
        await self._writer.write([frame for frame, _, _ in ready])
        self._answered(len(ready), queued=True)
        sent = time.monotonic()
        for _, (_, key, version, arrived, started, handled, throttle), ready_at in ready:
            self._requests.of(key).record(version, (arrived, started, handled, ready_at, start, sent, throttle))

    def _answered(self, count: int, queued: bool = False) -> None:
        self._owed -= count
        if queued:
            self._queued -= count
        self._last_active = time.monotonic()

    async def _close_when_idle(self, scope: anyio.CancelScope, max_idle: float) -> None:
        """Cancel ``scope`` (the connection) once nothing has moved on it for ``max_idle`` seconds and nothing is owed."""
        while True:
            idle_until = self._last_active + max_idle
            now = time.monotonic()
            if now >= idle_until and self._owed == 0:
                log.debug("closing connection from %s: idle for more than %.0f ms", self.peer, max_idle * 1000)
                scope.cancel()
                return
            await anyio.sleep(max(idle_until - now, max_idle / 10, 0.001))


class _Wire(FrameReader):
    """The connection's asyncio protocol, put in place of anyio's on its transport: it cuts requests out of the stream.

    anyio's ``SocketStream.receive`` stops and restarts reading around every
    wait (two ``epoll_ctl`` calls per request under uvloop) and yields to the
    event loop once more when data is already there. Here reading stays on,
    straight into the :class:`josef.protocol.frames.FrameReader`'s buffers,
    so a large produce request is copied once, out of the socket, and its
    batches get their offsets where they lie. Whole requests queue until the
    connection takes them, and reading pauses while more than
    ``READ_BUFFER_BYTES`` wait (a client sending faster than requests are
    handled). ``write_event`` is clear while the transport's buffer is over
    its limit, as anyio's is.
    """

    READ_BUFFER_BYTES = 16 << 20
    #: The receive buffer small requests are cut from (and the first bytes of a large one).
    BUFFER_SIZE = 256 << 10

    def __init__(self, transport: asyncio.Transport, max_frame: int, peer: str, authenticated: bool = True) -> None:
        super().__init__(max_frame, self.BUFFER_SIZE)
        self.transport = transport
        self.write_event = asyncio.Event()
        self.write_event.set()
        self.peer = peer
        self._frames: deque[bytes | bytearray] = deque()
        #: When each waiting request arrived whole; ``arrived``: when the one :meth:`read_frame` returned last did.
        self._arrivals: deque[float] = deque()
        self.arrived = 0.0
        self._queued = 0
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._paused = False
        #: Whether ``max_frame`` is socket.request.max.bytes (else sasl.server.max.receive.size), for its errors.
        self.authenticated = authenticated

    @classmethod
    def attach(cls, stream: anyio.abc.SocketStream, max_frame: int, peer: str, authenticated: bool = True) -> _Wire | None:
        """Take over ``stream``'s transport, with what anyio already received; None for a stream that is not anyio's asyncio one."""
        transport = getattr(stream, "_transport", None)
        previous = getattr(stream, "_protocol", None)
        if not hasattr(transport, "set_protocol") or not hasattr(previous, "read_queue"):
            return None
        wire = cls(transport, max_frame, peer, authenticated)
        for chunk in previous.read_queue:
            wire.feed(chunk)
        previous.read_queue.clear()
        wire._ended = bool(previous.is_at_eof or previous.exception is not None or transport.is_closing())
        transport.set_protocol(wire)
        if wire._error is None:
            transport.resume_reading()
        return wire

    def has_frame(self) -> bool:
        """Whether a whole request is waiting to be read."""
        return bool(self._frames)

    async def read_frame(self) -> bytes | bytearray | None:
        """The next request, without its size; None once the peer closed (or the connection broke) and all was read."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            if self._ended:
                if self.partial():
                    log.info("connection %s closed in the middle of a request", self.peer)
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame = self._frames.popleft()
        self.arrived = self._arrivals.popleft()
        self._queued -= len(frame)
        if self._paused and self._queued < self.READ_BUFFER_BYTES // 2 and self._error is None:
            self._paused = False
            self.transport.resume_reading()
        return frame

    def frame_received(self, frame: bytes | bytearray) -> None:
        self._frames.append(frame)
        self._arrivals.append(time.monotonic())
        self._queued += len(frame)
        if self._queued > self.READ_BUFFER_BYTES and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def frame_refused(self, size: int) -> None:
        self._error = FrameTooLargeError(_too_large(size, self.max_frame, self.authenticated))
        self.transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def ended(self) -> None:
        """Return once the peer closed (or the connection broke); what it sent before is still read."""
        while not self._ended:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return True  # keep the transport open to write the answers still owed

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self._wake()
        self.write_event.set()

    def pause_writing(self) -> None:
        self.write_event.clear()

    def resume_writing(self) -> None:
        self.write_event.set()


class _Writer:
    """Writes response frames straight to the connection's asyncio transport, record files with ``os.sendfile``.

    anyio's ``SocketStream.send`` yields to the event loop on every call,
    even when the transport takes the bytes at once: one extra trip through
    the loop per response. Here a batch of frames becomes one
    ``transport.write`` and the writer waits only while the transport
    asks it to (its buffer is over the high-water mark), as anyio does.

    Record data that storage gave as a :class:`josef.log.FileRegion` goes
    from the file to the socket with ``os.sendfile`` (Kafka's
    ``FileRecords.writeTo``), after whatever the transport still holds; a
    consumer that reads slowly makes the writer wait for room in the socket,
    never makes the broker read its records into memory. A stream that is
    not anyio's asyncio socket stream is written through its ``send``,
    regions read into it.

    A TLS connection has no :class:`_Wire`: it is written through its TLS
    stream, regions read in slices of ``STREAM_SLICE`` bytes (the file is
    never read into memory whole).
    """

    #: Whether regions may go out with ``os.sendfile`` (only a stream with a :class:`_Wire`, never TLS, uses it).
    zero_copy = True
    #: The most bytes a stream (TLS) connection reads from a record file, and sends, at a time.
    STREAM_SLICE = 1 << 20
    #: The most bytes of answers held back to share one write.
    HOLD_BYTES = 1 << 20

    def __init__(self, stream: anyio.abc.SocketStream, wire: _Wire | None) -> None:
        self._stream = stream
        self._transport = wire.transport if wire is not None else None
        self._protocol = wire
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        self._fd = sock.fileno() if sock is not None else -1
        #: A duplicate of the socket's descriptor, to wait on while a region waits for room in the socket.
        self._poll_fd = -1
        #: Answers held to go out in one write with the next (see :meth:`hold`).
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._flush_soon = False

    def hold(self, frame: Frame) -> bool:
        """Keep a ready answer to write together with the answers of the requests pipelined behind it.

        One ``send`` then carries them all (a client with many produce
        requests in flight gets their answers in one write). What is held
        goes out before any later write, and at the latest when the loop
        next turns: a request that waits (a long-poll fetch) never holds
        back the answers before it. Only answers without file regions, up
        to ``HOLD_BYTES``; False when this one was not held.
        """
        if self._transport is None or self._held_bytes >= self.HOLD_BYTES \
                or any(type(chunk) is FileRegion for chunk in frame):
            return False
        self._held.extend(frame)
        self._held_bytes += sum(map(len, frame))
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self.flush_held)
        return True

    def flush_held(self) -> None:
        """Write the held answers now."""
        self._flush_soon = False
        if self._held:
            data, self._held, self._held_bytes = b"".join(self._held), [], 0
            if not self._transport.is_closing():
                self._transport.write(data)

    async def write(self, frames: list[Frame]) -> None:
        if self._held:
            self.flush_held()
        transport = self._transport
        if transport is None:
            await self._write_stream(frames)
            return
        if transport.is_closing():
            raise anyio.BrokenResourceError
        pending: list[Any] = []
        try:
            for frame in frames:
                for chunk in frame:
                    if type(chunk) is FileRegion:
                        await self._send_region(transport, b"".join(pending), chunk)
                        pending = []
                    else:
                        pending.append(chunk)
        finally:
            for frame in frames:
                for chunk in frame:
                    if type(chunk) is FileRegion:
                        chunk.close()
        if pending:
            transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
        if not self._protocol.write_event.is_set():
            await self._protocol.write_event.wait()
            if transport.is_closing():
                raise anyio.BrokenResourceError

    async def _write_stream(self, frames: list[Frame]) -> None:
        """Write through the stream's ``send`` (TLS encrypts there), record regions read in slices."""
        pending: list[Any] = []
        size = 0
        try:
            for frame in frames:
                for chunk in frame:
                    if type(chunk) is FileRegion:
                        offset, left = chunk.offset, chunk.size
                        while left:
                            piece = chunk.read(offset, min(left, self.STREAM_SLICE - size))
                            pending.append(piece)
                            size += len(piece)
                            offset += len(piece)
                            left -= len(piece)
                            if size >= self.STREAM_SLICE:
                                await self._stream.send(b"".join(pending))
                                pending, size = [], 0
                    else:
                        pending.append(chunk)
                        size += len(chunk)
            if pending:
                await self._stream.send(b"".join(pending))
        finally:
            for frame in frames:
                for chunk in frame:
                    if type(chunk) is FileRegion:
                        chunk.close()

    async def _send_region(self, transport: Any, head: bytes, region: FileRegion) -> None:
        """``head`` then the region's bytes, straight to the socket: ``os.write``, then ``os.sendfile``.

        Bytes the transport still holds (uvloop keeps small writes until the
        end of the loop's turn, and whatever the socket did not take) go
        first, so the writer waits for the transport to empty. When the
        socket's buffer is full it waits until the socket takes more, and
        goes on from the same file offset, as Kafka's ``FileRecords.writeTo``
        does: the region is never read into memory.
        """
        if not self.zero_copy or self._fd < 0:
            transport.write(head + region.read(region.offset, region.size))
            return
        while transport.get_write_buffer_size():
            await self._socket_writable()
            await asyncio.sleep(0)  # the transport writes what it holds in its own callback
            if transport.is_closing():
                raise anyio.BrokenResourceError
        offset, left = region.offset, region.size
        while head or left:
            try:
                if head:
                    head = head[os.write(self._fd, head):]
                    continue
                sent = os.sendfile(self._fd, region.fd, offset, left)
            except BlockingIOError:
                await self._socket_writable()
                continue
            if sent == 0:  # the file ends before the region does: fail the connection, not the broker
                raise anyio.BrokenResourceError(f"record file ended {left} bytes before the region")
            offset += sent
            left -= sent

    async def _socket_writable(self) -> None:
        """Wait until the socket's send buffer has room.

        The transport owns the socket's registration in the event loop, so
        the wait is on a duplicate of its descriptor.
        """
        if self._poll_fd < 0:
            self._poll_fd = os.dup(self._fd)
        loop = asyncio.get_running_loop()
        writable: asyncio.Future[None] = loop.create_future()
        loop.add_writer(self._poll_fd, lambda: writable.done() or writable.set_result(None))
        try:
            await writable
        finally:
            loop.remove_writer(self._poll_fd)

    def close(self) -> None:
        if self._poll_fd >= 0:
            os.close(self._poll_fd)
            self._poll_fd = -1


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first error in ``group``, out of the task groups nested around it (the idle watchdog's and the writer's)."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


def _too_large(size: int, limit: int, authenticated: bool) -> str:
    key = "socket.request.max.bytes" if authenticated else "sasl.server.max.receive.size (before SASL authentication)"
    return f"frame of {size} bytes exceeds {key} {limit}" + _tls_hint(size)


def _tls_hint(size: int) -> str:
    """What a refused frame size says when it is the start of a TLS handshake (a TLS client on a plaintext port)."""
    return " (a TLS handshake? this listener is not TLS)" if size >> 16 == 0x1603 else ""


def _tune(stream: anyio.abc.SocketStream) -> None:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)


async def serve_listener(
    listener: anyio.abc.Listener,
    dispatcher: Dispatcher,
    listener_name: str,
    max_frame: int,
    max_idle_ms: int | None = None,
    security_protocol: str = "PLAINTEXT",
    tls: ListenerTls | None = None,
) -> None:
    """Serve every connection ``listener`` accepts; ``max_idle_ms`` is connections.max.idle.ms (None: never closed for
    idleness). With ``tls`` (SSL and SASL_SSL listeners) each connection starts with a TLS handshake."""

    async def handle(stream: anyio.abc.SocketStream) -> None:
        # Whatever goes wrong on one connection must end there: the listener's
        # task group would otherwise take the whole broker down with it.
        try:
            _tune(stream)
            principal, subject = ANONYMOUS, None
            if tls is not None:
                secured = await _handshake(stream, tls, dispatcher.broker.principal_builder)
                if secured is None:
                    return
                stream, principal, subject = secured
            await Connection(stream, dispatcher, listener_name, max_frame, max_idle_ms, security_protocol,
                             principal, subject).serve()
        except OSError as exc:
            log.debug("connection failed: %s", exc)
            await stream.aclose()
        except Exception:
            log.exception("unexpected error on a connection; closing it")
            await stream.aclose()

    await listener.serve(handle)


async def _handshake(stream: anyio.abc.SocketStream, tls: ListenerTls, builder: PrincipalBuilder,
                     ) -> tuple[anyio.abc.ByteStream, KafkaPrincipal, str | None] | None:
    """The TLS stream over ``stream``, the connection's principal and its certificate's subject; None (the socket
    closed, one line logged) when the handshake fails or does not finish within the listener's deadline, or the
    principal builder refuses the client (no mapping rule names it).

    The context is read per connection, so a reloaded certificate serves
    every connection accepted after the reload. On SSL the principal
    builder names the principal from the certificate; on SASL_SSL, SASL will.
    """
    remote = stream.extra(anyio.abc.SocketAttribute.remote_address, "?")
    peer = f"{remote[0]}:{remote[1]}" if isinstance(remote, tuple) else str(remote)
    why = None
    try:
        with anyio.fail_after(tls.handshake_timeout_s):
            secured = await TLSStream.wrap(stream, server_side=True, ssl_context=tls.context, standard_compatible=False)
    except TimeoutError:
        why = f"no TLS handshake within {tls.handshake_timeout_s:g} s"
    except ssl.SSLError as exc:
        why = f"TLS handshake failed: {exc.reason or exc.__class__.__name__}"
    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
        why = f"closed during the TLS handshake ({exc.__class__.__name__})"
    if why is not None:
        log.info("closing connection from %s on listener %s: %s", peer, tls.listener, why)
        await anyio.aclose_forcefully(stream)
        return None
    principal = ANONYMOUS
    subject = tls.peer_subject(secured.extra(TLSAttribute.ssl_object))
    if tls.security_protocol == "SSL":
        try:
            principal = builder.build(AuthenticationContext("SSL", tls.listener, peer.rpartition(":")[0],
                                                            peer_subject=subject))
        except (LookupError, ValueError) as exc:
            log.info("closing connection from %s on listener %s: no principal: %s", peer, tls.listener, exc)
            await anyio.aclose_forcefully(secured)
            return None
    return secured, principal, subject


async def bind(host: str, port: int) -> MultiListener | anyio.abc.SocketListener:
    """Listen on ``host:port`` (all addresses the name resolves to, like Kafka)."""
    return await anyio.create_tcp_listener(local_host=host or None, local_port=port, reuse_port=False)
