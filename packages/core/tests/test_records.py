import os
import struct
from typing import Any

import pytest

from josef.protocol.codecs import Compression, decompress
from josef.protocol.records import (
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    ConsumerRecord,
    CorruptRecordError,
    InvalidRecordError,
    RecordDeserializationError,
    RecordTooLargeError,
    batch_is_valid,
    build_batch,
    decode_batch,
    iter_batches,
    iter_records,
    validate_and_assign,
)

RECORDS = [(b"k1", b"v1", 1000, [("h", b"x"), ("n", None)]), (None, b"v2", 1003), (b"k3", None, 999)]


@pytest.mark.parametrize("codec", list(Compression))
def test_round_trip_every_codec(codec):
    batch = build_batch(RECORDS, compression=codec, base_offset=7)
    records = list(iter_records(batch))
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [
        (7, b"k1", b"v1", 1000), (8, None, b"v2", 1003), (9, b"k3", None, 999)]
    assert records[0].headers == (("h", b"x"), ("n", None))
    assert BatchHeader.parse(batch).compression == codec


def test_assign_offsets_patches_header_only():
    buf = bytearray(build_batch(RECORDS) + build_batch(RECORDS[:1], compression=Compression.LZ4))
    original_crcs = [h.crc for _, h in iter_batches(bytes(buf))]
    info = validate_and_assign(buf, 100, 4, 1 << 20)
    headers = [h for _, h in iter_batches(bytes(buf))]
    assert [h.base_offset for h in headers] == [100, 103]
    assert [h.partition_leader_epoch for h in headers] == [4, 4]
    assert [h.crc for h in headers] == original_crcs  # offsets and epochs are outside the CRC
    assert all(batch_is_valid(buf, p, h) for p, h in iter_batches(bytes(buf)))
    assert (info.first_offset, info.last_offset, info.record_count) == (100, 103, 4)
    assert (info.max_timestamp, info.offset_of_max_timestamp) == (1003, 102)
    assert [b.position for b in info.batches] == [0, headers[0].size]


def test_log_append_time_rewrites_timestamp_and_crc():
    buf = bytearray(build_batch(RECORDS))
    info = validate_and_assign(buf, 0, 0, 1 << 20, log_append_time_ms=5555)
    header = BatchHeader.parse(buf)
    assert header.log_append_time and header.max_timestamp == 5555 and info.max_timestamp == 5555
    assert batch_is_valid(buf, 0, header)
    assert {r.timestamp for r in iter_records(buf)} == {5555}


def test_crc_mismatch_is_corrupt():
    buf = bytearray(build_batch(RECORDS))
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        validate_and_assign(buf, 0, 0, 1 << 20)


def test_truncated_and_bad_magic():
    batch = build_batch(RECORDS)
    with pytest.raises(CorruptRecordError, match="truncated|claims"):
        validate_and_assign(bytearray(batch[:-3]), 0, 0, 1 << 20)
    with pytest.raises(CorruptRecordError, match="truncated"):
        validate_and_assign(bytearray(batch[:30]), 0, 0, 1 << 20)
    bad = bytearray(batch)
    bad[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        validate_and_assign(bad, 0, 0, 1 << 20)


def test_too_large_and_empty_and_control():
    batch = build_batch([(None, b"x" * 1000, 1)])
    with pytest.raises(RecordTooLargeError):
        validate_and_assign(bytearray(batch), 0, 0, 500)
    with pytest.raises(InvalidRecordError):
        validate_and_assign(bytearray(), 0, 0, 500)
    with pytest.raises(InvalidRecordError, match="control"):
        validate_and_assign(bytearray(build_batch([(b"\0\0\0\0", b"", 1)], attributes=0x20)), 0, 0, 1 << 20)


def test_count_must_match_last_offset_delta():
    buf = bytearray(build_batch(RECORDS))
    struct.pack_into(">i", buf, 57, 2)  # recordsCount
    struct.pack_into(">i", buf, 23, 5)  # lastOffsetDelta (inside the CRC, so fix the CRC too)
    import crc32c

    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    with pytest.raises(InvalidRecordError, match="lastOffsetDelta"):
        validate_and_assign(buf, 0, 0, 1 << 20)


def test_iter_batches_stops_at_partial_tail():
    one = build_batch(RECORDS)
    assert len(list(iter_batches(one + one[:20]))) == 1


def test_recompress_keeps_records_and_producer_fields():
    from josef.protocol.records import recompress

    original = build_batch(RECORDS, producer_id=42, producer_epoch=1, base_sequence=10)
    already = build_batch(RECORDS[:1], compression=Compression.ZSTD)
    out = recompress(original + already, Compression.ZSTD)
    batches = list(iter_batches(bytes(out)))
    assert [h.compression for _, h in batches] == [Compression.ZSTD, Compression.ZSTD]
    pos, header = batches[0]
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 1, 10)
    assert list(iter_records(out[pos:pos + header.size])) == list(iter_records(original))
    assert out[batches[1][0]:] == already


# ------------------------------------------------------------------ decoding


def batch_of(start: int, count: int, ts0: int = 1_000, **kwargs: Any) -> bytes:
    """Records (key k<i>, value v<i>, timestamp ts0 + i) for i in [start, start + count)."""
    return build_batch([(b"k%d" % i, b"v%d" % i, ts0 + i) for i in range(start, start + count)], **kwargs)


def values(records: list[ConsumerRecord]) -> list[bytes]:
    return [r.value for r in records]


def reference_records(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, tuple]]:
    """(offset, timestamp, key, value, headers) of each record, read field by field as the format describes.

    Deliberately plain and slow: the oracle :func:`decode_batch` (all inline
    varints) is checked against.
    """
    def varint(buf: bytes, pos: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1), pos
            shift += 7

    def blob(buf: bytes, pos: int) -> tuple[bytes | None, int]:
        length, pos = varint(buf, pos)
        return (None, pos) if length < 0 else (bytes(buf[pos : pos + length]), pos + length)

    header = BatchHeader.parse(batch)
    body = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]))
    out, pos = [], 0
    for _ in range(header.records_count):
        _length, pos = varint(body, pos)
        pos += 1  # attributes
        ts_delta, pos = varint(body, pos)
        offset_delta, pos = varint(body, pos)
        key, pos = blob(body, pos)
        value, pos = blob(body, pos)
        count, pos = varint(body, pos)
        headers = []
        for _ in range(count):
            hkey, pos = blob(body, pos)
            hvalue, pos = blob(body, pos)
            headers.append(((hkey or b"").decode(), hvalue))
        out.append((header.base_offset + offset_delta, header.base_timestamp + ts_delta, key, value, tuple(headers)))
    return out


@pytest.mark.parametrize("codec", list(Compression))
def test_decode_batch_matches_the_reference_decoder(codec):
    records = [
        (b"key", b"value", 1_000, [("h1", b"x"), ("h2", None), ("", b"")]),
        (None, b"", 999, []),  # null key, empty value, a timestamp before the base (negative delta)
        (b"", None, 1_000_000, []),
        (os.urandom(300), os.urandom(20_000), 2_000, [("big", os.urandom(9_000))]),  # 2- and 3-byte varints
        (b"k" * 70, b"v" * 64, 3_000, [("\u00e9t\u00e9", b"\xff")]),
    ]
    batch = build_batch(records, base_offset=100, compression=codec, leader_epoch=7)
    got = decode_batch(batch, 0, "topic", 3)
    expected = [ConsumerRecord("topic", 3, offset, timestamp, 0, key, value, headers, 7)
                for offset, timestamp, key, value, headers in reference_records(batch)]
    assert got == expected
    assert [r.offset for r in got] == [100, 101, 102, 103, 104]
    assert got[0].headers == (("h1", b"x"), ("h2", None), ("", b""))
    assert (got[1].key, got[1].value, got[1].timestamp) == (None, b"", 999)
    assert (got[2].key, got[2].value) == (b"", None)
    assert got[3].headers[0][1] == records[3][3][0][1]
    assert got[4].headers == (("\u00e9t\u00e9", b"\xff"),)


def test_decoded_records_are_frozen_slotted_and_hashable():
    [record] = decode_batch(batch_of(0, 1), 0, "t", 0)
    assert record == ConsumerRecord("t", 0, 0, 1_000, 0, b"k0", b"v0", (), -1)
    assert hash(record) == hash(ConsumerRecord("t", 0, 0, 1_000, 0, b"k0", b"v0", (), -1))
    assert not hasattr(record, "__dict__")
    with pytest.raises(AttributeError):
        record.value = b"changed"  # type: ignore[misc]


def test_decode_batch_skips_records_below_the_position():
    batch = batch_of(0, 10, base_offset=50)
    assert [r.offset for r in decode_batch(batch, 0, "t", 0, min_offset=57)] == [57, 58, 59]
    assert decode_batch(batch, 0, "t", 0, min_offset=60) == []


def test_decode_batch_reads_a_batch_inside_a_larger_buffer():
    buf = batch_of(0, 3) + batch_of(3, 2, base_offset=3)
    second = len(batch_of(0, 3))
    assert values(decode_batch(buf, second, "t", 0)) == [b"v3", b"v4"]


def test_log_append_time_batches_use_the_batch_max_timestamp():
    batch = bytearray(batch_of(0, 3, attributes=TIMESTAMP_TYPE_BIT))
    struct.pack_into(">q", batch, 35, 123_456)  # maxTimestamp, as the broker stamps it
    records = decode_batch(bytes(batch), 0, "t", 0, check_crc=False)
    assert [(r.timestamp, r.timestamp_type) for r in records] == [(123_456, 1)] * 3
    assert [r.timestamp_type for r in decode_batch(batch_of(0, 1), 0, "t", 0)] == [0]


def test_crc_is_checked_only_when_asked():
    batch = bytearray(batch_of(0, 3))
    batch[-2] ^= 0x01  # flip a bit of the last value: b"v2" becomes b"v3"
    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_batch(bytes(batch), 0, "t", 0)
    assert decode_batch(bytes(batch), 0, "t", 0, check_crc=False)[-1].value == b"v3"


def test_truncated_and_malformed_batches_are_corrupt():
    batch = batch_of(0, 3)
    with pytest.raises(CorruptRecordError, match="truncated"):
        decode_batch(batch[:-5], 0, "t", 0, check_crc=False)
    bad = bytearray(batch)
    struct.pack_into(">i", bad, 57, 4)  # claims 4 records, holds 3
    with pytest.raises(CorruptRecordError):
        decode_batch(bytes(bad), 0, "t", 0, check_crc=False)
    bad = bytearray(batch)
    bad[16] = 1  # magic
    with pytest.raises(CorruptRecordError, match="magic"):
        decode_batch(bytes(bad), 0, "t", 0, check_crc=False)


def test_deserialisers_are_applied_and_their_failures_name_the_record():
    batch = build_batch([(b"1", b"one", 0), (b"2", b"two", 0), (b"x", b"three", 0)])
    records = decode_batch(batch, 0, "t", 0, min_offset=0, check_crc=True,
                           key_deserializer=None, value_deserializer=bytes.upper)
    assert values(records) == [b"ONE", b"TWO", b"THREE"]
    with pytest.raises(RecordDeserializationError) as info:
        decode_batch(batch, 0, "t", 0, key_deserializer=lambda k: int(k))
    assert (info.value.topic, info.value.partition, info.value.offset) == ("t", 0, 2)
