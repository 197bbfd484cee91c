import struct

import pytest

from josef.protocol.codecs import Compression
from josef.protocol.records import (
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    batch_is_valid,
    build_batch,
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
