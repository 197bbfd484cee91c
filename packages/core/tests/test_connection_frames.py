"""How both ends of a connection cut size-prefixed frames out of what the socket delivers.

Socket reads end anywhere: in a size prefix, in the middle of a frame, or
after several frames. Large frames (fetch responses with records on the
client side, produce requests on the broker's) are read into a buffer of
their own; the bytes handed on must be the frame's, whatever the read
boundaries were.
"""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from josef.protocol.connection import _FrameProtocol
from josef.server.network import FrameTooLargeError, _Wire


class Recorder:
    host, port = "127.0.0.1", 0

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.failures: list[Exception] = []

    def _received(self, frame: bytes | memoryview) -> None:
        self.frames.append(bytes(frame))

    def _fail(self, error: Exception) -> None:
        self.failures.append(error)


def feed(protocol: _FrameProtocol | _Wire, data: bytes, cuts: list[int]) -> None:
    """Deliver ``data`` as the socket would, ending reads at ``cuts`` (and wherever a buffer is full)."""
    position = 0
    for end in [*cuts, len(data)]:
        while position < end:
            buffer = protocol.get_buffer(-1)
            n = min(len(buffer), end - position)
            buffer[:n] = data[position:position + n]
            protocol.buffer_updated(n)
            position += n


def framed(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def test_frames_come_out_whole_wherever_the_reads_end() -> None:
    rng = random.Random(7)
    payloads = [rng.randbytes(size) for size in (0, 1, 3, 100, 65_532, 65_533, 70_000, 3, 2_000_000, 17, 40_000)]
    data = framed(*payloads)
    for _ in range(20):
        recorder = Recorder()
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        feed(_FrameProtocol(recorder), data, cuts)
        assert recorder.frames == payloads
        assert recorder.failures == []


def test_every_byte_boundary_of_small_frames() -> None:
    payloads = [bytes([i]) * i for i in range(1, 12)]
    data = framed(*payloads)
    recorder = Recorder()
    feed(_FrameProtocol(recorder), data, list(range(1, len(data))))
    assert recorder.frames == payloads


def test_a_large_frame_reaches_the_decoder_read_only() -> None:
    """kio refuses writable buffers: a frame read into its own bytearray is handed on as a read-only view."""
    handed: list[object] = []
    recorder = Recorder()
    recorder._received = handed.append  # type: ignore[method-assign]
    feed(_FrameProtocol(recorder), framed(b"x" * 100_000), [10])
    assert len(handed) == 1
    assert isinstance(handed[0], memoryview) and handed[0].readonly


def test_a_negative_frame_size_fails_the_connection() -> None:
    recorder = Recorder()
    feed(_FrameProtocol(recorder), struct.pack(">i", -5) + b"zzzz", [])
    assert recorder.frames == []
    assert len(recorder.failures) == 1


@pytest.mark.parametrize("size", [10, 1_000_000])
def test_over_a_real_socket(size: int) -> None:
    """The protocol under a running event loop, with the kernel choosing the read sizes."""
    asyncio.run(_over_a_real_socket(size))


async def _over_a_real_socket(size: int) -> None:
    payloads = [b"a" * 10, b"b" * size, b"c" * 5]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(*payloads))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    recorder = Recorder()
    lost = asyncio.get_running_loop().create_future()
    recorder._fail = lambda error: lost.done() or lost.set_result(error)  # type: ignore[method-assign]
    transport, _ = await asyncio.get_running_loop().create_connection(lambda: _FrameProtocol(recorder),
                                                                       "127.0.0.1", port)
    await asyncio.wait_for(lost, 10)  # the server closes after writing: every frame came before the EOF
    transport.close()
    server.close()
    assert recorder.frames == payloads


# The broker's side: requests cut by josef.server.network._Wire ----------------------------------


class Transport:
    """What _Wire asks of its transport while reading: pausing and resuming."""

    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def wire(max_frame: int = 100 << 20) -> _Wire:
    return _Wire(Transport(), max_frame, "test")  # type: ignore[arg-type]


def requests_of(w: _Wire) -> list[bytes]:
    async def drain() -> list[bytes]:
        w.eof_received()
        out = []
        while (frame := await w.read_frame()) is not None:
            out.append(bytes(frame))
        return out
    return asyncio.run(drain())


def test_requests_come_out_whole_wherever_the_reads_end() -> None:
    rng = random.Random(11)
    payloads = [rng.randbytes(size) for size in (1, 3, 100, 262_140, 262_141, 300_000, 5, 1_500_000, 9, 40_000)]
    data = framed(*payloads)
    for _ in range(10):
        w = wire()
        feed(w, data, sorted(rng.sample(range(1, len(data)), 40)))
        assert requests_of(w) == payloads


def test_a_large_request_is_read_into_a_writable_buffer_of_its_own() -> None:
    """The produce handler stamps offsets into it: it must be a bytearray, not a copy made later."""
    w = wire()
    feed(w, framed(b"p" * 1_000_000, b"small"), [100])
    large, small = w._frames
    assert isinstance(large, bytearray) and len(large) == 1_000_000
    assert small == b"small"


def test_a_request_over_the_limit_fails_the_connection_after_the_ones_before_it() -> None:
    w = wire(max_frame=1000)
    feed(w, framed(b"ok") + struct.pack(">i", 5000) + b"x" * 100, [])
    assert w.transport.paused

    async def read() -> None:
        assert await w.read_frame() == b"ok"
        with pytest.raises(FrameTooLargeError):
            await w.read_frame()
    asyncio.run(read())


def test_reading_pauses_while_too_much_waits_unread() -> None:
    w = wire()
    w.READ_BUFFER_BYTES = 1000
    feed(w, framed(*[b"r" * 400] * 4), [])
    assert w.transport.paused

    async def read() -> None:
        for _ in range(3):
            await w.read_frame()
    asyncio.run(read())
    assert not w.transport.paused
