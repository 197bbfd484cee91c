"""The wire's primitive types, read and written directly: for the codecs of the hot APIs.

Produce and Fetch carry one entry per partition, and a broker answers
thousands of them a second. Going through kio's generic reader and writer
(and its frozen dataclasses) costs several microseconds per partition entry,
which is what made a node collapse under many partitions and small requests.
:mod:`josef.protocol.fetch_codec` and :mod:`josef.protocol.produce_codec`
read and write those two APIs with these helpers instead; every other API
keeps kio. The codecs are tested byte for byte against kio at every version.

Readers take ``(buffer, position)`` and return ``(value, new position)``;
anything that runs past the end of the frame, or claims more than the frame
holds, raises :class:`josef.protocol.messages.MalformedRequestError`, as a
frame kio cannot parse does.
"""

from __future__ import annotations

import struct
import uuid
from typing import Sequence

from josef.protocol.messages import MalformedRequestError

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
UUID = struct.Struct(">16s")

Buffer = bytes | bytearray | memoryview


def uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """An unsigned varint (lengths, counts and tags of flexible versions)."""
    try:
        byte = buf[pos]
        if byte < 0x80:
            return byte, pos + 1
        value, shift = byte & 0x7F, 7
        while True:
            pos += 1
            byte = buf[pos]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos + 1
            shift += 7
            if shift > 28:
                raise MalformedRequestError("unsigned varint longer than 5 bytes")
    except IndexError:
        raise MalformedRequestError("frame ends inside a varint") from None


def write_uvarint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]


def unpack(fmt: struct.Struct, buf: Buffer, pos: int) -> tuple[tuple[int, ...], int]:
    """``fmt``'s fields at ``pos``."""
    try:
        return fmt.unpack_from(buf, pos), pos + fmt.size
    except struct.error:
        raise MalformedRequestError(f"frame ends inside a field at byte {pos}") from None


def array_length(buf: Buffer, pos: int, flexible: bool, element_size: int = 1) -> tuple[int, int]:
    """An array's element count (-1 for null), refused when the frame cannot hold that many elements."""
    if flexible:
        n, pos = uvarint(buf, pos)
        n -= 1
    else:
        (n,), pos = unpack(I32, buf, pos)
    if n * element_size > len(buf) - pos:
        raise MalformedRequestError(f"array of {n} elements does not fit in the {len(buf) - pos} bytes left")
    return n, pos


def blob(buf: Buffer, pos: int, flexible: bool, wide: bool = False) -> tuple[memoryview | None, int]:
    """A nullable length-prefixed byte run (a string's bytes, or records: ``wide`` for an int32 length)."""
    if flexible:
        n, pos = uvarint(buf, pos)
        n -= 1
    else:
        (n,), pos = unpack(I32 if wide else I16, buf, pos)
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise MalformedRequestError(f"a field of {n} bytes runs past the end of the frame")
    return memoryview(buf)[pos : pos + n], pos + n


def string(buf: Buffer, pos: int, flexible: bool) -> tuple[str | None, int]:
    data, pos = blob(buf, pos, flexible)
    if data is None:
        return None, pos
    try:
        return str(data, "utf-8"), pos
    except UnicodeDecodeError as exc:
        raise MalformedRequestError(f"string is not UTF-8: {exc}") from None


def read_uuid(buf: Buffer, pos: int) -> tuple[uuid.UUID | None, int]:
    """A topic id; the zero UUID reads as None, as kio reads it."""
    (raw,), pos = unpack(UUID, buf, pos)
    return (None if raw == _ZERO_UUID else uuid.UUID(bytes=raw)), pos


_ZERO_UUID = bytes(16)


def skip_tags(buf: Buffer, pos: int) -> tuple[dict[int, memoryview], int]:
    """The tagged fields at ``pos``, by tag (their raw bytes): the caller reads the ones it knows."""
    count, pos = uvarint(buf, pos)
    if not count:
        return _NO_TAGS, pos
    tags = {}
    for _ in range(count):
        tag, pos = uvarint(buf, pos)
        size, pos = uvarint(buf, pos)
        if pos + size > len(buf):
            raise MalformedRequestError(f"tagged field {tag} runs past the end of the frame")
        tags[tag] = memoryview(buf)[pos : pos + size]
        pos += size
    return tags, pos


_NO_TAGS: dict[int, memoryview] = {}


def write_string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    data = value.encode()
    return (write_uvarint(len(data) + 1) if flexible else I16.pack(len(data))) + data


def write_length(n: int, flexible: bool) -> bytes:
    """An array's (or records') length prefix; -1 for null."""
    return write_uvarint(n + 1) if flexible else I32.pack(n)


def write_uuid(value: uuid.UUID | None) -> bytes:
    return _ZERO_UUID if value is None else value.bytes


def write_tags(tags: list[tuple[int, bytes]]) -> bytes:
    """Tagged fields, in the order given (ascending tags), each as tag, size, bytes."""
    if not tags:
        return b"\x00"
    return write_uvarint(len(tags)) + b"".join(write_uvarint(tag) + write_uvarint(len(data)) + data
                                               for tag, data in tags)


def write_node_endpoints(endpoints: Sequence[tuple[int, str, int, str | None]]) -> bytes:
    """KIP-951's NodeEndpoints tag (Produce and Fetch): id, host, port, rack of each leader named."""
    return write_uvarint(len(endpoints) + 1) + b"".join(
        I32.pack(node_id) + write_string(host, True) + I32.pack(port) + write_string(rack, True) + b"\x00"
        for node_id, host, port, rack in endpoints)


def writable(buf: bytes | bytearray | memoryview) -> bool:
    """Whether ``buf`` can be written into: a large request's own buffer (see :mod:`josef.protocol.frames`)."""
    return isinstance(buf, bytearray) or (isinstance(buf, memoryview) and not buf.readonly)
