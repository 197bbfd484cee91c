"""The aborted-transaction index (``.txnindex``): format, appends and searches, and how it follows its segments.

The log never looks inside the batches for this: the broker reports each
aborted transaction after appending (or replaying) its ABORT marker. Plain
batches stand in for the markers here.
"""

from __future__ import annotations

import logging
import os
import struct

import attrs
import pytest
from josef.log import AbortedTxn
from josef.producer.producer_state import ProducerEntry
from josef_storage_local import snapshots
from josef_storage_local.txn_index import ENTRY, decode

#: Batches of ~370 bytes: five to a 2000-byte segment.
VALUE = 300


def abort_every(harness, log, batches, every=3):
    """Append ``batches`` one-record batches; every ``every``-th is the ABORT marker of a transaction begun two before.

    Reported as the broker does, right after the marker's append; nothing is
    open after it, so the last stable offset is the marker's offset + 1.
    """
    txns = []
    for i in range(batches):
        marker = harness.append(log, value_size=VALUE).last_offset
        if i % every == every - 1:
            txn = AbortedTxn(producer_id=1000 + i, first_offset=marker - 2, last_offset=marker, last_stable_offset=marker + 1)
            log.append_aborted_txn(txn)
            txns.append(txn)
    return txns


def txn_file(harness, base):
    return harness.segment_file(base, ".txnindex")


def on_disk(harness, base):
    """The entries in a segment's file, decoded; none when there is no file."""
    path = txn_file(harness, base)
    return decode(path.read_bytes(), base) if path.exists() else []


def entry_bytes(*txns):
    return b"".join(
        struct.pack(">hqqqq", 0, t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset) for t in txns
    )


def in_segment(log, txns, i):
    bases = log.segment_base_offsets + [log.log_end_offset]
    return [t for t in txns if bases[i] <= t.last_offset < bases[i + 1]]


def reported_after_snapshot(log, txns):
    """What the broker reports again while it replays the batches after the latest producer snapshot."""
    snapshot = log.latest_producer_snapshot()
    start = snapshot.offset if snapshot else log.log_start_offset
    for txn in txns:
        if txn.last_offset >= start:
            log.append_aborted_txn(txn)


def attached(harness):
    log = harness.open()
    log.attach_producer_state(lambda: (ProducerEntry(7, 0),))
    return log


# Format -----------------------------------------------------------------------------------


def test_an_entry_is_kafkas_34_bytes_and_the_file_appears_with_the_first_one(harness):
    log = harness.open()
    harness.append(log, count=3)
    assert not txn_file(harness, 0).exists()  # as Kafka: no aborted transaction, no file
    txn = AbortedTxn(producer_id=2**40 + 5, first_offset=1, last_offset=2, last_stable_offset=3)
    log.append_aborted_txn(txn)
    data = txn_file(harness, 0).read_bytes()
    assert ENTRY.size == 34
    assert data == bytes.fromhex("0000" "0000010000000005" "0000000000000001" "0000000000000002" "0000000000000003")
    assert txn_file(harness, 0).name == "00000000000000000000.txnindex"
    assert decode(data, 0) == [txn]


def test_each_segment_holds_the_entries_whose_marker_it_holds(harness):
    log = harness.open()
    txns = abort_every(harness, log, 20)
    bases = log.segment_base_offsets
    assert len(bases) >= 4
    for i, base in enumerate(bases):
        expected = in_segment(log, txns, i)
        if expected:
            assert txn_file(harness, base).read_bytes() == entry_bytes(*expected)
        else:
            assert not txn_file(harness, base).exists()
    assert log.aborted_txns(0, log.log_end_offset) == txns


# Searching ----------------------------------------------------------------------------------


def test_aborted_txns_returns_the_entries_overlapping_the_range(harness):
    log = harness.open()
    txns = abort_every(harness, log, 20)  # markers at 2, 5, 8, ...; transactions [0, 2], [3, 5], ...
    assert log.aborted_txns(0, 1) == [txns[0]]
    assert log.aborted_txns(2, 3) == [txns[0]]  # the marker itself is in range
    assert log.aborted_txns(3, 4) == [txns[1]]
    assert log.aborted_txns(4, 9) == [txns[1], txns[2]]
    assert log.aborted_txns(6, 6) == []
    assert log.aborted_txns(log.log_end_offset, log.log_end_offset + 10) == []
    assert log.aborted_txns(0, log.log_end_offset) == txns


def test_a_transaction_aborted_segments_later_is_found_from_where_it_began(harness):
    """Kafka stops searching at an entry whose last stable offset reaches the range's end, not at a segment boundary."""
    log = harness.open()
    for _ in range(3):
        harness.append(log, value_size=VALUE)
    # Producer 1's transaction starts at 1 and stays open while other producers' transactions abort.
    txns = []
    while len(log.segment_base_offsets) < 4:
        marker = harness.append(log, value_size=VALUE).last_offset
        txns.append(AbortedTxn(2, marker, marker, 1))  # a one-batch transaction; the LSO stays at 1
        log.append_aborted_txn(txns[-1])
    long_one = AbortedTxn(1, 1, harness.append(log, value_size=VALUE).last_offset, log.log_end_offset)
    log.append_aborted_txn(long_one)
    after = AbortedTxn(3, log.log_end_offset, harness.append(log, value_size=VALUE).last_offset, log.log_end_offset)
    log.append_aborted_txn(after)
    assert long_one.last_offset > log.segment_base_offsets[3]
    assert log.aborted_txns(0, 3) == [long_one]  # found three segments on; the search ends at its LSO
    assert log.aborted_txns(1, log.segment_base_offsets[1]) == [*in_range(txns, log.segment_base_offsets[1]), long_one]


def in_range(txns, upper):
    return [t for t in txns if t.first_offset < upper]


def test_the_search_ends_at_the_first_entry_whose_last_stable_offset_reaches_the_range_end(harness):
    log = harness.open()
    harness.append(log, count=10)
    first = AbortedTxn(1, 0, 4, 5)
    # Inconsistent with ``first`` on purpose: begun below 5, yet after an entry saying nothing was open.
    hidden = AbortedTxn(2, 3, 6, 7)
    log.append_aborted_txn(first)
    log.append_aborted_txn(hidden)
    assert log.aborted_txns(0, 5) == [first]
    assert log.aborted_txns(0, 6) == [first, hidden]


# Appending --------------------------------------------------------------------------------


def test_appends_are_idempotent_for_replayed_markers(harness):
    log = harness.open()
    txns = abort_every(harness, log, 9)
    size = txn_file(harness, 0).stat().st_size
    for txn in txns:
        log.append_aborted_txn(txn)  # a replay reports them again
    log.append_aborted_txn(AbortedTxn(99, 0, txns[-1].last_offset, 0))  # at the last marker: ignored too
    log.append_aborted_txn(AbortedTxn(99, 0, txns[0].last_offset - 1, 0))  # before it: ignored
    assert txn_file(harness, 0).stat().st_size == size
    assert log.aborted_txns(0, log.log_end_offset) == txns


def test_a_marker_past_the_log_end_is_refused(harness):
    log = harness.open()
    harness.append(log, count=3)
    with pytest.raises(ValueError, match="past the log end"):
        log.append_aborted_txn(AbortedTxn(1, 0, 3, 4))
    assert log.aborted_txns(0, 10) == []
    assert not txn_file(harness, 0).exists()


def test_flush_fsyncs_the_index_with_its_segment(harness, monkeypatch):
    log = harness.open()
    txns = abort_every(harness, log, 6)
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log.flush()
    assert str(txn_file(harness, 0)) in synced
    assert str(harness.path()) in synced  # the file is new: its directory entry too
    synced.clear()
    log.flush()
    assert str(txn_file(harness, 0)) not in synced  # nothing new to sync
    assert log.aborted_txns(0, log.log_end_offset) == txns


# Truncation, retention, deletion -------------------------------------------------------------


def test_truncation_drops_the_entries_of_the_markers_it_removes(harness):
    log = harness.open()
    txns = abort_every(harness, log, 20)
    bases = log.segment_base_offsets
    cut = txns[3].last_offset  # the fourth marker goes, and everything after
    log.truncate_to(cut)
    assert log.aborted_txns(0, 100) == txns[:3]
    active = log.segment_base_offsets[-1]
    assert txn_file(harness, active).read_bytes() == entry_bytes(*[t for t in txns[:3] if t.last_offset >= active])
    assert all(not txn_file(harness, base).exists() for base in bases if base > active)
    # The log goes on: the next abort indexes after the kept ones.
    again = abort_every(harness, log, 3)
    assert log.aborted_txns(0, 100) == txns[:3] + again
    assert harness.restart().aborted_txns(0, 100) == txns[:3] + again


def test_truncating_below_every_marker_of_a_segment_leaves_its_file_empty(harness):
    log = harness.open()
    txns = abort_every(harness, log, 3)
    log.truncate_to(txns[0].last_offset)
    assert log.aborted_txns(0, 100) == []
    assert txn_file(harness, 0).read_bytes() == b""  # Kafka truncates the file and keeps it


def test_truncate_fully_drops_every_entry_and_file(harness):
    log = harness.open()
    abort_every(harness, log, 20)
    log.truncate_fully_and_start_at(500)
    assert log.aborted_txns(0, 1000) == []
    assert list(harness.path().glob("*.txnindex")) == []
    harness.append(log, count=3)
    log.append_aborted_txn(AbortedTxn(1, 500, 502, 503))
    assert log.aborted_txns(500, 503) == [AbortedTxn(1, 500, 502, 503)]
    assert txn_file(harness, 500).exists()


def test_retention_deletes_the_index_with_its_segment(harness):
    log = harness.open(attrs.evolve(harness.config, retention_bytes=4000))
    txns = abort_every(harness, log, 30)
    bases = log.segment_base_offsets
    deleted = log.apply_retention(harness.clock.now)
    assert deleted >= 2
    start = log.log_start_offset
    assert start == log.segment_base_offsets[0] == bases[deleted]
    assert all(not txn_file(harness, base).exists() for base in bases[:deleted])
    kept = [t for t in txns if t.last_offset >= start]
    assert log.aborted_txns(start, log.log_end_offset) == kept
    assert harness.restart().aborted_txns(start, log.log_end_offset) == kept


def test_delete_records_keeps_the_entries_of_the_segments_it_keeps(harness):
    log = harness.open()
    txns = abort_every(harness, log, 20)
    log.delete_records_before(txns[2].last_offset)
    assert log.aborted_txns(log.log_start_offset, log.log_end_offset) == txns[2:]
    assert log.apply_retention(harness.clock.now) >= 1  # the segments below the new start go, with their files
    first = log.segment_base_offsets[0]
    assert sorted(int(p.name[:20]) for p in harness.path().glob("*.txnindex"))[0] >= first
    assert log.aborted_txns(log.log_start_offset, log.log_end_offset) == txns[2:]


def test_an_index_without_its_log_is_removed_at_load(harness):
    log = harness.open()
    abort_every(harness, log, 3)
    harness.storage.close()
    orphan = txn_file(harness, 12345)
    orphan.write_bytes(entry_bytes(AbortedTxn(1, 12345, 12346, 12347)))
    log = harness.reopen()
    assert not orphan.exists()
    assert len(log.aborted_txns(0, 100)) == 1


def test_a_move_between_log_dirs_keeps_the_index(harness, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    harness.start(**{"log.dirs": f"{first},{second}"})
    log = harness.open()
    txns = abort_every(harness, log, 20)
    harness.storage.move(harness.tp, str(second))
    assert log.dir == second / str(harness.tp)
    assert log.aborted_txns(0, log.log_end_offset) == txns
    assert {p.name for p in log.dir.glob("*.txnindex")} == {
        f"{base:020d}.txnindex" for i, base in enumerate(log.segment_base_offsets) if in_segment(log, txns, i)
    }
    more = abort_every(harness, log, 3)
    assert log.aborted_txns(0, log.log_end_offset) == txns + more
    harness.storage.close()
    harness.start(**{"log.dirs": f"{first},{second}"})
    log = harness.open()
    assert log.aborted_txns(0, log.log_end_offset) == txns + more


# Restarts -------------------------------------------------------------------------------------


def test_a_clean_restart_loads_every_entry_and_replays_nothing(harness):
    log = attached(harness)
    txns = abort_every(harness, log, 20)
    log = harness.restart()
    assert log.latest_producer_snapshot().offset == log.log_end_offset  # the broker replays nothing
    assert log.aborted_txns(0, log.log_end_offset) == txns
    assert log.aborted_txns(txns[4].last_offset, txns[4].last_offset + 1) == [txns[4]]
    more = abort_every(harness, log, 3)
    assert log.aborted_txns(0, log.log_end_offset) == txns + more


def test_an_unclean_restart_forgets_the_entries_of_recovered_segments_until_the_broker_replays_them(harness, clock):
    log = attached(harness)
    txns = abort_every(harness, log, 12)
    clock.now += 60_000  # the flush checkpoints the recovery point
    log.flush()
    flushed_to = log.recovery_point
    txns += abort_every(harness, log, 15)
    bases = log.segment_base_offsets
    first_recovered = max(b for b in bases if b <= flushed_to)
    assert first_recovered > bases[0] and any(t.last_offset >= first_recovered for t in txns)
    assert any(b > first_recovered for b in snapshots.list_snapshots(harness.path()))
    harness.crash()

    log = harness.reopen()
    assert log.log_end_offset == 27  # nothing was lost
    assert log.aborted_txns(0, 100) == [t for t in txns if t.last_offset < first_recovered]
    assert snapshots.list_snapshots(harness.path())[-1] == first_recovered
    assert all(not txn_file(harness, b).exists() for b in bases if b >= first_recovered)
    reported_after_snapshot(log, txns)
    assert log.aborted_txns(0, 100) == txns
    assert harness.restart().aborted_txns(0, 100) == txns


def test_an_unclean_restart_drops_the_entries_of_lost_markers(harness):
    log = harness.open()
    txns = abort_every(harness, log, 15)
    bases = log.segment_base_offsets
    harness.crash()
    # The tail of the last segment, with the last marker, is lost; its index entry was written.
    active = harness.segment_file(bases[-1], ".log")
    lost = txns[-1].last_offset
    os.truncate(active, active.stat().st_size - 10)
    log = harness.reopen()
    assert log.log_end_offset == lost
    reported_after_snapshot(log, [t for t in txns if t.last_offset < lost])
    assert log.aborted_txns(0, 100) == txns[:-1]
    assert on_disk(harness, bases[-1]) == in_segment(log, txns[:-1], len(bases) - 1) != []


def test_a_segment_cut_at_load_after_a_clean_stop_loses_the_entries_of_the_markers_cut(harness):
    """A torn tail is cut even when the stop was clean; the other entries of the segment stay (nothing replays them)."""
    log = attached(harness)
    txns = abort_every(harness, log, 15)
    harness.storage.close()
    bases = log.segment_base_offsets
    active = harness.segment_file(bases[-1], ".log")
    os.truncate(active, active.stat().st_size - 10)
    log = harness.reopen()
    assert log.log_end_offset == txns[-1].last_offset
    assert log.aborted_txns(0, 100) == txns[:-1]
    assert on_disk(harness, bases[-1]) == in_segment(log, txns[:-1], len(bases) - 1) != []


@pytest.mark.parametrize("damage", ["torn", "version", "order", "below-base"])
def test_a_corrupt_index_is_rebuilt_by_the_replay_not_fatal(harness, caplog, damage):
    log = attached(harness)
    txns = abort_every(harness, log, 30)
    harness.storage.close()
    bases = log.segment_base_offsets
    victim = next(b for i, b in enumerate(bases) if i > 0 and len(in_segment(log, txns, i)) >= 2)
    path = txn_file(harness, victim)
    data = bytearray(path.read_bytes())
    if damage == "torn":
        del data[-5:]
    elif damage == "version":
        struct.pack_into(">h", data, ENTRY.size, 1)
    elif damage == "order":
        data[: ENTRY.size], data[ENTRY.size : 2 * ENTRY.size] = data[ENTRY.size : 2 * ENTRY.size], data[: ENTRY.size]
    else:
        struct.pack_into(">q", data, 18, victim - 1)  # the first entry's lastOffset
    path.write_bytes(data)

    with caplog.at_level(logging.WARNING):
        log = harness.reopen()
    assert "corrupt transaction index" in caplog.text and str(path) in caplog.text
    assert not path.exists()
    assert log.aborted_txns(0, 100) == [t for t in txns if t.last_offset < victim]
    assert log.latest_producer_snapshot().offset <= victim  # the broker replays the damaged segment
    reported_after_snapshot(log, txns)
    assert log.aborted_txns(0, 100) == txns
    assert txn_file(harness, victim).read_bytes() == entry_bytes(*in_segment(log, txns, bases.index(victim)))


def test_entries_replayed_below_the_recovery_point_are_flushed(harness, monkeypatch):
    log = attached(harness)
    txns = abort_every(harness, log, 30)
    harness.storage.close()
    bases = log.segment_base_offsets
    victim = bases[1]
    txn_file(harness, victim).write_bytes(b"\x00")
    log = harness.reopen()
    assert log.recovery_point == log.log_end_offset
    reported_after_snapshot(log, txns)
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log.flush()
    assert str(txn_file(harness, victim)) in synced
