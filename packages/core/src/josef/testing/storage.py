"""The storage contract suite: what every :class:`josef.log.LogStorage` plugin must do, as pytest tests.

A plugin runs it against itself with a test module that subclasses
:class:`LogStorageContract` and gives it a :class:`StorageHarness`, the few
things only the plugin knows (how to build its storage, how a crash or a
failing disk looks for it)::

    from josef.testing.storage import LogStorageContract

    class TestMyStorageContract(LogStorageContract):
        @pytest.fixture
        def storage_harness(self):
            return MyHarness()

The tests use only the contract in :mod:`josef.log`, so they hold for any
backend; backend-specific behaviour (file layout, index formats) belongs in
the plugin's own tests. The class is not named ``Test*``: pytest collects it
only through a plugin's subclass. The helpers that build and inspect batches
(:func:`append_batch`, :func:`batches`, :func:`records`) serve the plugins'
own tests too.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import anyio
import attrs
import pytest

from josef.config import Config, ConfigDef, ConfigKey
from josef.log import (
    AbortedTxn,
    EpochEntry,
    FileRegion,
    Log,
    LogConfig,
    LogDirError,
    LogDirNotFoundError,
    LogStorage,
    OffsetOutOfRangeError,
)
from josef.producer.producer_state import BatchMetadata, ProducerEntry
from josef.protocol.records import (
    TRANSACTIONAL_BIT,
    AppendInfo,
    ConsumerRecord,
    build_batch,
    build_marker,
    describe_batches,
    iter_batches,
    iter_records,
    validate_and_assign,
)
from josef.protocol.topic_partition import TopicPartition
from josef.testing import ManualClock, eventually


def broker_config(keys: Mapping[str, str], extra: Iterable[ConfigKey] = ()) -> Config:
    """A broker configuration of ``keys`` over the core's keys and a plugin's ``extra`` ones, for a harness's
    :meth:`StorageHarness.config` (the core's key list itself is not public)."""
    from josef.node.broker_config import CORE_KEYS

    return Config.build(ConfigDef([*CORE_KEYS, *extra]), keys)

__all__ = ["SMALL", "TP", "LogStorageContract", "StorageHarness", "StorageUnderTest", "append_batch",
           "append_records", "batches", "records"]

TP = TopicPartition("orders", 0)
#: Small enough that a few dozen batches roll several segments and fill several index entries each.
SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=200, segment_index_bytes=1024, retention_ms=-1)


# Building and inspecting batches ---------------------------------------------------------


def append_records(
    log: Log,
    items: Sequence[tuple[bytes | None, bytes | None, int]],
    *,
    epoch: int = 0,
    producer_id: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> AppendInfo:
    """Append one batch of ``(key, value, timestamp)`` records, validated and numbered as the broker does."""
    buf = bytearray(build_batch(items, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                base_sequence=base_sequence, attributes=TRANSACTIONAL_BIT if transactional else 0))
    info = validate_and_assign(buf, log.log_end_offset, epoch, 1 << 30)
    log.append(buf, info)
    return info


def append_batch(
    log: Log,
    count: int = 1,
    *,
    timestamp: int = 1000,
    timestamps: Sequence[int] | None = None,
    epoch: int = 0,
    value_size: int = 20,
) -> AppendInfo:
    """Append one batch of ``count`` keyless records (or one per timestamp) of ``value_size`` bytes."""
    stamps = list(timestamps) if timestamps is not None else [timestamp] * count
    return append_records(log, [(None, b"v" * value_size, ts) for ts in stamps], epoch=epoch)


def append_marker(log: Log, producer_id: int, *, commit: bool, timestamp: int = 1000, epoch: int = 0) -> int:
    """Append a transaction marker as the broker writes one (a control batch); returns its offset."""
    buf = build_marker(producer_id, 0, 0, commit, timestamp, base_offset=log.log_end_offset, leader_epoch=epoch)
    log.append(buf, describe_batches(buf, log.log_end_offset))
    return log.log_end_offset - 1


def batches(data: bytes) -> list[tuple[int, int]]:
    """``(base offset, last offset)`` of each batch in a read's answer, which must hold whole batches only."""
    found = list(iter_batches(data))
    assert sum(header.size for _, header in found) == len(data), "a read returned a partial batch"
    return [(header.base_offset, header.last_offset) for _, header in found]


def records(data: bytes) -> list[tuple[int, int]]:
    """``(offset, timestamp)`` of every record in a read's answer."""
    return [(r.offset, r.timestamp) for r in _decoded(data)]


def _keyed(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    """``(offset, key, value)`` of every data record in a read's answer (control batches skipped)."""
    return [(r.offset, r.key, r.value) for r in _decoded(data, control=False)]


def _decoded(data: bytes, control: bool = True) -> list[ConsumerRecord]:
    batches(data)  # whole batches only
    return [
        record
        for position, header in iter_batches(data)
        if control or not header.is_control
        for record in iter_records(data[position : position + header.size])
    ]


# The harness a plugin provides ---------------------------------------------------------------


class StorageHarness(Protocol):
    """What the suite needs from a storage plugin that it cannot do through the contract."""

    #: How many log directories the storage gets (``log.dirs``); from two on, logs are also moved between them.
    log_dir_count: int

    def config(self, keys: Mapping[str, str]) -> Config:
        """The broker configuration of ``keys`` (``log.dirs`` among them), with whatever else the plugin needs."""

    def start(self, config: Config, clock: Callable[[], int]) -> LogStorage:
        """A new storage object on ``config``, reading time from ``clock``.

        Called again on the same directories after :meth:`LogStorage.close`
        or :meth:`crash`, as a restarted broker does.
        """

    def crash(self, storage: LogStorage, logs: Sequence[Log]) -> None:
        """Let go of ``storage`` and the ``logs`` opened from it as a killed process would.

        Nothing is flushed, closed, trimmed or checkpointed and no
        clean-shutdown mark is left; only what a real crash keeps (for local
        disks: every write already made, since the page cache survives a
        process kill) is there for the next :meth:`start`.
        """

    def tear_last_batch(self, log_dir: Path) -> None:
        """After :meth:`crash`, damage the last batch appended to the log in ``log_dir`` as a write torn by the crash would."""

    def failing_disk(self, code: int) -> AbstractContextManager[None]:
        """While entered, every read and write of the storage's files fails with ``OSError(code)``."""


@attrs.define
class StorageUnderTest:
    """The storage a contract test drives: started, restarted cleanly or after a crash, through the harness."""

    harness: StorageHarness
    dirs: list[Path]
    clock: ManualClock
    storage: LogStorage = attrs.field(init=False)
    logs: list[Log] = attrs.field(factory=list)
    running: bool = False

    def start(self, **keys: str) -> LogStorage:
        self.logs = []
        self.storage = self.harness.start(self.config(**keys), self.clock)
        self.running = True
        return self.storage

    def config(self, **keys: str) -> Config:
        return self.harness.config({"log.dirs": ",".join(map(str, self.dirs)), **keys})

    def open(self, config: LogConfig = SMALL, tp: TopicPartition = TP) -> Log:
        log = self.storage.open(tp, config)
        self.logs.append(log)
        return log

    def close(self, broker_epoch: int = -1) -> None:
        self.running = False
        self.storage.close(broker_epoch)

    def crash(self) -> None:
        self.running = False
        self.harness.crash(self.storage, self.logs)

    def restart(self, config: LogConfig = SMALL, tp: TopicPartition = TP) -> Log:
        """Close cleanly, start a new storage on the same directories, open the log."""
        self.close()
        self.start()
        return self.open(config, tp)

    def recover(self, config: LogConfig = SMALL, tp: TopicPartition = TP, tear: bool = False) -> Log:
        """Crash (tearing the last batch written if asked), start a new storage, open the log."""
        where = next(log.dir for log in self.logs if log.tp == tp)
        self.crash()
        if tear:
            self.harness.tear_last_batch(where)
        self.start()
        return self.open(config, tp)


# Checks --------------------------------------------------------------------------------------


def _whole(log: Log) -> bytes:
    """Every batch of the log, read as a consumer does: a read may stop at a segment's end, the next goes on."""
    data = bytearray()
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        chunk = log.read(offset, 1 << 30, log.log_end_offset)
        assert chunk, f"an empty read at {offset}, below the log end {log.log_end_offset}"
        data += chunk
        offset = batches(chunk)[-1][1] + 1
    return bytes(data)


def _every_offset_reads(log: Log) -> None:
    """A read at each offset of the log starts with the first batch ending at or after it (the one holding it, unless compacted away)."""
    stored = batches(_whole(log))
    for offset in range(log.log_start_offset, log.log_end_offset):
        first = batches(log.read(offset, 1, log.log_end_offset))[0]
        assert first == next(b for b in stored if b[1] >= offset), (offset, first)


def _batches_of(infos: Sequence[AppendInfo], below: int) -> list[tuple[int, int]]:
    return [(i.first_offset, i.last_offset) for i in infos if i.last_offset < below]


def _rolls(log: Log) -> list[int]:
    """Attach a producer-state source that records the log end at each call: at each roll and close.

    A storage may read the producer state at other times too (its cleaner
    does), so tests copy the list before calling anything but appends.
    """
    calls: list[int] = []

    def source() -> Sequence[ProducerEntry]:
        calls.append(log.log_end_offset)
        return ()

    log.attach_producer_state(source)
    return calls


def _state_at(offset: int) -> tuple[ProducerEntry, ...]:
    """A stand-in for the broker's producer state at ``offset``: one producer whose last batch ends below it."""
    return (ProducerEntry(7, 2, (BatchMetadata(0, offset - 1, 0, offset - 1, 1000 + offset),)),)


def _latest_per_key(
    written: Sequence[tuple[int, bytes | None, bytes | None]], upper: int, drop_tombstones: bool = False
) -> list[tuple[int, bytes | None, bytes | None]]:
    """What compaction keeps of ``written``: below ``upper`` the last record of each key, everything from it on."""
    last = {key: offset for offset, key, _ in written if offset < upper}
    return [
        (offset, key, value)
        for offset, key, value in written
        if offset >= upper or (last[key] == offset and not (drop_tombstones and value is None))
    ]


def _fill_until_roll(log: Log, rolls: list[int], written: list, now: int) -> None:
    """Append filler records until the log rolls, so the active segment holds only the one that rolled it."""
    before = len(rolls)
    while len(rolls) == before:
        info = append_records(log, [(b"filler", b"x" * 300, now)])
        written.append((info.first_offset, b"filler", b"x" * 300))


COMPACT = LogConfig(segment_bytes=1500, index_interval_bytes=100, retention_ms=-1, cleanup_policy=("compact",),
                    min_cleanable_dirty_ratio=0.01, delete_retention_ms=60_000)


class LogStorageContract:
    """The contract tests; a plugin's ``Test*`` subclass provides the ``storage_harness`` fixture."""

    @pytest.fixture
    def storage_harness(self) -> StorageHarness:
        raise NotImplementedError("a storage plugin's subclass provides its StorageHarness as this fixture")

    @pytest.fixture
    def subject(self, storage_harness: StorageHarness, tmp_path: Path) -> Iterator[StorageUnderTest]:
        dirs = [tmp_path / f"logs{i}" for i in range(storage_harness.log_dir_count)]
        subject = StorageUnderTest(storage_harness, dirs, ManualClock())
        subject.start()
        yield subject
        if subject.running:
            try:
                subject.close()
            except LogDirError:
                subject.crash()

    # Appending and reading ---------------------------------------------------------------------

    def test_the_storage_and_its_logs_follow_the_core_protocols(self, subject):
        assert isinstance(subject.storage, LogStorage)
        log = subject.open()
        assert isinstance(log, Log)
        assert (log.tp, log.config, log.log_start_offset, log.log_end_offset, log.size_bytes) == (TP, SMALL, 0, 0, 0)
        append_batch(log)
        assert subject.storage.open(TP, SMALL).log_end_offset == 1  # opening an open log gives that log

    def test_appended_batches_read_back_byte_for_byte(self, subject):
        log = subject.open()
        sent = []
        for n in (1, 3, 2):
            buf = bytearray(build_batch([(b"k%d" % i, b"v%d" % i, 1000 + i) for i in range(n)]))
            info = validate_and_assign(buf, log.log_end_offset, 0, 1 << 30)
            log.append(buf, info)
            sent.append(bytes(buf))
        assert log.log_end_offset == 6
        assert log.read(0, 1 << 20, 6) == b"".join(sent)
        assert log.size_bytes == sum(map(len, sent))
        assert batches(log.read(0, 1 << 20, 6)) == [(0, 0), (1, 3), (4, 5)]

    def test_append_must_start_at_the_log_end(self, subject):
        log = subject.open()
        buf = bytearray(build_batch([(None, b"v", 1)]))
        info = validate_and_assign(buf, 5, 0, 1 << 30)
        with pytest.raises(ValueError):
            log.append(buf, info)
        assert log.log_end_offset == 0
        assert append_batch(log).first_offset == 0

    def test_read_at_every_offset_returns_the_batch_holding_it_then_the_following_ones(self, subject):
        log = subject.open()
        infos = [append_batch(log, count=1 + i % 4) for i in range(80)]
        expected = _batches_of(infos, log.log_end_offset)

        def check(log: Log) -> None:
            for offset in range(log.log_end_offset):
                got = batches(log.read(offset, 1 << 20, log.log_end_offset))
                first = next(i for i, (_, last) in enumerate(expected) if last >= offset)
                assert got and got == expected[first : first + len(got)], offset
            assert batches(_whole(log)) == expected  # segments end to end, nothing lost at a roll

        check(log)
        check(subject.restart())

    def test_read_stops_at_max_bytes_and_max_offset_on_whole_batches(self, subject):
        log = subject.open(LogConfig())
        infos = [append_batch(log, count=2) for _ in range(10)]
        size = infos[0].batches[0].size
        assert batches(log.read(0, size * 3 + size // 2, 20)) == [(0, 1), (2, 3), (4, 5)]
        # max_offset (the high watermark) is exclusive.
        assert batches(log.read(0, 1 << 20, 6)) == [(0, 1), (2, 3), (4, 5)]
        assert log.read(6, 1 << 20, 6) == b""
        assert batches(log.read(3, size, 20)) == [(2, 3)]  # an offset inside a batch returns the whole batch
        # KIP-74: the first batch comes whole even above max_bytes, unless min_one_batch is off.
        assert batches(log.read(0, 10, 20)) == [(0, 1)]
        assert log.read(0, 10, 20, min_one_batch=False) == b""
        assert batches(log.read(0, size * 2, 20, min_one_batch=False)) == [(0, 1), (2, 3)]

    def test_read_region_answers_what_read_does_and_a_region_outlives_its_segment(self, subject):
        log = subject.open(LogConfig())
        for _ in range(40):
            append_batch(log, count=4, value_size=2000)  # about 320 KB: large enough for a region, if any
        end = log.log_end_offset
        for offset, max_bytes, max_offset, first in ((0, 1 << 30, end, True), (7, 50_000, end, True),
                                                     (0, 10, end, False), (end, 1 << 20, end, True), (3, 1 << 20, 40, True)):
            answer = log.read_region(offset, max_bytes, max_offset, first)
            assert bytes(answer) == log.read(offset, max_bytes, max_offset, first)
            if isinstance(answer, FileRegion):
                answer.close()
        with pytest.raises(OffsetOutOfRangeError):
            log.read_region(end + 1, 1 << 20, end + 1)
        whole = log.read(0, 1 << 30, end)
        region = log.read_region(0, 1 << 30, end)
        subject.storage.delete(TP)  # the partition's files go: a region already handed out still reads
        assert bytes(region) == whole
        if isinstance(region, FileRegion):
            region.close()

    def test_a_batch_larger_than_a_segment_is_stored_and_read_whole(self, subject):
        log = subject.open()
        append_batch(log)
        big = append_batch(log, value_size=5000)
        append_batch(log)
        assert batches(log.read(1, 10, 3)) == [(1, 1)]
        assert len(log.read(1, 10, 3)) == big.batches[0].size
        assert batches(_whole(subject.restart())) == [(0, 0), (1, 1), (2, 2)]

    def test_reads_outside_the_log_raise_offset_out_of_range_and_at_the_end_are_empty(self, subject):
        log = subject.open()
        for _ in range(3):
            append_batch(log)
        assert log.read(3, 1 << 20, 3) == b""
        with pytest.raises(OffsetOutOfRangeError):
            log.read(4, 1 << 20, 10)
        log.delete_records_before(2)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(1, 1 << 20, 3)
        assert batches(log.read(2, 1 << 20, 3)) == [(2, 2)]

    def test_batch_headers_describe_each_batch_from_the_one_holding_the_offset(self, subject):
        log = subject.open()
        infos = [append_records(log, [(None, b"x" * 30, 1000 + i)] * (1 + i % 3), producer_id=i % 2 * 5,
                                base_sequence=0) for i in range(40)]
        expected = [(i.first_offset, i.last_offset, i.max_timestamp, (k % 2) * 5) for k, i in enumerate(infos)]
        for start in (0, 1, infos[17].first_offset + 1, log.log_end_offset - 1):
            got = [(h.base_offset, h.last_offset, h.max_timestamp, h.producer_id) for h in log.batch_headers(start)]
            first = next(k for k, e in enumerate(expected) if e[1] >= start)
            assert got == expected[first:]
        assert list(log.batch_headers(log.log_end_offset)) == []

    # Segments ----------------------------------------------------------------------------------

    def test_segments_roll_when_the_next_batch_does_not_fit_segment_bytes(self, subject):
        log = subject.open()
        rolls = _rolls(log)
        infos = [append_batch(log) for _ in range(60)]
        size = infos[0].batches[0].size
        per_segment = SMALL.segment_bytes // size
        assert rolls == list(range(per_segment, 60, per_segment))
        assert batches(_whole(log)) == [(o, o) for o in range(60)]

    def test_segments_roll_by_segment_ms(self, subject):
        log = subject.open(attrs.evolve(SMALL, segment_ms=1000))
        rolls = _rolls(log)
        append_batch(log, timestamp=subject.clock.now)
        subject.clock.now += 1000  # segment.ms waited, not exceeded
        append_batch(log, timestamp=subject.clock.now)
        assert rolls == []
        subject.clock.now += 1
        append_batch(log, timestamp=subject.clock.now)
        assert rolls == [2]
        assert batches(_whole(log)) == [(0, 0), (1, 1), (2, 2)]

    def test_update_config_applies_from_the_next_append(self, subject):
        log = subject.open(LogConfig())
        rolls = _rolls(log)
        infos = [append_batch(log) for _ in range(10)]
        size = infos[0].batches[0].size
        assert rolls == []
        log.update_config(attrs.evolve(SMALL, segment_bytes=size * 3))
        for _ in range(4):
            append_batch(log)
        assert rolls == [10, 13]

    # Timestamps --------------------------------------------------------------------------------

    def test_offset_for_timestamp_is_the_first_record_at_or_after_it(self, subject):
        log = subject.open()
        written = []
        for i in range(60):
            stamps = [1000 + i * 10 + (-25, 7, 13)[j] for j in range(1 + i % 3)]
            info = append_batch(log, timestamps=stamps)
            written += zip(range(info.first_offset, info.last_offset + 1), stamps)
        targets = range(900, 1700, 3)

        def first_at_or_after(ts: int, start: int = 0) -> tuple[int, int] | None:
            return next(((o, t) for o, t in written if t >= ts and o >= start), None)

        expected = [first_at_or_after(t) for t in targets]
        assert [log.offset_for_timestamp(t) for t in targets] == expected
        assert log.offset_for_timestamp(10**12) is None
        offset, ts = max(written, key=lambda r: (r[1], -r[0]))
        assert log.max_timestamp() == (ts, offset)
        log = subject.restart()
        assert [log.offset_for_timestamp(t) for t in targets] == expected
        assert log.max_timestamp() == (ts, offset)
        log.delete_records_before(100)
        assert [log.offset_for_timestamp(t) for t in targets] == [first_at_or_after(t, 100) for t in targets]

    def test_max_timestamp_of_an_empty_log_and_inside_a_batch(self, subject):
        log = subject.open(LogConfig())
        assert log.max_timestamp() == (-1, -1)
        append_batch(log, timestamps=[5, 9, 7])
        append_batch(log, timestamps=[8, 3, 1])
        assert log.max_timestamp() == (9, 1)
        assert log.offset_for_timestamp(8) == (1, 9)
        assert log.offset_for_timestamp(2) == (0, 5)

    # Leader epochs -----------------------------------------------------------------------------

    def _epochs(self, log: Log) -> None:
        """Epoch 0 from 0, 2 from 10, 5 from 25, log end 40: appends carry the epoch assigned before them, as a leader's do."""
        for epoch, start, end in ((0, 0, 10), (2, 10, 25), (5, 25, 40)):
            log.assign_epoch(epoch, start)
            for _ in range(start, end):
                append_batch(log, epoch=epoch)

    def test_leader_epochs_answer_offsets_for_leader_epoch(self, subject):
        log = subject.open()
        self._epochs(log)
        assert list(log.epoch_entries()) == [EpochEntry(0, 0), EpochEntry(2, 10), EpochEntry(5, 25)]
        assert log.end_offset_for_epoch(5) == (5, 40)
        assert log.end_offset_for_epoch(3) == (2, 25)
        assert log.end_offset_for_epoch(2) == (2, 25)
        assert log.end_offset_for_epoch(0) == (0, 10)
        assert log.end_offset_for_epoch(6) == (-1, -1)
        log.assign_epoch(4, 40)  # not newer than the latest: ignored
        assert list(log.epoch_entries())[-1] == EpochEntry(5, 25)

    def test_leader_epochs_survive_a_clean_restart_and_a_crash_after_flush(self, subject):
        log = subject.open()
        self._epochs(log)
        expected = [EpochEntry(0, 0), EpochEntry(2, 10), EpochEntry(5, 25)]
        assert list(subject.restart().epoch_entries()) == expected
        subject.logs[-1].flush()
        log = subject.recover()
        assert list(log.epoch_entries()) == expected
        assert log.end_offset_for_epoch(2) == (2, 25)

    def test_leader_epochs_follow_truncation_and_the_log_start(self, subject):
        log = subject.open()
        self._epochs(log)
        log.truncate_to(20)
        assert list(log.epoch_entries()) == [EpochEntry(0, 0), EpochEntry(2, 10)]
        assert log.end_offset_for_epoch(2) == (2, 20)
        log.delete_records_before(5)
        assert list(log.epoch_entries()) == [EpochEntry(0, 5), EpochEntry(2, 10)]
        assert list(subject.restart().epoch_entries()) == [EpochEntry(0, 5), EpochEntry(2, 10)]

    # Truncation --------------------------------------------------------------------------------

    def test_truncate_to_drops_everything_from_the_offset_and_appends_continue_there(self, subject):
        log = subject.open()
        infos = [append_batch(log, count=2) for _ in range(60)]
        log.truncate_to(70)
        assert log.log_end_offset == 70
        assert batches(_whole(log)) == _batches_of(infos, 70)
        assert log.read(70, 1 << 20, 200) == b""
        with pytest.raises(OffsetOutOfRangeError):
            log.read(72, 1 << 20, 200)
        log.truncate_to(100)  # past the end: nothing to do
        assert log.log_end_offset == 70
        assert append_batch(log).first_offset == 70
        assert batches(log.read(70, 1 << 20, 71)) == [(70, 70)]
        assert subject.restart().log_end_offset == 71

    def test_a_flushed_truncation_is_not_undone_by_a_crash(self, subject):
        log = subject.open()
        infos = [append_batch(log) for _ in range(50)]
        log.flush()
        log.truncate_to(20)
        log.flush()
        log = subject.recover()
        assert log.log_end_offset == 20
        assert batches(_whole(log)) == _batches_of(infos, 20)

    def test_truncate_fully_and_start_at_empties_the_log_at_any_offset(self, subject):
        log = subject.open()
        self._epochs(log)
        log.truncate_fully_and_start_at(1000)
        assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (1000, 1000, 0)
        assert list(log.epoch_entries()) == []
        assert log.read(1000, 1 << 20, 1000) == b""
        with pytest.raises(OffsetOutOfRangeError):
            log.read(999, 1 << 20, 1000)
        assert append_batch(log, count=3).first_offset == 1000
        log = subject.restart()
        assert (log.log_start_offset, log.log_end_offset) == (1000, 1003)
        assert batches(_whole(log)) == [(1000, 1002)]
        log.truncate_fully_and_start_at(5000)
        log = subject.recover()
        assert (log.log_start_offset, log.log_end_offset) == (5000, 5000)

    # Segments, for tiered storage ---------------------------------------------------------------

    def test_closed_segments_are_the_rolled_ones_with_their_files(self, subject):
        log = subject.open()
        log.attach_producer_state(lambda: _state_at(log.log_end_offset))
        for _ in range(100):
            append_batch(log)
        closed = log.closed_segments()
        assert len(closed) >= 3, "100 batches roll several segments of SMALL"
        assert closed[0].base_offset == 0
        assert [c.base_offset for c in closed[1:]] == [c.next_offset for c in closed[:-1]]
        # The active segment is not among them: what follows the last closed one is read from the log.
        assert 0 < closed[-1].next_offset < log.log_end_offset
        assert batches(_whole(log))[closed[-1].next_offset][0] == closed[-1].next_offset
        for segment in closed:
            data = segment.log.read_bytes()  # the batches exactly as on the wire, what remote storage keeps
            assert len(data) == segment.size_bytes
            assert batches(data) == [(o, o) for o in range(segment.base_offset, segment.next_offset)]
            assert segment.offset_index.is_file() and segment.time_index.is_file()
            assert segment.transaction_index is None
            assert segment.max_timestamp_ms == 1000
            assert segment.producer_snapshot is not None and segment.producer_snapshot.is_file()

    def test_closed_segments_start_at_the_local_log_start_and_name_their_transaction_index(self, subject):
        log = subject.open()
        for _ in range(30):
            append_batch(log)
        txns = self._aborted(log, 6)
        for _ in range(30):
            append_batch(log)
        with_txns = [c for c in log.closed_segments() if c.transaction_index is not None]
        assert with_txns and all(c.transaction_index.is_file() for c in with_txns)
        markers = {t.last_offset for t in txns}
        assert {c.base_offset for c in with_txns} == {
            c.base_offset for c in log.closed_segments() if any(c.base_offset <= m < c.next_offset for m in markers)}
        target = log.closed_segments()[2].base_offset + 1
        log.delete_records_before(target)
        assert log.local_log_start_offset == log.log_start_offset == target
        assert log.closed_segments()[0].base_offset <= target < log.closed_segments()[0].next_offset

    def test_a_retention_limit_keeps_every_segment_not_wholly_below_it(self, subject):
        log = subject.open(attrs.evolve(SMALL, retention_ms=0))
        for _ in range(100):
            append_batch(log, timestamp=1)
        closed = log.closed_segments()
        assert len(closed) >= 4, "100 batches roll several segments of SMALL"
        bound = [closed[1].next_offset]
        log.attach_retention_limit(lambda: bound[0])
        assert log.apply_retention(subject.clock.now) == 2
        assert log.log_start_offset == log.local_log_start_offset == closed[1].next_offset
        bound[0] = closed[2].next_offset - 1  # inside the third segment: it stays
        assert log.apply_retention(subject.clock.now) == 0
        log.update_config(attrs.evolve(SMALL, retention_bytes=0))
        bound[0] = closed[3].next_offset
        assert log.apply_retention(subject.clock.now) == 2
        assert log.log_start_offset == closed[3].next_offset
        bound[0] = log.log_end_offset
        log.apply_retention(subject.clock.now)
        assert log.closed_segments() == [] and log.log_end_offset == 100  # only the active segment is left

    def test_a_log_with_nothing_in_remote_storage_reads_nothing_remotely(self, subject):
        log = subject.open()
        for _ in range(10):
            append_batch(log)
        assert log.local_log_start_offset == log.log_start_offset == 0
        for offset in (0, 5, 10, 11):
            with pytest.raises(OffsetOutOfRangeError):
                anyio.run(log.read_remote, offset, 1 << 20, 10)
        assert anyio.run(log.remote_offset_for_timestamp, 0) is None  # ListOffsets by time finds nothing remote

    # Retention ---------------------------------------------------------------------------------

    def test_retention_by_time_deletes_whole_old_segments_but_never_the_active_one(self, subject):
        log = subject.open(attrs.evolve(SMALL, retention_ms=10_000))
        rolls = _rolls(log)
        now = subject.clock.now
        for i in range(60):
            append_batch(log, timestamp=now - 30_000 + i * 500)  # the last ones are recent
        # Segments whose newest record is older than 10 s go; the first one holding a recent record stays.
        first_recent = next(o for o in range(60) if now - 30_000 + o * 500 >= now - 10_000)
        kept_from = max(r for r in [0, *rolls] if r <= first_recent)
        assert log.apply_retention(now) > 0
        assert log.log_start_offset == kept_from
        assert batches(_whole(log)) == [(o, o) for o in range(kept_from, 60)]
        with pytest.raises(OffsetOutOfRangeError):
            log.read(kept_from - 1, 1 << 20, 60)
        assert log.apply_retention(now + 10**9) > 0  # everything old: only the active segment stays
        active = rolls[-1]
        assert (log.log_start_offset, log.log_end_offset) == (active, 60)
        assert log.apply_retention(now + 10**9) == 0
        assert subject.restart().log_start_offset == active

    def test_retention_by_bytes_keeps_the_newest_segments_within_the_limit(self, subject):
        log = subject.open()
        rolls = _rolls(log)
        infos = [append_batch(log) for _ in range(60)]
        size = infos[0].batches[0].size
        log.update_config(attrs.evolve(SMALL, retention_bytes=size * 25))
        assert log.apply_retention(subject.clock.now) > 0
        # Whole segments from the oldest go while what stays is still at least retention.bytes.
        expected = next(base for base, following in zip([0, *rolls], [*rolls, 60]) if 60 - following < 25)
        assert log.log_start_offset == expected
        assert log.size_bytes == (60 - expected) * size
        assert batches(_whole(log)) == [(o, o) for o in range(expected, 60)]

    def test_delete_records_before_raises_the_log_start_and_retention_removes_what_is_below(self, subject):
        log = subject.open()
        rolls = _rolls(log)
        for _ in range(60):
            append_batch(log)
        target = rolls[1] + 2
        assert log.delete_records_before(target) == target
        assert log.delete_records_before(3) == target  # never lowered
        assert log.log_start_offset == target
        assert batches(log.read(target, 1, 60)) == [(target, target)]
        with pytest.raises(OffsetOutOfRangeError):
            log.read(target - 1, 1 << 20, 60)
        size = log.size_bytes
        assert log.apply_retention(subject.clock.now) == 2  # the segments wholly below the log start
        assert log.size_bytes < size
        assert log.log_start_offset == target
        log = subject.restart()
        assert (log.log_start_offset, log.log_end_offset) == (target, 60)
        assert batches(_whole(log))[0] == (target, target)

    def test_a_compacted_log_is_not_deleted_by_time_or_size_unless_its_policy_also_says_delete(self, subject):
        log = subject.open(attrs.evolve(COMPACT, retention_ms=1, retention_bytes=1))
        for i in range(60):
            append_records(log, [(b"k%d" % i, b"v", 1000)])
        assert log.apply_retention(subject.clock.now) == 0
        assert log.log_start_offset == 0
        log.update_config(attrs.evolve(log.config, cleanup_policy=("compact", "delete")))
        assert log.apply_retention(subject.clock.now) > 0
        assert 0 < log.log_start_offset < 60

    # Producer snapshots ------------------------------------------------------------------------

    def test_producer_state_is_snapshotted_at_each_roll_and_at_close(self, subject):
        log = subject.open()
        calls: list[int] = []

        def source() -> Sequence[ProducerEntry]:
            calls.append(log.log_end_offset)
            return _state_at(log.log_end_offset)

        log.attach_producer_state(source)
        assert log.latest_producer_snapshot() is None
        for _ in range(30):
            append_batch(log)
        assert calls
        snapshot = log.latest_producer_snapshot()
        assert (snapshot.offset, snapshot.producers) == (calls[-1], _state_at(calls[-1]))
        append_batch(log)
        subject.close()
        assert calls[-1] == 31
        subject.start()
        log = subject.open()
        snapshot = log.latest_producer_snapshot()
        assert (snapshot.offset, snapshot.producers) == (31, _state_at(31))

    def test_producer_snapshots_go_with_truncation_and_the_log_start(self, subject):
        log = subject.open()
        log.attach_producer_state(lambda: _state_at(log.log_end_offset))
        for _ in range(60):
            append_batch(log)
        latest = log.latest_producer_snapshot().offset
        log.truncate_to(latest - 5)
        snapshot = log.latest_producer_snapshot()
        assert snapshot is None or snapshot.offset <= latest - 5
        if snapshot is not None:
            assert snapshot.producers == _state_at(snapshot.offset)
        # One batch reaching past the old snapshot's offset: a snapshot of the truncated batches must not come back.
        log.attach_producer_state(lambda: ())
        append_batch(log, count=10)
        snapshot = log.latest_producer_snapshot()
        assert snapshot is None or snapshot.offset < latest or snapshot.producers == ()
        log.delete_records_before(log.log_end_offset)
        snapshot = log.latest_producer_snapshot()
        assert snapshot is None or snapshot.offset >= log.log_start_offset
        log.truncate_fully_and_start_at(500)
        assert log.latest_producer_snapshot() is None

    def test_a_snapshot_a_closed_segment_handed_out_is_installed_at_a_fresh_start(self, subject):
        # A follower starting at its leader's local log start: the producer state there comes from remote storage,
        # as the bytes of the snapshot file that the leader's closed segment named.
        log = subject.open()
        log.attach_producer_state(lambda: _state_at(log.log_end_offset))
        for _ in range(60):
            append_batch(log)
        segment = log.closed_segments()[-1]
        data = segment.producer_snapshot.read_bytes()
        log.truncate_fully_and_start_at(500)
        with pytest.raises(ValueError):
            log.install_producer_snapshot(500, b"not a snapshot")
        assert log.latest_producer_snapshot() is None
        log.install_producer_snapshot(500, data)
        snapshot = log.latest_producer_snapshot()
        assert (snapshot.offset, snapshot.producers) == (500, _state_at(segment.next_offset))

    def test_a_producer_snapshot_after_a_crash_is_one_the_log_wrote_and_within_the_log(self, subject):
        subject.close()
        subject.start(**{"log.flush.offset.checkpoint.interval.ms": "1"})  # a flush also checkpoints the recovery point
        log = subject.open()
        log.attach_producer_state(lambda: _state_at(log.log_end_offset))
        for _ in range(60):
            append_batch(log)
        subject.clock.now += 1000
        log.flush()
        for _ in range(5):
            append_batch(log)
        log = subject.recover(tear=True)
        snapshot = log.latest_producer_snapshot()
        # None is allowed (the broker then replays the whole log); a snapshot must be one the log wrote, within it.
        if snapshot is not None:
            assert log.log_start_offset <= snapshot.offset <= log.log_end_offset
            assert snapshot.producers == _state_at(snapshot.offset)

    # Aborted transactions ----------------------------------------------------------------------

    def _aborted(self, log: Log, transactions: int) -> list[AbortedTxn]:
        """Transactions of two data batches and an ABORT marker each, reported as the broker does after the marker."""
        found = []
        for i in range(transactions):
            pid = 100 + i
            first = append_records(log, [(None, b"t" * 200, 1000)], producer_id=pid, base_sequence=0,
                                   transactional=True).first_offset
            append_records(log, [(None, b"t" * 200, 1000)], producer_id=pid, base_sequence=1, transactional=True)
            marker = append_marker(log, pid, commit=False)
            txn = AbortedTxn(pid, first, marker, marker + 1)
            log.append_aborted_txn(txn)
            found.append(txn)
        return found

    def test_aborted_transactions_are_found_by_overlap(self, subject):
        log = subject.open()
        txns = self._aborted(log, 12)
        end = log.log_end_offset
        assert log.aborted_txns(0, end) == txns
        for start in range(0, end, 4):
            for upper in range(start + 1, end + 1, 5):
                assert log.aborted_txns(start, upper) == [
                    t for t in txns if t.last_offset >= start and t.first_offset < upper
                ], (start, upper)

    def test_aborted_transactions_are_reported_idempotently_and_only_below_the_log_end(self, subject):
        log = subject.open()
        txns = self._aborted(log, 3)
        log.append_aborted_txn(txns[1])  # a replay after a restart reports them again
        log.append_aborted_txn(txns[2])
        assert log.aborted_txns(0, log.log_end_offset) == txns
        end = log.log_end_offset
        with pytest.raises(ValueError):
            log.append_aborted_txn(AbortedTxn(9, end - 1, end, end + 1))

    def test_aborted_transactions_survive_restarts_and_go_with_truncation(self, subject):
        log = subject.open()
        txns = self._aborted(log, 12)
        log = subject.restart()
        assert log.aborted_txns(0, 10**6) == txns
        log.truncate_to(txns[6].last_offset)
        assert log.aborted_txns(0, 10**6) == txns[:6]
        assert subject.restart().aborted_txns(0, 10**6) == txns[:6]

    def test_aborted_transactions_lost_in_a_crash_are_replayed_from_an_older_producer_snapshot(self, subject):
        """After an unclean stop a log may forget entries, but then no producer snapshot may skip their markers."""
        log = subject.open()
        log.attach_producer_state(lambda: _state_at(log.log_end_offset))
        txns = self._aborted(log, 12)
        log.flush()
        log = subject.recover()
        kept = log.aborted_txns(0, 10**6)
        assert kept == txns[: len(kept)]
        snapshot = log.latest_producer_snapshot()
        if len(kept) < len(txns) and snapshot is not None:
            assert snapshot.offset <= txns[len(kept)].last_offset
        assert log.log_end_offset == txns[-1].last_offset + 1

    # Clean restarts and crashes ----------------------------------------------------------------

    def test_a_clean_restart_keeps_everything(self, subject):
        log = subject.open()
        self._epochs(log)
        log.delete_records_before(3)
        before = (_whole(log), log.log_start_offset, log.log_end_offset, log.size_bytes, list(log.epoch_entries()),
                  log.max_timestamp(), log.offset_for_timestamp(0))
        log = subject.restart()
        assert (_whole(log), log.log_start_offset, log.log_end_offset, log.size_bytes, list(log.epoch_entries()),
                log.max_timestamp(), log.offset_for_timestamp(0)) == before
        _every_offset_reads(log)
        assert append_batch(log).first_offset == 40

    def test_a_crash_keeps_every_flushed_batch_and_a_readable_log(self, subject):
        log = subject.open()
        infos = [append_batch(log, count=2, timestamp=1000 + i) for i in range(40)]
        log.flush()
        flushed = log.log_end_offset
        infos += [append_batch(log, count=2, timestamp=2000 + i) for i in range(5)]
        written = _whole(log)
        log = subject.recover()
        end = log.log_end_offset
        assert flushed <= end <= 90
        assert batches(_whole(log)) == _batches_of(infos, end)
        assert _whole(log) == written[: len(_whole(log))]
        _every_offset_reads(log)
        assert log.offset_for_timestamp(1005) == (10, 1005)
        assert append_batch(log).first_offset == end
        assert subject.restart().log_end_offset == end + 1

    def test_a_torn_tail_is_cut_at_recovery_and_appends_continue_there(self, subject):
        log = subject.open()
        infos = [append_batch(log, count=2) for _ in range(30)]
        log.flush()
        flushed = log.log_end_offset
        log.assign_epoch(1, flushed)
        torn = append_batch(log, count=2, epoch=1)
        log = subject.recover(tear=True)
        end = log.log_end_offset
        assert flushed <= end <= torn.first_offset
        assert batches(_whole(log)) == _batches_of(infos, end)
        # The epoch the lost batch began is gone with it.
        assert all(entry.start_offset < end for entry in log.epoch_entries())
        assert log.end_offset_for_epoch(1) != (1, torn.last_offset + 1)
        _every_offset_reads(log)
        assert append_batch(log, count=2).first_offset == end
        assert batches(log.read(end, 1 << 20, end + 2)) == [(end, end + 1)]

    def test_a_crash_of_a_new_log_recovers_an_empty_log(self, subject):
        subject.open()
        log = subject.recover()
        assert (log.log_start_offset, log.log_end_offset, _whole(log)) == (0, 0, b"")
        assert append_batch(log).first_offset == 0

    def test_a_crash_after_a_close_changes_nothing(self, subject):
        log = subject.open()
        infos = [append_batch(log) for _ in range(45)]
        log = subject.restart()
        log = subject.recover()
        assert batches(_whole(log)) == _batches_of(infos, 45)

    # Disk errors -------------------------------------------------------------------------------

    def _state(self, log: Log) -> tuple:
        return log.log_start_offset, log.log_end_offset, log.size_bytes, _whole(log)

    def _assert_offline(self, subject: StorageUnderTest, log: Log) -> None:
        """The contract's rule: a disk error takes the log's directory offline, alone, until the storage restarts.

        Every call on the log then fails at once, the working disk
        notwithstanding, and :meth:`LogStorage.offline_dirs` names the
        directory; a log in another directory (when the harness has two)
        goes on.
        """
        path = subject.storage.dir_of(log.tp)
        assert subject.storage.offline_dirs() == [path]
        assert [info.error is not None for info in subject.storage.log_dirs()] == [
            info.path == path for info in subject.storage.log_dirs()]
        with pytest.raises(LogDirError):
            self._state(log)
        with pytest.raises(LogDirError):
            append_batch(log)
        if subject.harness.log_dir_count > 1:
            other = subject.open(tp=TopicPartition("elsewhere", 0))
            assert subject.storage.dir_of(other.tp) != path
            assert append_batch(other).first_offset == 0
            assert batches(_whole(other)) == [(0, 0)]

    @pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EROFS])
    def test_a_failing_disk_fails_appends_and_flushes_with_log_dir_error_and_loses_nothing(self, subject, code):
        log = subject.open()
        infos = [append_batch(log) for _ in range(25)]
        log.flush()
        with subject.harness.failing_disk(code):
            with pytest.raises(LogDirError):
                append_batch(log)
            with pytest.raises(LogDirError):
                log.flush()
        self._assert_offline(subject, log)
        log = subject.recover()  # the disk works again
        assert batches(_whole(log)) == _batches_of(infos, 10**9)
        assert append_batch(log).first_offset == len(infos)
        assert subject.restart().log_end_offset == len(infos) + 1

    def test_an_append_that_fails_while_rolling_loses_nothing(self, subject):
        log = subject.open()
        rolls = _rolls(log)
        size = append_batch(log).batches[0].size
        while (log.log_end_offset + 1) * size <= SMALL.segment_bytes:
            append_batch(log)
        end = log.log_end_offset
        log.flush()
        with subject.harness.failing_disk(errno.ENOSPC), pytest.raises(LogDirError):
            append_batch(log)  # does not fit: needs a new segment
        self._assert_offline(subject, log)
        assert set(rolls) <= {end}  # a roll only ever at the log end
        log = subject.recover()
        assert batches(_whole(log))[:end] == [(o, o) for o in range(end)]
        assert append_batch(log).first_offset == log.log_end_offset - 1

    def test_a_failed_read_raises_log_dir_error_or_answers_right(self, subject):
        log = subject.open()
        for _ in range(5):
            append_batch(log)
        expected = log.read(2, 1 << 20, 5)
        with subject.harness.failing_disk(errno.EIO):
            try:
                got = log.read(2, 1 << 20, 5)
            except LogDirError:
                got = None
        if got is None:  # the read reached the failing disk
            self._assert_offline(subject, log)
        else:  # or was served from memory
            assert got == expected
            assert subject.storage.offline_dirs() == []

    # The storage -------------------------------------------------------------------------------

    def test_stored_and_delete(self, subject):
        other = TopicPartition("other-topic", 3)
        log = subject.open()
        append_batch(log)
        append_batch(subject.open(tp=other))
        assert sorted(subject.storage.stored()) == sorted([TP, other])
        subject.storage.delete(other)
        assert subject.storage.stored() == [TP]
        subject.close()
        subject.start()
        assert subject.storage.stored() == [TP]
        assert subject.open(tp=other).log_end_offset == 0

    def test_high_watermarks_are_checkpointed_per_log_and_read_back_after_a_restart(self, subject):
        other = TopicPartition("other-topic", 3)
        append_batch(subject.open())
        append_batch(subject.open(tp=other))
        subject.storage.checkpoint_high_watermarks({TP: 1, other: 0})
        assert subject.storage.high_watermarks() == {TP: 1, other: 0}
        subject.storage.checkpoint_high_watermarks({TP: 1})  # missing partitions are dropped
        subject.crash()
        assert subject.start().high_watermarks() == {TP: 1}

    def test_clean_shutdown_epoch_is_the_epoch_of_a_clean_close_and_minus_one_after_a_crash(self, subject):
        subject.open()
        subject.close(broker_epoch=42)
        assert subject.start().clean_shutdown_epoch() == 42
        subject.open()
        subject.crash()
        assert subject.start().clean_shutdown_epoch() == -1

    def test_log_dirs_dir_of_and_move(self, subject):
        dirs = [info.path for info in subject.storage.log_dirs()]
        assert len(dirs) == subject.harness.log_dir_count
        assert all(info.error is None for info in subject.storage.log_dirs())
        log = subject.open()
        assert subject.storage.dir_of(TP) in dirs
        with pytest.raises(KeyError):
            subject.storage.dir_of(TopicPartition("nowhere", 0))
        if len(dirs) < 2:
            pytest.skip("the harness gives the storage a single log directory: nothing to move")
        log.attach_producer_state(lambda: _state_at(log.log_end_offset))
        self._epochs(log)
        txns = self._aborted(log, 2)
        before = self._state(log), list(log.epoch_entries())
        snapshot = log.latest_producer_snapshot()
        target = next(d for d in dirs if d != subject.storage.dir_of(TP))
        with pytest.raises(LogDirNotFoundError):
            subject.storage.move(TP, str(subject.dirs[0].parent / "elsewhere"))
        with pytest.raises(KeyError):
            subject.storage.move(TopicPartition("nowhere", 0), target)
        subject.storage.move(TP, subject.storage.dir_of(TP))  # where it is: nothing to do
        subject.storage.move(TP, target)
        assert subject.storage.dir_of(TP) == target
        assert (self._state(log), list(log.epoch_entries())) == before
        moved = log.latest_producer_snapshot()  # the same, or a newer one (the move may close and reopen the log)
        assert moved.offset >= snapshot.offset and moved.producers == _state_at(moved.offset)
        assert log.aborted_txns(0, 10**6) == txns
        end = log.log_end_offset
        assert append_batch(log, epoch=5).first_offset == end
        log = subject.restart()
        assert subject.storage.dir_of(TP) == target
        assert batches(_whole(log))[-1] == (end, end)

    # Compaction --------------------------------------------------------------------------------

    def _compacted(self, subject: StorageUnderTest, keys: int = 10, rounds: int = 12, tombstones: Sequence[int] = (),
                   stable: Callable[[Log], int] | None = None) -> tuple[Log, list, list[int]]:
        """A compacted log of ``rounds`` updates of each of ``keys`` keys, five records a batch, ending with a roll.

        Keys in ``tombstones`` are deleted in the last round. Returns the
        log, what was written as ``(offset, key, value)``, and the offsets
        where it rolled (the last one is the active segment's base).
        """
        log = subject.open(COMPACT)
        rolls = _rolls(log)
        log.attach_last_stable_offset((lambda: stable(log)) if stable else (lambda: log.log_end_offset))
        written: list[tuple[int, bytes | None, bytes | None]] = []
        items = [(b"key-%d" % k, b"value-%d-%d" % (k, r), subject.clock.now) for r in range(rounds) for k in range(keys)]
        items += [(b"key-%d" % k, None, subject.clock.now) for k in tombstones]
        for i in range(0, len(items), 5):
            info = append_records(log, items[i : i + 5])
            written += [(info.first_offset + j, key, value) for j, (key, value, _) in enumerate(items[i : i + 5])]
        _fill_until_roll(log, rolls, written, subject.clock.now)
        return log, written, list(rolls)

    def test_a_log_that_is_not_compacted_is_left_alone_by_clean(self, subject):
        log = subject.open()
        log.attach_last_stable_offset(lambda: log.log_end_offset)
        for i in range(60):
            append_records(log, [(b"same-key", b"v%d" % i, 1000)])
        before = _whole(log)
        assert log.clean(subject.clock.now).cleaned_to == -1
        assert _whole(log) == before

    def test_a_compacted_log_without_a_last_stable_offset_is_never_cleaned(self, subject):
        log = subject.open(COMPACT)
        for i in range(60):
            append_records(log, [(b"same-key", b"v%d" % i, 1000)])
        before = _whole(log)
        log.clean(subject.clock.now + 10**9)
        assert _whole(log) == before

    def test_clean_keeps_the_latest_value_of_each_key_at_its_offset(self, subject):
        log, written, rolls = self._compacted(subject)
        end, size = log.log_end_offset, log.size_bytes
        stats = log.clean(subject.clock.now)
        assert _keyed(_whole(log)) == _latest_per_key(written, rolls[-1])
        assert (log.log_start_offset, log.log_end_offset) == (0, end)
        assert log.size_bytes < size
        assert 0 < stats.cleaned_to <= rolls[-1]
        assert stats.records_written < stats.records_read
        _every_offset_reads(log)
        assert append_records(log, [(b"key-1", b"new", 1000)]).first_offset == end
        log = subject.restart(COMPACT)
        assert _keyed(_whole(log))[:-1] == _latest_per_key(written, rolls[-1])

    def test_clean_never_touches_the_active_segment(self, subject):
        log, written, rolls = self._compacted(subject)
        active = rolls[-1]
        extra = [append_records(log, [(b"key-%d" % (i % 3), b"again-%d" % i, 1000)]) for i in range(3)]
        written += [(info.first_offset, b"key-%d" % (i % 3), b"again-%d" % i) for i, info in enumerate(extra)]
        log.clean(subject.clock.now)
        assert _keyed(_whole(log)) == _latest_per_key(written, active)
        assert [r for r in _keyed(_whole(log)) if r[0] >= active] == [r for r in written if r[0] >= active]

    def test_clean_never_reaches_the_last_stable_offset(self, subject):
        lso: list[int] = []
        log, written, rolls = self._compacted(subject, stable=lambda log: lso[0] if lso else 0)
        assert len(rolls) >= 3
        lso.append(rolls[1])  # a transaction open from the second segment's base
        log.clean(subject.clock.now)
        assert _keyed(_whole(log)) == _latest_per_key(written, rolls[1])
        lso[0] = rolls[1] + 7  # inside a segment: what is from there on stays whatever it is
        log.clean(subject.clock.now)
        kept = _keyed(_whole(log))
        assert [r for r in kept if r[0] >= lso[0]] == [r for r in written if r[0] >= lso[0]]
        assert kept == sorted(set(kept) | set(_latest_per_key(written, lso[0])))

    def test_records_younger_than_min_compaction_lag_ms_are_not_cleaned(self, subject):
        log, written, rolls = self._compacted(subject)
        log.update_config(attrs.evolve(COMPACT, min_compaction_lag_ms=60_000))
        log.clean(subject.clock.now + 30_000)
        assert _keyed(_whole(log)) == written
        log.clean(subject.clock.now + 60_001)
        assert _keyed(_whole(log)) == _latest_per_key(written, rolls[-1])

    def test_tombstones_stay_for_delete_retention_ms_then_go(self, subject):
        log, written, rolls = self._compacted(subject, tombstones=(2, 5))
        log.clean(subject.clock.now)
        kept = _keyed(_whole(log))
        assert kept == _latest_per_key(written, rolls[-1])
        assert [k for _, k, v in kept if v is None] == [b"key-2", b"key-5"]  # deletes still visible to consumers
        subject.clock.now += COMPACT.delete_retention_ms + 1
        rolls = _rolls(log)
        for i in range(40):  # fresh dirty data, so the next cleaning has something to do whatever its trigger
            info = append_records(log, [(b"late-%d" % (i % 4), b"x" * 50, subject.clock.now)])
            written.append((info.first_offset, b"late-%d" % (i % 4), b"x" * 50))
        _fill_until_roll(log, rolls, written, subject.clock.now)
        active = rolls[-1]
        log.clean(subject.clock.now)
        assert _keyed(_whole(log)) == _latest_per_key(written, active, drop_tombstones=True)

    def test_reads_during_cleaning_see_a_valid_offset_ordered_log(self, subject):
        log, written, rolls = self._compacted(subject, keys=50, rounds=30)
        by_offset = {offset: (key, value) for offset, key, value in written}
        errors: list[Exception] = []

        def clean() -> None:
            try:
                log.clean(subject.clock.now)
            except Exception as exc:  # noqa: BLE001 - reported by the test's thread
                errors.append(exc)

        cleaner = threading.Thread(target=clean)
        cleaner.start()
        end = log.log_end_offset
        reads = 0
        while cleaner.is_alive() or reads < 20:
            offset = (reads * 37) % end
            got = _keyed(log.read(offset, 3000, end))
            offsets = [o for o, _, _ in got]
            assert offsets == sorted(set(offsets)), offsets
            assert all(by_offset[o] == (k, v) for o, k, v in got)
            assert any(o >= offset for o in offsets)
            reads += 1
        cleaner.join()
        assert not errors
        assert _keyed(_whole(log)) == _latest_per_key(written, rolls[-1])

    def test_a_crash_after_cleaning_leaves_a_valid_log(self, subject):
        log, written, rolls = self._compacted(subject)
        log.clean(subject.clock.now)
        log.flush()
        log = subject.recover(COMPACT)
        assert log.log_end_offset == written[-1][0] + 1
        assert _keyed(_whole(log)) == _latest_per_key(written, rolls[-1])
        _every_offset_reads(log)

    def test_the_storage_cleans_in_the_background_after_startup_and_close_stops_it(self, subject):
        subject.close()
        subject.start(**{"log.cleaner.threads": "1", "log.cleaner.backoff.ms": "10"})
        log, written, rolls = self._compacted(subject)
        threads = set(threading.enumerate())
        subject.storage.startup()
        eventually(lambda: _keyed(_whole(log)) == _latest_per_key(written, rolls[-1]), 10,
                   "the background cleaning of a dirty compacted log")
        closer = threading.Thread(target=subject.close)
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close() did not stop the background work"
        assert {t for t in threading.enumerate() if t.is_alive()} <= threads

    def test_startup_update_config_and_close_of_an_idle_storage(self, subject):
        threads = set(threading.enumerate())
        subject.storage.startup()
        subject.storage.update_config(subject.config(**{"log.cleaner.threads": "2", "log.cleaner.backoff.ms": "10"}))
        subject.close()
        assert {t for t in threading.enumerate() if t.is_alive()} <= threads
