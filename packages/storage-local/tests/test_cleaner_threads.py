"""Cleaning while the log is read, and the storage's background cleaner threads."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from cleaning import append_keyed, read_all

from josef.log import LogConfig
from josef.protocol.topic_partition import TopicPartition
from josef.testing import ManualClock, eventually
from josef_storage_local.log import LocalLog

from local_harness import Harness

COMPACT = LogConfig(segment_bytes=64 * 1024, cleanup_policy=("compact",), retention_ms=-1, delete_retention_ms=1000)


@pytest.fixture
def manual(tmp_path: Path) -> Harness:
    h = Harness(tmp_path / "logs", ManualClock())  # type: ignore[arg-type]
    yield h
    h.crash()


def fill(log: LocalLog, clock: ManualClock, batches: int, keys: int, seed: int,
         prefix: bytes = b"key") -> dict[bytes, bytes | None]:
    """Random updates and tombstones, then a roll; returns the latest value per key."""
    rnd = random.Random(seed)
    latest: dict[bytes, bytes | None] = {}
    for _ in range(batches):
        records = []
        for _ in range(50):
            key = prefix + b"-%d" % rnd.randrange(keys)
            value = None if rnd.random() < 0.1 else b"value-%d" % rnd.randrange(10**9) + b"." * 30
            records.append((key, value, clock.now))
            latest[key] = value
        append_keyed(log, records)
    append_keyed(log, [(b"filler", b"x" * COMPACT.segment_bytes, clock.now)])
    return latest


def test_reads_during_cleaning_always_see_a_valid_ordered_log(manual: Harness) -> None:
    clock = manual.clock
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    latest = fill(log, clock, 400, 300, seed=1)
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        try:
            while not stop.is_set():
                _, records = read_all(log)  # checks CRCs and offset order
                seen = {r.key: r.value for r in records}
                for key, value in latest.items():
                    if value is not None:
                        assert seen.get(key) == value, key
                    else:
                        assert seen.get(key) is None, key
                reads[0] += 1
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        cleaned = []
        for _ in range(3):
            fill(log, clock, 40, 300, seed=len(cleaned) + 2, prefix=b"more")  # appends go on between passes
            cleaned.append(log.clean(clock.now).cleaned_to)
            clock.now += 1001
        eventually(lambda: reads[0] >= 4 or failures, what="reads during the cleaning")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert all(c > 0 for c in cleaned)


def storage_harness(tmp_path: Path, **keys: str) -> Harness:
    h = Harness(tmp_path / "logs", ManualClock())  # type: ignore[arg-type]
    h.start(**keys)
    return h


def test_cleaner_threads_clean_the_dirtiest_logs_and_stop_at_close(tmp_path: Path) -> None:
    h = storage_harness(tmp_path, **{"log.cleaner.threads": "2", "log.cleaner.backoff.ms": "20"})
    logs, expected = [], []
    for partition in range(3):
        log = h.open(COMPACT, TopicPartition("compacted", partition))
        log.attach_last_stable_offset(lambda log=log: log.log_end_offset)
        expected.append(fill(log, h.clock, 200, 100, seed=partition))
        logs.append(log)
    plain = h.open(LogConfig(segment_bytes=64 * 1024), TopicPartition("plain", 0))
    plain.attach_last_stable_offset(lambda: plain.log_end_offset)
    fill(plain, h.clock, 50, 100, seed=9)
    plain_size = plain.size_bytes
    h.storage.startup()
    assert {t.name for t in threading.enumerate()} >= {"kafka-log-cleaner-thread-0", "kafka-log-cleaner-thread-1"}
    try:
        for log, latest in zip(logs, expected):
            live = {k: v for k, v in latest.items() if v is not None}

            def cleaned(log: LocalLog = log, live: dict = live) -> bool:
                records = [r for r in read_all(log)[1] if r.key != b"filler"]
                return {r.key: r.value for r in records if r.value is not None} == live and len(records) == len(
                    {r.key for r in records})

            eventually(cleaned, what="cleaning by the threads")
        assert plain.size_bytes == plain_size  # cleanup.policy=delete: never cleaned
        h.storage.update_config(h.storage._config.with_dynamic({"log.cleaner.threads": 0}))
        assert h.storage._cleaner._threads == []
        h.storage.update_config(h.storage._config.with_dynamic({"log.cleaner.threads": 3}))
        names = {t.name for t in threading.enumerate()}
        assert "kafka-log-cleaner-thread-2" in names  # a dynamic change restarts the threads, even from none
    finally:
        threads = [t for t in threading.enumerate() if t.name.startswith("kafka-log-cleaner")
                   and t in h.storage._cleaner._threads]
        h.storage.close()
    assert len(threads) == 3 and not any(t.is_alive() for t in threads)
    h.crash()


def test_close_gives_up_a_throttled_cleaning_promptly(tmp_path: Path) -> None:
    h = storage_harness(tmp_path, **{"log.cleaner.io.max.bytes.per.second": "10000", "log.cleaner.backoff.ms": "20"})
    log = h.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    latest = fill(log, h.clock, 400, 100, seed=3)
    batches_before = read_all(log)[0]
    h.storage.startup()
    # The rate is 10 KB/s and the log ~1 MB: the pass soon sleeps in the throttle, which close must cut short.
    eventually(h.storage._cleaner._throttler.sleeping.is_set, what="the cleaning throttled")
    started = time.monotonic()
    h.storage.close()
    assert time.monotonic() - started < 5
    log = h.reopen(COMPACT)
    assert [p.name for p in h.path().iterdir() if p.name.endswith((".cleaned", ".swap"))] == []
    batches, records = read_all(log)
    assert batches == batches_before  # nothing was swapped in
    assert {r.key: r.value for r in records if r.key != b"filler"} == latest
    h.crash()


def test_dirty_ratio_and_max_compaction_lag_decide_which_logs_the_threads_clean(manual: Harness) -> None:
    clock = manual.clock
    config = LogConfig(segment_bytes=64 * 1024, cleanup_policy=("compact",), retention_ms=-1,
                       min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=60_000)
    log = manual.open(config)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    fill(log, clock, 400, 2000, seed=4)
    cleaner = manual.storage._cleaner
    assert cleaner.grab_filthiest(clock.now) is log  # all dirty
    cleaner._in_progress.clear()
    log.clean(clock.now)
    fill(log, clock, 2, 2000, seed=5)  # a little dirt: far below the ratio
    ratio, due = log.cleaning_priority(clock.now)
    assert 0 < ratio < 0.5 and not due
    assert cleaner.grab_filthiest(clock.now) is None
    clock.now += 60_001  # the dirty records are now older than max.compaction.lag.ms
    assert log.cleaning_priority(clock.now)[1]
    assert cleaner.grab_filthiest(clock.now) is log


@pytest.mark.parametrize("change", ["truncate", "delete", "move", "close"])
def test_a_log_changed_under_the_cleaner_is_left_consistent(tmp_path: Path, change: str) -> None:
    from josef_storage_local.compaction import CleanerOptions

    other = tmp_path / "other"
    h = storage_harness(tmp_path, **{"log.dirs": f"{tmp_path / 'logs'},{other}"})
    log = h.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    latest = fill(log, h.clock, 200, 100, seed=6)
    done = []

    def meddle(_: int) -> None:  # called by the pass with its first bytes read
        if done:
            return
        done.append(change)
        if change == "truncate":
            log.truncate_to(log.log_end_offset - 10)
        elif change == "delete":
            h.storage.delete(h.tp)
        elif change == "move":
            h.storage.move(h.tp, str(other))
        else:
            h.storage.close()

    stats = log.clean(h.clock.now, CleanerOptions(throttle=meddle))
    assert done and stats.cleaned_to == -1  # given up
    for directory in (tmp_path / "logs", other):
        assert not [p for p in directory.rglob("*") if p.name.endswith((".cleaned", ".swap"))]
    if change in ("truncate", "move"):
        records = read_all(log)[1]  # valid and ordered
        if change == "move":
            assert {r.key: r.value for r in records if r.key != b"filler"} == latest
        append_keyed(log, [(b"filler", b"x" * COMPACT.segment_bytes, h.clock.now)])
        cleaned_to = log.clean(h.clock.now).cleaned_to
        assert cleaned_to > 0  # and cleans later, checkpointing where the log now is
        checkpoint = (other if change == "move" else tmp_path / "logs") / "cleaner-offset-checkpoint"
        assert checkpoint.read_text().splitlines()[2] == f"{h.tp.topic} {h.tp.partition} {cleaned_to}"
    h.crash()
