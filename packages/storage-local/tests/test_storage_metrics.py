"""The local storage's metrics (josef_storage_local.metrics): flushes, segments, offline directories, the cleaner."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cleaner_threads import COMPACT, fill, storage_harness
from test_log_dir_failures import append, full_disk, storage_on

from josef.log import LogConfig, LogDirError
from josef.protocol.topic_partition import TopicPartition
from josef.testing import eventually


def samples(storage) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in storage.collect() for s in f.samples}


def value(values: dict, name: str, **labels: str) -> float:
    return values[name, tuple(sorted(labels.items()))]


FLUSH = "kafka_log_logflushstats_logflushrateandtimems"


def test_flushes_segments_and_offline_directories(tmp_path: Path, clock) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    storage = storage_on(dirs, clock)
    small = LogConfig(segment_bytes=1024)
    rolled = storage.open(TopicPartition("t", 0), small)  # in a
    other = storage.open(TopicPartition("t", 1), small)  # in b
    storage.open(TopicPartition("__cluster_metadata", 0), LogConfig())  # the KRaft log: not a partition's
    for _ in range(3):  # each batch is more than half a segment: every append after the first rolls
        append(rolled, b"x" * 600)
    append(other)
    values = samples(storage)
    assert {labels: v for (name, labels), v in values.items() if name == "kafka_log_log_numlogsegments"} == {
        (("partition", "0"), ("topic", "t")): 3, (("partition", "1"), ("topic", "t")): 1}
    assert value(values, f"{FLUSH}_count") == 0  # no background thread: rolls wait for a full flush

    rolled.flush()
    other.flush()
    values = samples(storage)
    assert value(values, f"{FLUSH}_count") == 2
    assert value(values, f"{FLUSH}_sum") > 0
    quantiles = {dict(labels)["quantile"]: v for (name, labels), v in values.items() if name == FLUSH}
    assert set(quantiles) == {"0.50", "0.75", "0.95", "0.98", "0.99", "0.999"}
    assert all(0 < v <= value(values, f"{FLUSH}_sum") for v in quantiles.values())
    assert value(values, "kafka_log_logmanager_offlinelogdirectorycount") == 0

    with pytest.MonkeyPatch.context() as patch:
        full_disk(patch, dirs[0])
        with pytest.raises(LogDirError):
            append(rolled)
    values = samples(storage)
    assert value(values, "kafka_log_logmanager_offlinelogdirectorycount") == 1
    assert value(values, "kafka_log_logmanager_logdirectoryoffline", logDirectory=str(dirs[0])) == 1
    assert value(values, "kafka_log_logmanager_logdirectoryoffline", logDirectory=str(dirs[1])) == 0
    storage.close()


CLEANER = "kafka_log_logcleaner"
MANAGER = "kafka_log_logcleanermanager"


def test_cleaner_threads_report_their_last_cleanings_and_uncleanable_logs(tmp_path: Path) -> None:
    h = storage_harness(tmp_path, **{"log.cleaner.threads": "1", "log.cleaner.backoff.ms": "20"})
    log = h.open(COMPACT, TopicPartition("compacted", 0))
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    fill(log, h.clock, 200, 100, seed=1)
    broken = h.open(COMPACT, TopicPartition("compacted", 1))
    broken.attach_last_stable_offset(lambda: broken.log_end_offset)
    fill(broken, h.clock, 20, 100, seed=2)
    with open(broken.dir / f"{0:020d}.log", "r+b") as segment:  # the first batch's magic: not a v2 batch any more
        segment.seek(16)
        segment.write(b"\x07")
    before = samples(h.storage)
    assert value(before, f"{CLEANER}_max_clean_time_secs") == 0
    assert value(before, f"{MANAGER}_uncleanable_partitions_count", logDirectory=str(tmp_path / "logs")) == 0
    h.storage.startup()
    try:
        def cleaned() -> dict | None:
            values = samples(h.storage)
            uncleanable = value(values, f"{MANAGER}_uncleanable_partitions_count", logDirectory=str(tmp_path / "logs"))
            return values if values[f"{CLEANER}_max_clean_time_secs", ()] > 0 and uncleanable else None

        values = eventually(cleaned, 10, what="the cleaner thread to clean one log and fail the other")
        # 10,000 records of 100 keys: little of what was read is written again.
        assert 0 < value(values, f"{CLEANER}_cleaner_recopy_percent") < 10
        assert 0 < value(values, f"{CLEANER}_max_buffer_utilization_percent") < 1  # ~100 keys in a 128 MB map
        assert value(values, f"{CLEANER}_deadthreadcount") == 0
        assert value(values, f"{MANAGER}_uncleanable_partitions_count", logDirectory=str(tmp_path / "logs")) == 1
        assert value(values, f"{MANAGER}_uncleanable_bytes", logDirectory=str(tmp_path / "logs")) == broken.size_bytes
        assert 0 <= value(values, f"{MANAGER}_time_since_last_run_ms") < 5000
    finally:
        h.storage.close()
    h.crash()


def test_dirty_percent_and_compaction_delay_of_the_last_choice(tmp_path: Path) -> None:
    h = storage_harness(tmp_path)
    config = LogConfig(segment_bytes=64 * 1024, cleanup_policy=("compact",), retention_ms=-1,
                       min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=60_000)
    log = h.open(config)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    fill(log, h.clock, 400, 2000, seed=4)
    cleaner = h.storage.cleaner
    assert cleaner.grab_filthiest(h.clock.now) is log
    cleaner._in_progress.clear()
    values = samples(h.storage)
    assert value(values, f"{MANAGER}_max_dirty_percent") == 100  # nothing cleaned yet: all dirty
    assert value(values, f"{CLEANER}_max_compaction_delay_secs") == 0
    log.clean(h.clock.now)
    dirty_since = h.clock.now
    fill(log, h.clock, 2, 2000, seed=5)  # a little dirt, far below the ratio
    assert cleaner.grab_filthiest(h.clock.now) is None
    assert value(samples(h.storage), f"{MANAGER}_max_dirty_percent") == 0  # no log worth cleaning
    h.clock.now = dirty_since + 65_000  # 5 s past max.compaction.lag.ms
    assert cleaner.grab_filthiest(h.clock.now) is log
    values = samples(h.storage)
    assert value(values, f"{CLEANER}_max_compaction_delay_secs") == 5.0
    assert 0 < value(values, f"{MANAGER}_max_dirty_percent") < 50
    h.crash()
