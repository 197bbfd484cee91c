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
"""

from __future__ import annotations

import logging
import socket
import struct

import anyio
import anyio.abc
from anyio.streams.stapled import MultiListener

from josef.protocol.messages import MalformedRequestError
from josef.server.dispatch import Dispatcher, Reply, UnanswerableRequestError

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_RECEIVE_CHUNK = 1 << 20
#: Answers a connection may owe before it stops reading (clients pipeline 5 by default).
MAX_PENDING_REPLIES = 8


class FrameTooLargeError(Exception):
    pass


class Connection:
    def __init__(self, stream: anyio.abc.SocketStream, dispatcher: Dispatcher, listener_name: str, max_frame: int) -> None:
        self.stream = stream
        self.dispatcher = dispatcher
        self.listener_name = listener_name
        self.max_frame = max_frame
        remote = stream.extra(anyio.abc.SocketAttribute.remote_address, "?")
        self.peer = f"{remote[0]}:{remote[1]}" if isinstance(remote, tuple) else str(remote)
        self.client_host = remote[0] if isinstance(remote, tuple) else str(remote)
        self._buffer = b""
        self._pos = 0

    async def _receive(self) -> bytes | None:
        try:
            return await self.stream.receive(_RECEIVE_CHUNK)
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            return None

    async def _read_exactly(self, n: int) -> bytes | memoryview | None:
        """``n`` bytes from the connection; None when it closes first.

        Chunks are collected and joined once, so a large produce request is
        copied once here rather than once per chunk received; pipelined small
        requests are sliced off the buffer without moving what follows.
        """
        buffer, pos = self._buffer, self._pos
        if len(buffer) - pos >= n:
            self._pos = pos + n
            return buffer[pos : pos + n]
        parts = [buffer[pos:]]
        have = len(parts[0])
        while have < n:
            chunk = await self._receive()
            if chunk is None:
                if have:
                    log.info("connection %s closed in the middle of a request", self.peer)
                return None
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self._buffer, self._pos = data, n
        return memoryview(data)[:n] if have > n else data

    async def _read_frame(self) -> bytes | memoryview | None:
        size_bytes = await self._read_exactly(4)
        if size_bytes is None:
            return None
        (size,) = _SIZE.unpack(size_bytes)
        if size < 0 or size > self.max_frame:
            raise FrameTooLargeError(f"frame of {size} bytes exceeds socket.request.max.bytes {self.max_frame}")
        return await self._read_exactly(size)

    async def serve(self) -> None:
        try:
            send, receive = anyio.create_memory_object_stream[Reply](MAX_PENDING_REPLIES)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_replies, receive)
                async with send:
                    while True:
                        frame = await self._read_frame()
                        if frame is None:
                            return
                        reply = await self.dispatcher.handle(self, frame)
                        if reply is not None:
                            await send.send(reply)
        except* (MalformedRequestError, FrameTooLargeError, UnanswerableRequestError) as group:
            log.warning("closing connection from %s: %s", self.peer, group.exceptions[0])
        except* (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as group:
            log.debug("connection %s broke: %s", self.peer, group.exceptions[0])
        finally:
            await self.stream.aclose()

    async def _write_replies(self, replies: anyio.abc.ObjectReceiveStream[Reply]) -> None:
        """Write answers in request order, each once it is ready."""
        async with replies:
            async for reply in replies:
                await self.stream.send(reply if isinstance(reply, bytes) else await reply)


def _tune(stream: anyio.abc.SocketStream) -> None:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)


async def serve_listener(listener: anyio.abc.Listener, dispatcher: Dispatcher, listener_name: str, max_frame: int) -> None:
    async def handle(stream: anyio.abc.SocketStream) -> None:
        # Whatever goes wrong on one connection must end there: the listener's
        # task group would otherwise take the whole broker down with it.
        try:
            _tune(stream)
            await Connection(stream, dispatcher, listener_name, max_frame).serve()
        except OSError as exc:
            log.debug("connection failed: %s", exc)
            await stream.aclose()
        except Exception:
            log.exception("unexpected error on a connection; closing it")
            await stream.aclose()

    await listener.serve(handle)


async def bind(host: str, port: int) -> MultiListener | anyio.abc.SocketListener:
    """Listen on ``host:port`` (all addresses the name resolves to, like Kafka)."""
    return await anyio.create_tcp_listener(local_host=host or None, local_port=port, reuse_port=False)
