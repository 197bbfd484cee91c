"""Kafka record batches (magic v2): validation, offset assignment, encoding and decoding.

The broker treats a batch as an opaque block behind a 61-byte header: it
checks the header and the CRC-32C, writes the base offset and leader epoch
(neither is covered by the CRC) and reads the max timestamp. Nothing here
loops over records on the broker's produce or fetch path.

Records are encoded (:func:`encode_record`, :func:`seal_batch`,
:func:`build_batch`) and decoded (:func:`decode_batch`) here once, for
every side that needs them: the client's producer and consumer, and the
broker's few record-level paths (ListOffsets by timestamp, the metadata
log, coordinator state, forced recompression).
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import attrs
import crc32c

from josef.protocol.codecs import Compression, compress, decompress

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
#: baseOffset and batchLength: what must be read to find the next batch.
LOG_OVERHEAD = 12
#: Offset of the attributes field: the CRC covers attributes .. end of batch.
CRC_START = 21
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_MAX_TS = struct.Struct(">q")

TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
NO_TIMESTAMP = -1
#: Producer sequence numbers run 0 .. Int.MAX and then start again at 0.
SEQUENCE_WRAP = 2**31


class CorruptRecordError(ValueError):
    """A batch failed validation: bad length, magic, CRC or codec (CORRUPT_MESSAGE)."""


class RecordTooLargeError(ValueError):
    """A batch is larger than the topic's max.message.bytes (MESSAGE_TOO_LARGE)."""


class InvalidRecordError(ValueError):
    """A batch is well-formed but not acceptable here (INVALID_RECORD)."""


class RecordErrors(InvalidRecordError):
    """Some records of a batch are not acceptable here (INVALID_RECORD with KIP-467's per-record errors).

    ``errors`` holds ``(index of the record in its batch, why)``, which the
    produce response lists, so a client can fail just those records. The
    message is Kafka's (``LogValidator.processRecordErrors``).
    """

    def __init__(self, errors: list[tuple[int, str]]) -> None:
        self.errors = errors
        shown = ", ".join(f"RecordError(batchIndex={index}, message='{why}')" for index, why in errors[:3])
        super().__init__(f"One or more records have been rejected due to {len(errors)} record errors in total, "
                         f"and only showing the first three errors at most: [{shown}]")


@attrs.frozen
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
        return cls(*HEADER.unpack_from(buf, pos))

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)


@attrs.frozen
class BatchInfo:
    """Where one appended batch sits, for the indexes."""

    position: int  # byte position inside the appended buffer
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int


@attrs.frozen
class ProducerBatch:
    """The idempotence fields of one appended batch (producerId >= 0), read from its header.

    :mod:`josef.producer.producer_state` checks and records these per batch; the
    last sequence is derived, never read from records.
    """

    producer_id: int
    producer_epoch: int
    base_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int
    #: Part of a transaction (attributes bit 4).
    transactional: bool = False
    #: A transaction marker (control batch): ABORT_MARKER or COMMIT_MARKER; -1 for data.
    marker: int = -1
    #: The transaction coordinator's epoch a marker carries in its value.
    coordinator_epoch: int = -1

    @property
    def last_sequence(self) -> int:
        """``baseSequence + lastOffsetDelta``, wrapping from Int.MAX to 0 as Kafka's sequences do."""
        return (self.base_sequence + self.last_offset - self.first_offset) % SEQUENCE_WRAP


@attrs.frozen
class AppendInfo:
    """What validation learnt about a produce buffer; the log needs it for its indexes."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    record_count: int
    batches: tuple[BatchInfo, ...]
    #: The batches that carry a producer id, in order (empty for plain producers).
    producer_ids: tuple[ProducerBatch, ...] = ()


def validate_and_assign(
    buf: bytearray | memoryview,
    next_offset: int,
    leader_epoch: int,
    max_batch_bytes: int,
    log_append_time_ms: int | None = None,
) -> AppendInfo:
    """Validate every batch in ``buf`` and assign offsets from ``next_offset``, in place.

    ``log_append_time_ms`` set means the topic uses LogAppendTime: each batch's
    max timestamp becomes that time and its CRC is recomputed.
    """
    view = memoryview(buf)
    pos = 0
    end = len(buf)
    first = next_offset
    max_ts = NO_TIMESTAMP
    max_ts_offset = -1
    count = 0
    batches = []
    producers = []
    if end == 0:
        raise InvalidRecordError("produce request carries no record batch")
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise CorruptRecordError(f"truncated batch at byte {pos}: {end - pos} bytes left, header needs {HEADER_SIZE}")
        (_, length, _, magic, crc, attributes, last_delta, _, batch_max_ts, pid, pepoch, bseq, nrecords) = HEADER.unpack_from(buf, pos)
        size = length + LOG_OVERHEAD
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise CorruptRecordError(f"batch at byte {pos} claims {length} bytes, {end - pos - LOG_OVERHEAD} present")
        if magic != 2:
            raise CorruptRecordError(f"record batch magic {magic} is not supported (only v2)")
        if crc32c.crc32c(view[pos + CRC_START : pos + size]) != crc:
            raise CorruptRecordError(f"CRC-32C mismatch in batch at byte {pos}")
        if attributes & 0x07 > Compression.ZSTD:
            raise CorruptRecordError(f"unknown compression codec {attributes & 0x07}")
        if attributes & CONTROL_BIT:
            raise InvalidRecordError("clients may not produce control batches")
        if nrecords != last_delta + 1 or nrecords <= 0:
            raise InvalidRecordError(f"batch holds {nrecords} records but lastOffsetDelta is {last_delta}")
        if pid >= 0 and bseq < 0:
            raise InvalidRecordError(f"batch of producer {pid} has invalid sequence number {bseq}")
        if size > max_batch_bytes:
            raise RecordTooLargeError(f"batch of {size} bytes exceeds max.message.bytes {max_batch_bytes}")
        _OFFSET_AND_LENGTH.pack_into(buf, pos, next_offset, length)
        _EPOCH.pack_into(buf, pos + 12, leader_epoch)
        if log_append_time_ms is not None:
            buf[pos + CRC_START + 1] |= TIMESTAMP_TYPE_BIT
            _MAX_TS.pack_into(buf, pos + 35, log_append_time_ms)
            _CRC.pack_into(buf, pos + 17, crc32c.crc32c(view[pos + CRC_START : pos + size]))
            batch_max_ts = log_append_time_ms
        last = next_offset + last_delta
        if batch_max_ts > max_ts:
            max_ts, max_ts_offset = batch_max_ts, last
        batches.append(BatchInfo(pos, size, next_offset, last, batch_max_ts))
        if pid >= 0:
            producers.append(ProducerBatch(pid, pepoch, bseq, next_offset, last, batch_max_ts,
                                           bool(attributes & TRANSACTIONAL_BIT)))
        count += nrecords
        next_offset = last + 1
        pos += size
    view.release()
    return AppendInfo(first, next_offset - 1, max_ts, max_ts_offset, count, tuple(batches), tuple(producers))


def describe_batches(buf: bytes | bytearray | memoryview, next_offset: int, max_epoch: int | None = None) -> AppendInfo:
    """Check batches that already carry their offsets (a follower's fetch, a Raft log) and describe them.

    Unlike :func:`validate_and_assign` nothing is rewritten: a replica
    stores its leader's batches byte for byte. Each batch must be whole,
    pass its magic and CRC checks and start where the previous one ended;
    one header read per batch, never per record. Leader epochs must not go
    down, nor above ``max_epoch`` (the epoch of the leader they came from).
    """
    batches = []
    epoch = -1
    producers = []
    first = next_offset
    max_ts, max_ts_offset = NO_TIMESTAMP, -1
    count = 0
    pos = 0
    for pos, header in iter_batches(buf):
        if not batch_is_valid(buf, pos, header):
            raise CorruptRecordError(f"batch at offset {header.base_offset} fails its CRC or magic check")
        if header.base_offset != next_offset:
            raise InvalidRecordError(f"batch starts at offset {header.base_offset}, expected {next_offset}")
        if header.partition_leader_epoch < epoch or (max_epoch is not None and header.partition_leader_epoch > max_epoch):
            raise InvalidRecordError(f"batch at offset {header.base_offset} has leader epoch {header.partition_leader_epoch} "
                                     f"out of order (previous {epoch}, leader {max_epoch})")
        epoch = header.partition_leader_epoch
        batches.append(BatchInfo(pos, header.size, header.base_offset, header.last_offset, header.max_timestamp))
        if header.max_timestamp > max_ts:
            max_ts, max_ts_offset = header.max_timestamp, header.last_offset
        if header.producer_id >= 0:
            producers.append(producer_batch(buf, pos, header))
        count += header.records_count
        next_offset = header.last_offset + 1
    if not batches or batches[-1].position + batches[-1].size != len(buf):
        raise CorruptRecordError(f"{len(buf)} bytes are not whole record batches")
    return AppendInfo(first, next_offset - 1, max_ts, max_ts_offset, count, tuple(batches), tuple(producers))


def producer_batch(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> ProducerBatch:
    """The producer fields of a batch already in a log; a marker's type and coordinator epoch are read from its record."""
    marker, coordinator_epoch = control_marker(buf, pos) if header.is_control else (-1, -1)
    return ProducerBatch(header.producer_id, header.producer_epoch, header.base_sequence, header.base_offset,
                         header.last_offset, header.max_timestamp, header.is_transactional, marker, coordinator_epoch)


def iter_batches(buf: bytes | bytearray | memoryview, pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` of each complete batch in ``buf``; stops at a partial tail."""
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        header = BatchHeader.parse(buf, pos)
        if pos + header.size > end:
            return
        yield pos, header
        pos += header.size


def batch_is_valid(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether a stored batch is intact (magic and CRC): used by log recovery."""
    return header.magic == 2 and header.batch_length >= HEADER_SIZE - LOG_OVERHEAD and (
        crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + header.size]) == header.crc
    )


# ---------------------------------------------------------------- records

Deserializer = Callable[[bytes | None], Any]
#: timestamp_type values, as Kafka's TimestampType ids.
CREATE_TIME, LOG_APPEND_TIME = 0, 1
#: Control record types (the key's second int16).
ABORT_MARKER, COMMIT_MARKER = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_KEY_EPOCH = struct.Struct(">hi")
_NO_RECORD_HEADERS: tuple[tuple[str, bytes | None], ...] = ()


class ConsumerRecord(NamedTuple):
    """One decoded record, as a consumer's ``poll`` returns it (Kafka's name for it).

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
                headers = _NO_RECORD_HEADERS
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


def control_type(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """ABORT_MARKER or COMMIT_MARKER: the type in the key of a control batch's record (-1 if unreadable)."""
    return control_marker(buf, pos)[0]


def control_marker(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """``(type, coordinator epoch)`` of the control batch at ``pos``; ``(-1, -1)`` if unreadable.

    The key is ``version int16, type int16``; a transaction marker's value
    is ``version int16, coordinatorEpoch int32``.
    """
    size = BatchHeader.parse(buf, pos).size
    records = decode_batch(bytes(buf[pos : pos + size]), 0, "", -1, check_crc=False)
    if not records or records[0].key is None or len(records[0].key) < 4:
        return -1, -1
    kind = _CONTROL_KEY.unpack_from(records[0].key)[1]
    value = records[0].value
    return kind, _CONTROL_KEY_EPOCH.unpack_from(value)[1] if value is not None and len(value) >= 6 else -1


def build_marker(producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool, timestamp: int,
                 *, base_offset: int = 0, leader_epoch: int = -1) -> bytes:
    """A transaction marker: a transactional control batch of one record (REFERENCE.md's control batch layout)."""
    key = _CONTROL_KEY.pack(0, COMMIT_MARKER if commit else ABORT_MARKER)
    value = _CONTROL_KEY_EPOCH.pack(0, coordinator_epoch)
    return build_batch([(key, value, timestamp)], base_offset=base_offset, producer_id=producer_id,
                       producer_epoch=producer_epoch, attributes=TRANSACTIONAL_BIT | CONTROL_BIT, leader_epoch=leader_epoch)


def iter_records(batch: bytes | bytearray | memoryview) -> list[ConsumerRecord]:
    """The records of one whole batch, decompressed, without a CRC check (the caller validated the batch)."""
    return decode_batch(bytes(batch), 0, "", -1, check_crc=False)


_SMALL_VARINTS = [bytes([(n << 1) & 0xFF]) if n >= 0 else b"" for n in range(64)]


def _varint(value: int) -> bytes:
    if 0 <= value < 64:
        return _SMALL_VARINTS[value]
    value = (value << 1) ^ (value >> 63)
    if value < 0x4000:  # two bytes: record lengths and offset deltas of ordinary batches
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_NULL = _varint(-1)
_NO_HEADERS = b"\x00"


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                  headers: Sequence[tuple[str, bytes | None]] = ()) -> bytes:
    """One record of a v2 batch (length-prefixed). The producer's only per-record encoding work."""
    parts = [b"\x00", _varint(timestamp_delta), _varint(offset_delta),
             _NULL if key is None else _varint(len(key)) + key,
             _NULL if value is None else _varint(len(value)) + value]
    if headers:
        parts.append(_varint(len(headers)))
        for hkey, hvalue in headers:
            raw = hkey.encode()
            parts.append(_varint(len(raw)) + raw)
            parts.append(_NULL if hvalue is None else _varint(len(hvalue)) + hvalue)
    else:
        parts.append(_NO_HEADERS)
    inner = b"".join(parts)
    return _varint(len(inner)) + inner


def seal_batch(body: bytes | bytearray, count: int, base_timestamp: int, max_timestamp: int, *,
               base_offset: int = 0, compression: Compression = Compression.NONE, producer_id: int = -1,
               producer_epoch: int = -1, base_sequence: int = -1, attributes: int = 0,
               leader_epoch: int = -1) -> bytes:
    """Wrap encoded records in a v2 batch header: compress the records, compute the CRC-32C."""
    payload = compress(compression, bytes(body))
    after_crc = struct.pack(">hiqqqhii", attributes | int(compression), count - 1, base_timestamp, max_timestamp,
                            producer_id, producer_epoch, base_sequence, count) + payload
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, leader_epoch, 2, crc32c.crc32c(after_crc)) + after_crc


def build_batch(
    records: Sequence[tuple[bytes | None, bytes | None, int] | tuple[bytes | None, bytes | None, int, Sequence[tuple[str, bytes | None]]]],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    leader_epoch: int = -1,
) -> bytes:
    """Encode ``(key, value, timestamp[, headers])`` tuples as one v2 batch."""
    if not records:
        raise ValueError("a batch needs at least one record")
    base_ts = records[0][2]  # the first record's, as the Java client writes it
    body = b"".join(
        encode_record(delta, rec[2] - base_ts, rec[0], rec[1], rec[3] if len(rec) > 3 else ())  # type: ignore[misc]
        for delta, rec in enumerate(records))
    return seal_batch(body, len(records), base_ts, max(r[2] for r in records), base_offset=base_offset,
                      compression=compression, producer_id=producer_id, producer_epoch=producer_epoch,
                      base_sequence=base_sequence, attributes=attributes, leader_epoch=leader_epoch)


def recompress(buf: bytes | bytearray, codec: Compression) -> bytearray:
    """Re-encode every batch not already in ``codec`` (a topic whose compression.type is not ``producer``).

    This is the one broker path that touches records, as in Kafka: it runs
    only for topics configured to force a codec.
    """
    out = bytearray()
    for pos, header in iter_batches(buf):
        batch = memoryview(buf)[pos : pos + header.size]
        if header.compression == codec:
            out += batch
            continue
        records = [(r.key, r.value, r.timestamp, r.headers) for r in iter_records(batch)]
        out += build_batch(records, compression=codec, producer_id=header.producer_id,
                           producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                           attributes=header.attributes & (TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT))
    return out
