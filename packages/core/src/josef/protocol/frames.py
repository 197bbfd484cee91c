"""Size-prefixed frames cut out of a TCP stream with the fewest copies: both ends of Kafka's protocol.

The event loop reads the socket straight into buffers the reader owns
(:class:`asyncio.BufferedProtocol`). Small frames are cut out of one reused
receive buffer (one copy each, out of it). A frame larger than that buffer
(a fetch response with records, on a client; a produce request, on a
broker) gets a bytearray of its own that the kernel fills directly, so its
bytes are copied once, out of the socket, and the bytearray can be written
into where it lies (a leader stamps offsets into a produce request's
batches).
"""

from __future__ import annotations

import asyncio
import struct

_SIZE = struct.Struct(">i")


class FrameReader(asyncio.BufferedProtocol):
    """Calls :meth:`frame_received` with each whole frame, without its size, in stream order.

    A size below zero or above ``max_frame`` calls :meth:`frame_refused`
    and ends the cutting: nothing after it can be trusted to be a frame.
    """

    def __init__(self, max_frame: int, buffer_size: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray(buffer_size)
        self._start = self._end = 0
        #: A large frame being read into its own buffer, and how much of it has arrived.
        self._large: bytearray | None = None
        self._filled = 0
        self._refused = False

    def frame_received(self, frame: bytes | bytearray) -> None:
        """A whole frame: ``bytes`` cut from the receive buffer, or a large frame's own ``bytearray``."""
        raise NotImplementedError

    def frame_refused(self, size: int) -> None:
        """A frame announced ``size`` bytes, which is negative or over ``max_frame``."""
        raise NotImplementedError

    def partial(self) -> bool:
        """Whether part of a frame has arrived and the rest not yet."""
        return self._end > self._start or self._large is not None

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._filled:]
        if self._end == len(self._buffer):  # keep the unread start of a frame, at the front
            pending = self._end - self._start
            self._buffer[:pending] = self._buffer[self._start:self._end]
            self._start, self._end = 0, pending
        return memoryview(self._buffer)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._filled += nbytes
            if self._filled == len(self._large):
                frame, self._large = self._large, None
                self.frame_received(frame)
            return
        self._end += nbytes
        buffer, start, end = self._buffer, self._start, self._end
        while end - start >= 4 and not self._refused:
            (size,) = _SIZE.unpack_from(buffer, start)
            if size < 0 or size > self.max_frame:
                self._refused = True
                start = end
                self.frame_refused(size)
                break
            if end - start - 4 >= size:
                start += 4 + size
                self.frame_received(bytes(memoryview(buffer)[start - size:start]))
            elif size > len(buffer) - 4:  # too big to cut out of the buffer: read the rest into its own
                have = end - start - 4
                self._large = bytearray(size)
                self._large[:have] = memoryview(buffer)[start + 4:end]
                self._filled = have
                start = end
                break
            else:
                break
        if start == end:
            start = end = 0
        self._start, self._end = start, end

    def feed(self, data: bytes) -> None:
        """Bytes that arrived before this reader took over the stream, as if read now."""
        view = memoryview(data)
        while view and not self._refused:
            buffer = self.get_buffer(len(view))
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            self.buffer_updated(n)
            view = view[n:]
