"""Helpers of the cleaner tests: keyed batches appended as the broker does, the log read back record by record."""

from __future__ import annotations

from collections.abc import Sequence

from josef.protocol.codecs import Compression
from josef.protocol.records import ConsumerRecord, build_batch, decode_batch, iter_batches, validate_and_assign
from josef_storage_local.log import LocalLog

Record = tuple[bytes | None, bytes | None, int]


def append_keyed(log: LocalLog, records: Sequence[Record], *, compression: Compression = Compression.NONE,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 attributes: int = 0) -> int:
    """Append one batch of ``(key, value, timestamp)``; returns its base offset."""
    buf = bytearray(build_batch(list(records), compression=compression, producer_id=producer_id,
                                producer_epoch=producer_epoch, base_sequence=base_sequence, attributes=attributes))
    info = validate_and_assign(buf, log.log_end_offset, 0, 1 << 30)
    log.append(buf, info)
    return info.first_offset


def append_raw(log: LocalLog, batch: bytes) -> int:
    """Append an already built batch (a transaction marker) at the log end."""
    from josef.protocol.records import describe_batches
    buf = bytearray(batch)
    import struct
    struct.pack_into(">q", buf, 0, log.log_end_offset)
    info = describe_batches(buf, log.log_end_offset)
    log.append(buf, info)
    return info.first_offset


def read_all(log: LocalLog) -> tuple[list[tuple[int, int, int]], list[ConsumerRecord]]:
    """Every batch ``(base, last, record count)`` and record of the log, CRCs checked, offsets checked increasing."""
    batches, records = [], []
    previous = -1
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 31, log.log_end_offset)  # one segment at a time
        assert data, f"nothing read at {offset} below the log end {log.log_end_offset}"
        for position, header in iter_batches(data):
            assert header.base_offset > previous, "batches out of order"
            batches.append((header.base_offset, header.last_offset, header.records_count))
            for record in decode_batch(data, position, "t", 0):
                assert previous < record.offset <= header.last_offset, "records out of order"
                previous = record.offset
                records.append(record)
            previous = max(previous, header.last_offset)
            offset = header.last_offset + 1
    return batches, records
