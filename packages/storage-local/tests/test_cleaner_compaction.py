"""Log compaction by LocalLog.clean: the latest record per key, tombstones until delete.retention.ms, offsets kept."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from cleaning import append_keyed, read_all

from josef.log import LogConfig
from josef.protocol.codecs import Compression
from josef.protocol.topic_partition import TopicPartition
from josef.testing import ManualClock
from josef_storage_local.compaction import CleanerOptions

from local_harness import Harness

COMPACT = LogConfig(segment_bytes=256 * 1024, cleanup_policy=("compact",), retention_ms=-1,
                    delete_retention_ms=60_000)


@pytest.fixture
def manual(tmp_path: Path) -> Harness:
    h = Harness(tmp_path / "logs", ManualClock())  # type: ignore[arg-type]
    yield h
    h.crash()


def roll(log, clock, size: int) -> None:
    """Append a record large enough to start a new active segment, so that everything before becomes cleanable."""
    append_keyed(log, [(b"filler", b"x" * size, clock.now)])


def test_latest_value_per_key_survives_and_tombstones_go_after_delete_retention(manual: Harness) -> None:
    clock = manual.clock
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    rnd = random.Random(13)
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for _ in range(2000):  # 1,000 keys, 200,000 updates, about 5% tombstones
        records = []
        for _ in range(100):
            key = b"key-%d" % rnd.randrange(1000)
            value = None if rnd.random() < 0.05 else b"value-%d" % rnd.randrange(10**9)
            records.append((key, value, clock.now))
        base = append_keyed(log, records)
        for delta, (key, value, _) in enumerate(records):
            latest[key] = (base + delta, value)
        clock.now += 10
    roll(log, clock, COMPACT.segment_bytes)
    end = log.log_end_offset

    stats = log.clean(clock.now)
    assert stats.cleaned_to == end - 1  # the filler is the active segment
    assert stats.records_read == 200_000 and stats.records_written == len(latest)
    _, records = read_all(log)
    cleaned = [r for r in records if r.key != b"filler"]
    assert {r.key: (r.offset, r.value) for r in cleaned} == latest  # offsets unchanged, tombstones still there
    assert len(cleaned) == len(latest)
    assert log.log_end_offset == end

    clock.now += COMPACT.delete_retention_ms - 1
    log.clean(clock.now)
    assert len([r for r in read_all(log)[1] if r.value is None]) == sum(v is None for _, v in latest.values())

    clock.now += 2  # past every tombstone's delete horizon
    stats = log.clean(clock.now)
    _, records = read_all(log)
    live = {key: offset_value for key, offset_value in latest.items() if offset_value[1] is not None}
    assert {r.key: (r.offset, r.value) for r in records if r.key != b"filler"} == live
    assert all(r.value is not None for r in records)
    assert log.log_end_offset == end


def test_records_without_key_are_dropped_and_the_rest_is_kept(manual: Harness) -> None:
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    append_keyed(log, [(None, b"no key", 1), (b"a", b"1", 2), (None, b"no key either", 3), (b"b", b"2", 4)])
    append_keyed(log, [(b"a", b"3", 5)])
    append_keyed(log, [(None, b"no key", 6)])
    roll(log, manual.clock, COMPACT.segment_bytes)
    log.clean(manual.clock.now)
    batches, records = read_all(log)
    assert [(r.offset, r.key, r.value) for r in records][:-1] == [(3, b"b", b"2"), (4, b"a", b"3")]
    # The last batch below the cleaning's end stays, emptied, so the log keeps its last offset (Kafka 4).
    assert batches[:-1] == [(0, 3, 1), (4, 4, 1), (5, 5, 0)]


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_a_compressed_batch_that_loses_records_is_recompressed_with_its_codec(manual: Harness, codec: Compression) -> None:
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    append_keyed(log, [(b"k%d" % i, b"old" * 50, 1) for i in range(20)], compression=codec)
    append_keyed(log, [(b"k%d" % i, b"new", 2) for i in range(0, 20, 2)])
    roll(log, manual.clock, COMPACT.segment_bytes)
    log.clean(manual.clock.now)
    data = log.read(0, 1 << 20, log.log_end_offset)
    assert data[21 + 1] & 0x07 == codec  # the attributes of the first batch
    records = read_all(log)[1][:-1]  # decode_batch checks the CRC
    assert [(r.offset, r.value) for r in records] == [
        *[(i, b"old" * 50) for i in range(1, 20, 2)], *[(20 + i, b"new") for i in range(10)]]


def test_cleaning_stops_at_the_last_stable_offset_and_the_min_compaction_lag(manual: Harness) -> None:
    clock = manual.clock
    config = LogConfig(segment_bytes=1000, cleanup_policy=("compact",), retention_ms=-1,
                       min_compaction_lag_ms=1000)
    log = manual.open(config)
    stable = [0]
    log.attach_last_stable_offset(lambda: stable[0])
    for i in range(40):
        append_keyed(log, [(b"same", b"v%d" % i + b"." * 200, clock.now)])
        clock.now += 100
    bases = log.segment_base_offsets
    assert log.clean(clock.now).cleaned_to == -1  # nothing is stable

    stable[0] = 20
    stats = log.clean(clock.now)
    horizon = max(b for b in bases if b <= 20)  # a segment base at or below the stable offset
    assert 0 < stats.cleaned_to <= 20
    offsets = [r.offset for r in read_all(log)[1]]
    assert [o for o in offsets if o < stats.cleaned_to] == [stats.cleaned_to - 1] or horizon == 0
    assert offsets[-(40 - 20):] == list(range(20, 40))  # above the stable offset: untouched

    stable[0] = log.log_end_offset  # now the compaction lag holds back the last 10 records (1000 ms)
    stats = log.clean(clock.now)
    offsets = [r.offset for r in read_all(log)[1]]
    recent = [o for o in offsets if o >= stats.cleaned_to]
    assert stats.cleaned_to <= 40 - 10 + 1 and len(recent) >= 9
    assert [o for o in offsets if o < stats.cleaned_to] == [stats.cleaned_to - 1]


def test_a_log_without_a_stable_offset_or_compact_policy_is_left_alone(manual: Harness) -> None:
    log = manual.open(COMPACT)
    append_keyed(log, [(b"a", b"1", 1)])
    append_keyed(log, [(b"a", b"2", 1)])
    roll(log, manual.clock, COMPACT.segment_bytes)
    assert log.clean(manual.clock.now).cleaned_to == -1  # no last stable offset attached
    other = manual.open(LogConfig(segment_bytes=1000), tp=TopicPartition(manual.tp.topic, 1))
    other.attach_last_stable_offset(lambda: other.log_end_offset)
    append_keyed(other, [(b"a", b"1", 1)])
    append_keyed(other, [(b"a", b"2", 1)])
    roll(other, manual.clock, 1000)
    assert other.clean(manual.clock.now).cleaned_to == -1  # cleanup.policy=delete
    assert len(read_all(log)[1]) == 3 and len(read_all(other)[1]) == 3


def test_a_full_offset_map_cleans_as_far_as_it_reached_then_the_rest(manual: Harness) -> None:
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    for batch in range(30):  # 300 distinct keys, then the first 100 again
        append_keyed(log, [(b"k%d" % (batch * 10 + i), b"old", 1) for i in range(10)])
    for batch in range(10):
        append_keyed(log, [(b"k%d" % (batch * 10 + i), b"new", 1) for i in range(10)])
    roll(log, manual.clock, COMPACT.segment_bytes)
    options = CleanerOptions(map_capacity=150)
    assert [log.clean(manual.clock.now, options).cleaned_to for _ in range(3)] == [150, 300, 400]
    records = read_all(log)[1][:-1]
    assert [(r.offset, r.key, r.value) for r in records] == [
        *[(i, b"k%d" % i, b"old") for i in range(100, 300)], *[(300 + i, b"k%d" % i, b"new") for i in range(100)]]


def test_the_cleaner_checkpoint_survives_a_restart(manual: Harness) -> None:
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    append_keyed(log, [(b"a", b"1", 1), (b"a", b"2", 1)])
    roll(log, manual.clock, COMPACT.segment_bytes)
    assert log.clean(manual.clock.now).cleaned_to == 2
    text = (manual.root / "cleaner-offset-checkpoint").read_text()
    assert text == f"0\n1\n{manual.tp.topic} {manual.tp.partition} 2\n"
    log = manual.restart(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    assert log.clean(manual.clock.now).cleaned_to == -1  # nothing dirty since


def test_compact_delete_is_both_compacted_and_trimmed_by_retention(manual: Harness) -> None:
    clock = manual.clock
    config = LogConfig(segment_bytes=2000, cleanup_policy=("compact", "delete"), retention_ms=10_000)
    log = manual.open(config)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    for i in range(30):
        append_keyed(log, [(b"k%d" % (i % 3), b"v%d" % i + b"." * 300, clock.now)])
        clock.now += 1000
    active = log.segment_base_offsets[-1]
    log.clean(clock.now)
    offsets = [r.offset for r in read_all(log)[1]]
    assert offsets == [active - 3, active - 2, active - 1, *range(active, 30)]  # one per key, then the active segment
    assert log.apply_retention(clock.now) >= 1  # the old (now empty) segments go past retention.ms
    assert log.log_start_offset > 0
    assert [r.offset for r in read_all(log)[1]] == [o for o in offsets if o >= log.log_start_offset]
