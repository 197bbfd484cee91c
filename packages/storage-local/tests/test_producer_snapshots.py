"""Producer-state snapshots: the file format, when they are written, and which survive loading, retention and truncation."""

from __future__ import annotations

import os
import struct
import zlib

import attrs
import pytest
from josef.log import LogDirError
from josef.producer.producer_state import BatchMetadata, ProducerEntry
from josef.protocol.records import build_batch, validate_and_assign
from josef_storage_local import snapshots

#: Batches of ~660 bytes: a 2000-byte segment takes only a few.
BIG = 600


def state_at(log):
    """A stand-in for the broker's state: one producer whose last batch ends just below the log end."""
    last = log.log_end_offset - 1
    return (ProducerEntry(7, 2, (BatchMetadata(0, last, 0, last, 1000 + last),)),)


def attached(harness, config=None):
    log = harness.open(config or harness.config)
    log.attach_producer_state(lambda: state_at(log))
    return log


def snapshot_offsets(harness):
    return snapshots.list_snapshots(harness.path())


def last_offset_in(snapshot):
    return snapshot.producers[0].batches[0].last_offset


# File format -----------------------------------------------------------------------------


ENTRIES = (
    ProducerEntry(1, 0, (BatchMetadata(0, 4, 10, 14, 99), BatchMetadata(5, 5, 15, 15, -1))),
    ProducerEntry(2**40, 32767, tuple(BatchMetadata(i, i, i, i, i) for i in range(5))),
    ProducerEntry(3, -1, ()),
)


def test_encode_decode_round_trip():
    assert snapshots.decode(snapshots.encode(ENTRIES)) == ENTRIES
    assert snapshots.decode(snapshots.encode(())) == ()


IN_TRANSACTION = (
    ProducerEntry(1, 4, (BatchMetadata(0, 4, 10, 14, 99),), coordinator_epoch=2**31 - 1, current_txn_first_offset=10,
                  last_timestamp=99),
    ProducerEntry(2, 0, (), coordinator_epoch=0, last_timestamp=1234),  # a marker's timestamp, no batch left
)


def test_version_3_carries_the_transaction_state_and_the_last_timestamp():
    data = snapshots.encode(IN_TRANSACTION)
    assert snapshots.decode(data) == IN_TRANSACTION
    body = (
        struct.pack(">i", 2)
        + struct.pack(">qhiqqh", 1, 4, 2**31 - 1, 10, 99, 1) + struct.pack(">iiqqq", 0, 4, 10, 14, 99)
        + struct.pack(">qhiqqh", 2, 0, 0, -1, 1234, 0)
    )
    assert data == struct.pack(">hI", 3, zlib.crc32(body)) + body


def test_version_2_files_still_read_with_the_last_batch_timestamp():
    body = (
        struct.pack(">i", 2)
        + struct.pack(">qhiqh", 1, 4, 2**31 - 1, 10, 1) + struct.pack(">iiqqq", 0, 4, 10, 14, 99)
        + struct.pack(">qhiqh", 2, 0, 0, -1, 0)
    )
    decoded = snapshots.decode(struct.pack(">hI", 2, zlib.crc32(body)) + body)
    assert decoded == (IN_TRANSACTION[0], attrs.evolve(IN_TRANSACTION[1], last_timestamp=-1))


def test_the_log_stores_and_loads_the_transaction_state(harness):
    log = harness.open()
    log.attach_producer_state(lambda: IN_TRANSACTION)
    harness.append(log, count=3)
    assert harness.restart().latest_producer_snapshot().producers == IN_TRANSACTION


def test_version_1_files_still_read_with_no_transaction_state():
    body = (
        struct.pack(">i", 2)
        + struct.pack(">qhh", 1, 0, 2) + struct.pack(">iiqqq", 0, 4, 10, 14, 99) + struct.pack(">iiqqq", 5, 5, 15, 15, -1)
        + struct.pack(">qhh", 3, -1, 0)
    )
    decoded = snapshots.decode(struct.pack(">hI", 1, zlib.crc32(body)) + body)
    assert decoded == (ENTRIES[0], ENTRIES[2])
    assert all((p.coordinator_epoch, p.current_txn_first_offset) == (-1, -1) for p in decoded)


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "version", "empty"])
def test_damaged_files_are_rejected(damage):
    data = bytearray(snapshots.encode(ENTRIES))
    if damage == "flip":
        data[20] ^= 0x01
    elif damage == "truncate":
        del data[-3:]
    elif damage == "extend":
        data += b"\x00"
    elif damage == "version":
        struct.pack_into(">h", data, 0, 4)
    else:
        data = bytearray()
    with pytest.raises(ValueError):
        snapshots.decode(bytes(data))


def test_a_short_body_with_a_right_crc_is_rejected():
    body = struct.pack(">i", 1) + struct.pack(">qhh", 1, 0, 1)  # promises a batch that is not there
    with pytest.raises(ValueError, match="ends early"):
        snapshots.decode(struct.pack(">hI", 1, zlib.crc32(body)) + body)


# Writing ---------------------------------------------------------------------------------


def test_a_roll_snapshots_the_state_at_the_new_base_offset_and_close_at_the_end(harness):
    log = attached(harness)
    for _ in range(7):
        harness.append(log, value_size=BIG)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    assert snapshot_offsets(harness) == bases[1:]
    for base in bases[1:]:
        assert snapshots.read_snapshot(harness.path(), base)[0].batches[0].last_offset == base - 1
    end = log.log_end_offset
    harness.storage.close()
    assert snapshot_offsets(harness) == bases[1:] + [end]
    log = harness.reopen()
    snapshot = log.latest_producer_snapshot()
    assert snapshot.offset == end and last_offset_in(snapshot) == end - 1


def test_a_log_without_producer_state_writes_no_snapshots(harness):
    log = harness.open()
    for _ in range(7):
        harness.append(log, value_size=BIG)
    harness.storage.close()
    assert snapshot_offsets(harness) == []
    assert harness.reopen().latest_producer_snapshot() is None


def test_a_failed_snapshot_fails_the_roll_and_leaves_the_log_as_it_was(harness):
    log = harness.open(attrs.evolve(harness.config, segment_bytes=100))  # every append rolls
    for _ in range(3):
        harness.append(log)

    def broken():
        raise OSError(28, "No space left on device")

    log.attach_producer_state(broken)
    end, bases = log.log_end_offset, log.segment_base_offsets
    with pytest.raises(LogDirError):
        harness.append(log)
    assert (log.log_end_offset, log.segment_base_offsets) == (end, bases)
    harness.crash()  # the error took the directory offline; a restart brings it back
    log = harness.reopen(attrs.evolve(harness.config, segment_bytes=100))
    assert harness.batches(log.read(2, 1 << 20, log.log_end_offset)) == [(2, 2)]
    log.attach_producer_state(lambda: state_at(log))
    harness.append(log)
    assert log.segment_base_offsets == bases + [end]
    assert snapshot_offsets(harness) == [end]


# Reading ---------------------------------------------------------------------------------


def test_a_corrupt_latest_snapshot_falls_back_to_an_older_one_and_is_removed(harness):
    log = attached(harness)
    for _ in range(7):
        harness.append(log, value_size=BIG)
    bases = log.segment_base_offsets
    path = snapshots.snapshot_path(harness.path(), bases[-1])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(data)
    snapshot = log.latest_producer_snapshot()
    assert snapshot.offset == bases[-2] and last_offset_in(snapshot) == bases[-2] - 1
    assert not path.exists()


def test_batch_headers_walk_every_segment_from_an_offset(harness):
    log = harness.open()
    infos = [harness.append(log, count=2, value_size=300) for _ in range(12)]
    assert len(log.segment_base_offsets) > 2
    middle = infos[5]
    headers = list(log.batch_headers(middle.first_offset + 1))  # inside a batch: that batch comes first
    assert [(h.base_offset, h.last_offset) for h in headers] == [(i.first_offset, i.last_offset) for i in infos[5:]]
    assert list(log.batch_headers(log.log_end_offset)) == []
    assert len(list(log.batch_headers(0))) == 12


def test_batch_headers_carry_the_producer_fields(harness):
    log = harness.open()
    buf = bytearray(build_batch([(None, b"x", 5)] * 3, producer_id=99, producer_epoch=4, base_sequence=17))
    log.append(buf, validate_and_assign(buf, 0, 0, 1 << 20))
    (header,) = log.batch_headers(0)
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.last_offset) == (99, 4, 17, 2)


# Retention, DeleteRecords, truncation ------------------------------------------------------


def test_retention_deletes_snapshots_below_the_log_start(harness):
    log = attached(harness, attrs.evolve(harness.config, retention_bytes=2500))
    for _ in range(10):
        harness.append(log, value_size=BIG)
    assert log.apply_retention(harness.clock()) >= 1
    assert log.log_start_offset > 0
    assert snapshot_offsets(harness) == log.segment_base_offsets


def test_delete_records_deletes_snapshots_below_the_new_log_start(harness):
    log = attached(harness)
    for _ in range(10):
        harness.append(log, value_size=BIG)
    bases = log.segment_base_offsets
    log.delete_records_before(bases[2] + 1)
    assert snapshot_offsets(harness) == [b for b in bases if b > bases[2]]


def test_truncation_deletes_snapshots_above_the_new_end(harness):
    log = attached(harness)
    for _ in range(10):
        harness.append(log, value_size=BIG)
    bases = log.segment_base_offsets
    log.truncate_to(bases[2])
    assert snapshot_offsets(harness) == [bases[1], bases[2]]
    log.truncate_to(bases[2] - 1)
    assert snapshot_offsets(harness) == [bases[1]]
    log.truncate_to(0)
    assert snapshot_offsets(harness) == []


# Loading -----------------------------------------------------------------------------------


def test_loading_after_a_crash_drops_snapshots_past_the_recovered_end(harness, clock):
    log = attached(harness)
    for _ in range(3):
        harness.append(log, value_size=BIG)
    clock.now += 60_000  # the flush checkpoints the recovery point: recovery starts at segment 1
    log.flush()
    for _ in range(4):
        harness.append(log, value_size=BIG)
    bases = log.segment_base_offsets
    assert len(bases) >= 3 and bases[1] < log.recovery_point < bases[2]
    harness.crash()
    # The crash lost the last segment and the tail of the one before: the snapshot at its base describes lost data.
    os.truncate(harness.segment_file(bases[1], ".log"), 10)
    log = harness.reopen()
    assert log.log_end_offset == bases[1]
    assert snapshot_offsets(harness) == [bases[1]]
    assert log.latest_producer_snapshot().offset == bases[1]


def test_loading_after_a_crash_drops_snapshots_past_the_first_recovered_segment(harness):
    """So that the broker's replay covers every recovered segment, and reports their aborted transactions again."""
    log = attached(harness)
    for _ in range(7):
        harness.append(log, value_size=BIG)
    bases = log.segment_base_offsets
    assert log.recovery_point == 0 and snapshot_offsets(harness) == bases[1:]
    harness.crash()
    log = harness.reopen()
    assert log.log_end_offset == 7  # nothing was lost
    assert snapshot_offsets(harness) == []
    assert log.latest_producer_snapshot() is None  # the broker replays from the log start


def test_loading_keeps_snapshots_at_segment_bases_and_the_newest_only(harness):
    log = attached(harness)
    harness.append(log, value_size=BIG)
    harness.storage.close()  # a snapshot in the middle of segment 0
    middle = log.log_end_offset
    log = attached(harness)
    for _ in range(3):
        harness.append(log, value_size=BIG)  # rolls once
    harness.storage.close()
    newest = log.log_end_offset
    bases = log.segment_base_offsets
    assert snapshot_offsets(harness) == [middle, bases[1], newest]
    (harness.path() / f"{newest + 5:020d}.snapshot.tmp").write_bytes(b"half")
    log = harness.reopen()
    assert snapshot_offsets(harness) == [bases[1], newest]
    assert not list(harness.path().glob("*.tmp"))
