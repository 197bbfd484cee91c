"""record_scan reads keys, tombstones, deltas and spans exactly as the full decoder does."""

from __future__ import annotations

import pytest

from josef.protocol.codecs import Compression
from josef.protocol.record_scan import batch_body, scan_keys, scan_records, with_timestamp_delta
from josef.protocol.records import CorruptRecordError, build_batch, decode_batch, encode_record


@pytest.mark.parametrize("codec", list(Compression))
def test_scan_matches_decode(codec: Compression) -> None:
    records = [
        (b"k%d" % i if i % 7 else None, None if i % 5 == 0 else b"x" * (i * 37 % 20000), 1000 + i * 999_999,
         (("h", b"v"),) if i % 3 == 0 else ())
        for i in range(300)
    ]
    batch = build_batch(records, base_offset=100, compression=codec)
    body, start, end, count = batch_body(batch)
    scanned = scan_records(body, start, end, count)
    decoded = decode_batch(batch, 0, "t", 0)
    assert len(scanned) == len(decoded) == 300
    assert scan_keys(body, start, end, count) == [(r[0], r[2]) for r in scanned]
    for (delta, ts_delta, key, tombstone, rec_start, rec_end), record in zip(scanned, decoded):
        assert 100 + delta == record.offset
        assert 1000 + ts_delta == record.timestamp
        assert key == record.key
        assert tombstone == (record.value is None)
        assert body[rec_start:rec_end] == encode_record(delta, ts_delta, record.key, record.value, record.headers)


def test_scan_rejects_a_short_batch() -> None:
    batch = build_batch([(b"k", b"v", 1), (b"k2", b"v2", 2)])
    body, start, end, _ = batch_body(batch)
    with pytest.raises(CorruptRecordError):
        scan_records(body, start, end, 3)
    with pytest.raises(CorruptRecordError):
        scan_records(body, start, end, 1)
    for wrong in (1, 3):
        with pytest.raises(CorruptRecordError):
            scan_keys(body, start, end, wrong)


def test_with_timestamp_delta_keeps_the_rest_of_the_record() -> None:
    batch = build_batch([(b"key", b"value", 5000, (("h", b"1"),)), (b"k2", None, 7000)])
    body, start, end, count = batch_body(batch)
    records = scan_records(body, start, end, count)
    moved = b"".join(with_timestamp_delta(body, r[4], r[5], r[1] - 100_000) for r in records)
    rescanned = scan_records(moved, 0, len(moved), 2)
    assert [(r[0], r[1], r[2], r[3]) for r in rescanned] == [(0, -100_000, b"key", False), (1, 2000 - 100_000, b"k2", True)]
