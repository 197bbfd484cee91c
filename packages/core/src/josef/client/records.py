"""Fetched record batches turned into :class:`ConsumerRecord` objects: the consumer's only per-record loop.

The broker hands back whole batches exactly as producers wrote them, so this
is where a consumer pays for Python: :func:`decode_batch` reads one batch's
records in a single function with the varints decoded inline (one-byte
varints, the common case, never leave the loop), and builds each record with
nothing more than storing its nine slots.

:class:`FetchedPartition` wraps one partition's part of a fetch response and
hands its records out in pieces (``max.poll.records``), skipping what a
consumer must never see: records below the fetch position (a batch may start
earlier than the offset asked for), control batches, and, for
``read_committed``, batches of aborted transactions.
"""

from __future__ import annotations

import heapq
import struct
from typing import Any, Callable, Iterable, NamedTuple

import crc32c

from josef.protocol.codecs import decompress
from josef.protocol.records import (
    CONTROL_BIT,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    CorruptRecordError,
)

__all__ = ["ConsumerRecord", "CorruptRecordError", "FetchedPartition", "RecordDeserializationError", "decode_batch"]

Deserializer = Callable[[bytes | None], Any]

#: timestamp_type values, as Kafka's TimestampType ids.
CREATE_TIME, LOG_APPEND_TIME = 0, 1
#: Control record types (the key's second int16).
ABORT_MARKER, COMMIT_MARKER = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()


class ConsumerRecord(NamedTuple):
    """One record as :meth:`AsyncConsumer.poll` returns it.

    ``key`` and ``value`` are bytes (``None`` for null) unless a
    ``key.deserializer``/``value.deserializer`` is configured, in which case
    they are what it returned. ``timestamp_type`` is 0 for CreateTime (the
    producer's clock) and 1 for LogAppendTime (the broker's). ``leader_epoch``
    is the epoch of the leader that wrote the batch (-1 when unknown).

    A named tuple, not an attrs class: building one is the consumer's only
    per-record cost besides varints, and a tuple is built in one call.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes | None], ...]
    leader_epoch: int




class RecordDeserializationError(ValueError):
    """A deserialiser raised; ``offset`` tells where, so the caller can seek past the record."""

    def __init__(self, topic: str, partition: int, offset: int, cause: BaseException) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(f"cannot deserialise the record at {topic}-{partition}@{offset}: {cause!r}")


def _uvarint_rest(buf: bytes, pos: int, result: int) -> tuple[int, int]:
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


def decode_batch(
    buf: bytes,
    pos: int,
    topic: str,
    partition: int,
    min_offset: int = 0,
    check_crc: bool = True,
    key_deserializer: Deserializer | None = None,
    value_deserializer: Deserializer | None = None,
) -> list[ConsumerRecord]:
    """The records of the batch at ``buf[pos:]`` with offsets >= ``min_offset``, decompressed and decoded.

    Deliberately one long function: a helper call per varint would cost more
    than the decoding itself, so varints of one and two bytes (every length
    below 8 KiB) are decoded inline and only longer ones call
    :func:`_uvarint_rest`. ``buf`` must hold the whole batch.
    """
    (base_offset, length, leader_epoch, magic, crc, attributes, _last_delta, base_ts, max_ts,
     _pid, _pepoch, _bseq, count) = HEADER.unpack_from(buf, pos)
    end = pos + LOG_OVERHEAD + length
    if magic != 2:
        raise CorruptRecordError(f"record batch magic {magic} at offset {base_offset} is not supported (only v2)")
    if end > len(buf):
        raise CorruptRecordError(f"the batch at offset {base_offset} of {topic}-{partition} is truncated")
    if check_crc and crc32c.crc32c(memoryview(buf)[pos + CRC_START : end]) != crc:
        raise CorruptRecordError(f"CRC-32C mismatch in the batch at offset {base_offset} of {topic}-{partition}")
    codec = attributes & 0x07
    if codec:
        try:
            body: bytes = decompress(codec, buf[pos + HEADER_SIZE : end])
        except Exception as exc:
            raise CorruptRecordError(f"cannot decompress the batch at offset {base_offset} (codec {codec}): {exc}") from exc
        p, body_end = 0, len(body)
    else:
        body, p, body_end = buf, pos + HEADER_SIZE, end
    append_time = bool(attributes & TIMESTAMP_TYPE_BIT)
    ts_type = LOG_APPEND_TIME if append_time else CREATE_TIME
    deserialize = key_deserializer is not None or value_deserializer is not None
    out: list[ConsumerRecord] = []
    append = out.append
    new, cls = tuple.__new__, ConsumerRecord
    rest = _uvarint_rest
    offset = base_offset
    try:
        for _ in range(count):
            # Each varint: b is the unsigned value, then zig-zag decoded.
            b = body[p]  # length
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                if c > 0x7F:
                    b, p = rest(body, p, (b & 0x7F) | ((c & 0x7F) << 7))
                else:
                    b = (b & 0x7F) | (c << 7)
            record_end = p + ((b >> 1) ^ -(b & 1))
            b = body[p + 1]  # skip the attributes byte; timestampDelta
            p += 2
            if b > 0x7F:
                c = body[p]
                p += 1
                if c > 0x7F:
                    b, p = rest(body, p, (b & 0x7F) | ((c & 0x7F) << 7))
                else:
                    b = (b & 0x7F) | (c << 7)
            timestamp = max_ts if append_time else base_ts + ((b >> 1) ^ -(b & 1))
            b = body[p]  # offsetDelta
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                if c > 0x7F:
                    b, p = rest(body, p, (b & 0x7F) | ((c & 0x7F) << 7))
                else:
                    b = (b & 0x7F) | (c << 7)
            offset = base_offset + ((b >> 1) ^ -(b & 1))
            if offset < min_offset:
                p = record_end
                continue
            b = body[p]  # key length
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                if c > 0x7F:
                    b, p = rest(body, p, (b & 0x7F) | ((c & 0x7F) << 7))
                else:
                    b = (b & 0x7F) | (c << 7)
            if b & 1:
                key = None  # -1
            else:
                b >>= 1
                key = body[p : p + b]
                p += b
            b = body[p]  # value length
            p += 1
            if b > 0x7F:
                c = body[p]
                p += 1
                if c > 0x7F:
                    b, p = rest(body, p, (b & 0x7F) | ((c & 0x7F) << 7))
                else:
                    b = (b & 0x7F) | (c << 7)
            if b & 1:
                value = None
            else:
                b >>= 1
                value = body[p : p + b]
                p += b
            b = body[p]  # header count
            p += 1
            if b == 0:
                headers = _NO_HEADERS
            else:
                if b > 0x7F:
                    b, p = _uvarint_from(body, p - 1)
                headers, p = _read_headers(body, p, (b >> 1) ^ -(b & 1), offset)
            if p != record_end:
                raise CorruptRecordError(f"the record at offset {offset} of {topic}-{partition} does not match its length")
            if deserialize:
                try:
                    if key_deserializer is not None:
                        key = key_deserializer(key)
                    if value_deserializer is not None:
                        value = value_deserializer(value)
                except Exception as exc:
                    raise RecordDeserializationError(topic, partition, offset, exc) from exc
            append(new(cls, (topic, partition, offset, timestamp, ts_type, key, value, headers, leader_epoch)))
    except IndexError:
        raise CorruptRecordError(f"the batch at offset {base_offset} of {topic}-{partition} ends inside a record") from None
    if p != body_end:
        raise CorruptRecordError(
            f"the batch at offset {base_offset} of {topic}-{partition} does not end after its {count} records")
    return out


def _uvarint_from(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of any length at ``pos``; returns (value, next position)."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")


def _read_headers(body: bytes, p: int, count: int, offset: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """A record's headers: rarer than keys and values, so out of the hot loop."""
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        n, p = _uvarint_from(body, p)
        n = (n >> 1) ^ -(n & 1)
        if n < 0:
            raise CorruptRecordError(f"null header key in the record at offset {offset}")
        hkey = str(body[p : p + n], "utf-8")
        p += n
        n, p = _uvarint_from(body, p)
        n = (n >> 1) ^ -(n & 1)
        if n < 0:
            headers.append((hkey, None))
        else:
            headers.append((hkey, body[p : p + n]))
            p += n
    return tuple(headers), p


def control_type(buf: bytes, pos: int) -> int:
    """ABORT_MARKER or COMMIT_MARKER: the type in the key of a control batch's record (-1 if unreadable)."""
    records = decode_batch(buf, pos, "", -1, check_crc=False)
    if not records or records[0].key is None or len(records[0].key) < 4:
        return -1
    return _CONTROL_KEY.unpack_from(records[0].key)[1]


class FetchedPartition:
    """One partition's records from one fetch response, consumed in pieces by successive polls.

    ``next_offset`` is where the consumer's position goes once everything
    taken so far is returned: past skipped control and aborted batches too,
    so a poll that yields no record still makes progress.

    Aborted transactions (``read_committed``) are dropped as the Java client
    does, per batch: the response lists ``(producer_id, first_offset)`` of
    transactions aborted in the fetched range. Walking the batches in order,
    every listed transaction whose first offset is at or before the batch's
    last offset marks its producer as aborted; a transactional batch of an
    aborted producer is skipped; that producer's ABORT control batch ends the
    aborted run. Control batches themselves are never returned.
    """

    __slots__ = ("topic", "partition", "tp", "fetch_offset", "generation", "next_offset", "high_watermark",
                 "_buf", "_pos", "_records", "_index", "_check_crc", "_key_deserializer",
                 "_value_deserializer", "_aborted", "_aborted_producers", "_read_committed", "_batch_next")

    def __init__(
        self,
        tp: Any,
        buf: bytes,
        fetch_offset: int,
        *,
        generation: int = 0,
        high_watermark: int = -1,
        aborted_transactions: Iterable[tuple[int, int]] | None = None,
        read_committed: bool = False,
        check_crc: bool = True,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
    ) -> None:
        self.tp = tp
        self.topic, self.partition = tp.topic, tp.partition
        self.fetch_offset = fetch_offset
        self.generation = generation
        self.next_offset = fetch_offset
        self.high_watermark = high_watermark
        self._buf = bytes(buf) if not isinstance(buf, bytes) else buf
        self._pos = 0
        self._records: list[ConsumerRecord] = []
        self._index = 0
        self._check_crc = check_crc
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._read_committed = read_committed
        self._aborted: list[tuple[int, int]] = [(first, pid) for pid, first in aborted_transactions or ()]
        heapq.heapify(self._aborted)
        self._aborted_producers: set[int] = set()
        self._batch_next = fetch_offset

    @property
    def exhausted(self) -> bool:
        return self._index >= len(self._records) and not self._next_batch_available()

    def _next_batch_available(self) -> bool:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            return False
        return pos + LOG_OVERHEAD + HEADER.unpack_from(buf, pos)[1] <= len(buf)

    def take(self, max_records: int) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, in offset order; advances ``next_offset`` past them."""
        out: list[ConsumerRecord] = []
        while len(out) < max_records:
            if self._index < len(self._records):
                chunk = self._records[self._index : self._index + max_records - len(out)]
                self._index += len(chunk)
                out.extend(chunk)
                self.next_offset = chunk[-1].offset + 1
                if self._index < len(self._records):
                    break
                # The batch is done: skip past its end even if its last records were compacted away.
                self.next_offset = max(self.next_offset, self._batch_next)
                continue
            try:
                if not self._load_next_batch():
                    break
            except Exception:
                if out:  # return what decoded; the next take() meets the bad batch again
                    break
                raise
        return out

    def _load_next_batch(self) -> bool:
        """Decode the next batch that has anything to return; False when the buffer is used up."""
        buf = self._buf
        while True:
            pos = self._pos
            if len(buf) - pos < HEADER_SIZE:
                return False
            (base_offset, length, _epoch, _magic, _crc, attributes, last_delta, _bts, _mts,
             pid, _pe, _bs, _count) = HEADER.unpack_from(buf, pos)
            end = pos + LOG_OVERHEAD + length
            if end > len(buf):
                return False  # a partial batch at the end of the response: fetched again next time
            last_offset = base_offset + last_delta
            if last_offset < self.next_offset:
                self._pos = end
                continue  # wholly before the position (the broker returns whole batches)
            if self._read_committed and pid >= 0:
                aborted = self._aborted
                while aborted and aborted[0][0] <= last_offset:
                    self._aborted_producers.add(heapq.heappop(aborted)[1])
                if attributes & CONTROL_BIT:
                    if control_type(buf, pos) == ABORT_MARKER:
                        self._aborted_producers.discard(pid)
                elif attributes & TRANSACTIONAL_BIT and pid in self._aborted_producers:
                    self._pos = end
                    self.next_offset = last_offset + 1
                    continue
            if attributes & CONTROL_BIT:
                self._pos = end
                self.next_offset = last_offset + 1
                continue
            records = decode_batch(buf, pos, self.topic, self.partition, self.next_offset, self._check_crc,
                                   self._key_deserializer, self._value_deserializer)
            self._pos = end  # only now: a batch that fails to decode is met again by the next take()
            self._batch_next = last_offset + 1
            if not records:
                self.next_offset = last_offset + 1
                continue
            self._records, self._index = records, 0
            return True

