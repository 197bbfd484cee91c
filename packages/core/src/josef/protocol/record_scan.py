"""What the log cleaner and compacted-topic validation need from each record of a v2 batch, and nothing more.

Record-level work on the broker is rare (see :mod:`josef.protocol.records`),
but the log cleaner must look at every key, and a produce to a compacted
topic must find records without one. :func:`scan_records` reads exactly
that: per record its offset and timestamp deltas, its key, whether its value
is null (a tombstone) and its byte span, so a cleaner can copy kept records
verbatim. Headers and values are skipped, never decoded.

Deliberately one tight loop of inline varint decoding: a helper call per
varint would cost more than the decoding. One- and two-byte varints (every
length below 8 KiB) are decoded inline, longer ones by a loop.
"""

from __future__ import annotations

from josef.protocol.codecs import decompress
from josef.protocol.records import HEADER, HEADER_SIZE, LOG_OVERHEAD, CorruptRecordError, _varint

#: Fields of one scanned record.
OFFSET_DELTA, TIMESTAMP_DELTA, KEY, TOMBSTONE, START, END = range(6)
ScannedRecord = tuple[int, int, "bytes | None", bool, int, int]


def batch_body(batch: bytes | bytearray | memoryview, pos: int = 0) -> tuple[bytes, int, int, int]:
    """``(body, start, end, record count)`` of the batch at ``batch[pos:]``: its records, decompressed if needed.

    Uncompressed batches are not copied when ``batch`` is ``bytes`` (the
    records are then ``body[start:end]`` of the buffer itself).
    """
    fields = HEADER.unpack_from(batch, pos)
    end = pos + fields[1] + LOG_OVERHEAD
    codec = fields[5] & 0x07
    if codec:
        try:
            body = decompress(codec, bytes(batch[pos + HEADER_SIZE : end]))
        except Exception as exc:
            raise CorruptRecordError(f"cannot decompress the batch at offset {fields[0]} (codec {codec}): {exc}") from exc
        return body, 0, len(body), fields[12]
    if not isinstance(batch, bytes):
        batch = bytes(batch[pos:end])
        return batch, HEADER_SIZE, len(batch), fields[12]
    return batch, pos + HEADER_SIZE, end, fields[12]


def scan_records(body: bytes, start: int, end: int, count: int) -> list[ScannedRecord]:
    """``(offset delta, timestamp delta, key, value is null, start, end)`` of the ``count`` records in ``body[start:end]``.

    ``body`` holds uncompressed records (:func:`batch_body`); ``start`` and
    ``end`` of each record span its length prefix too. Raises
    :class:`~josef.protocol.records.CorruptRecordError` when the records do
    not fill the span exactly.
    """
    out: list[ScannedRecord] = []
    append = out.append
    p = start
    try:
        for _ in range(count):
            record_start = p
            b = body[p]  # length
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                b = (b & 0x7F) | ((c & 0x7F) << 7)
                if c > 0x7F:
                    b, p = _rest(body, p, b)
            record_end = p + ((b >> 1) ^ -(b & 1))
            b = body[p + 1]  # timestamp delta, after the attributes byte
            p += 2
            if b > 0x7F:
                c = body[p]
                p += 1
                b = (b & 0x7F) | ((c & 0x7F) << 7)
                if c > 0x7F:
                    b, p = _rest(body, p, b)
            timestamp_delta = (b >> 1) ^ -(b & 1)
            b = body[p]  # offset delta
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                b = (b & 0x7F) | ((c & 0x7F) << 7)
                if c > 0x7F:
                    b, p = _rest(body, p, b)
            offset_delta = (b >> 1) ^ -(b & 1)
            b = body[p]  # key length
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                b = (b & 0x7F) | ((c & 0x7F) << 7)
                if c > 0x7F:
                    b, p = _rest(body, p, b)
            if b & 1:
                key = None
            else:
                b >>= 1
                key = body[p : p + b]
                p += b
            b = body[p]  # value length: only whether it is -1 (null), encoded 0x01 or padded (0x81 0x00)
            if b > 0x7F:
                c = body[p + 1]
                b = _rest(body, p + 2, (b & 0x7F) | ((c & 0x7F) << 7))[0] if c > 0x7F else (b & 0x7F) | (c << 7)
            append((offset_delta, timestamp_delta, key, b == 1, record_start, record_end))
            p = record_end
    except IndexError:
        raise CorruptRecordError(f"records end inside a record at byte {p}") from None
    if p != end:
        raise CorruptRecordError(f"{count} records end at byte {p}, not at the batch's end {end}")
    return out


def scan_keys(body: bytes, start: int, end: int, count: int) -> list[tuple[int, bytes | None]]:
    """``(offset delta, key)`` of the ``count`` records in ``body[start:end]``: :func:`scan_records` without the rest.

    What the cleaner's offset map and the null-key check of compacted topics
    need; the timestamp is skipped undecoded and the value never looked at.
    """
    out: list[tuple[int, bytes | None]] = []
    append = out.append
    p = start
    try:
        for _ in range(count):
            b = body[p]  # length
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                b = (b & 0x7F) | ((c & 0x7F) << 7)
                if c > 0x7F:
                    b, p = _rest(body, p, b)
            record_end = p + ((b >> 1) ^ -(b & 1))
            p += 1  # attributes
            while body[p] > 0x7F:  # timestamp delta, skipped
                p += 1
            b = body[p + 1]  # offset delta
            p += 2
            if b > 0x7F:
                c = body[p]
                p += 1
                b = (b & 0x7F) | ((c & 0x7F) << 7)
                if c > 0x7F:
                    b, p = _rest(body, p, b)
            offset_delta = (b >> 1) ^ -(b & 1)
            b = body[p]  # key length
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                b = (b & 0x7F) | ((c & 0x7F) << 7)
                if c > 0x7F:
                    b, p = _rest(body, p, b)
            if b & 1:
                append((offset_delta, None))
            else:
                append((offset_delta, body[p : p + (b >> 1)]))
            p = record_end
    except IndexError:
        raise CorruptRecordError(f"records end inside a record at byte {p}") from None
    if p != end:
        raise CorruptRecordError(f"{count} records end at byte {p}, not at the batch's end {end}")
    return out


def _rest(buf: bytes, pos: int, result: int) -> tuple[int, int]:
    """A varint longer than two bytes: ``result`` holds its first 14 bits, ``pos`` is at its third byte."""
    shift = 14
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")


def with_timestamp_delta(body: bytes, start: int, end: int, timestamp_delta: int) -> bytes:
    """The record at ``body[start:end]`` with another timestamp delta (a batch whose base timestamp changes).

    Everything after the delta is copied as it is; the length prefix is
    rewritten. The log cleaner needs this when it moves a batch's base
    timestamp to the batch's delete horizon (KIP-534).
    """
    p = start
    while body[p] > 0x7F:  # length
        p += 1
    p += 2  # last length byte, attributes
    attributes_at = p - 1
    while body[p] > 0x7F:  # old timestamp delta
        p += 1
    inner = body[attributes_at : attributes_at + 1] + _varint(timestamp_delta) + body[p + 1 : end]
    return _varint(len(inner)) + inner
