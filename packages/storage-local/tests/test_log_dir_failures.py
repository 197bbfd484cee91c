"""Several log directories: where new logs go, and a failed directory going offline alone."""

from __future__ import annotations

import errno
import os

import pytest
from josef.node.broker_config import CORE_KEYS
from josef.config import Config, ConfigDef
from josef.log import LogConfig, LogDirError
from josef.protocol.records import build_batch, validate_and_assign
from josef.protocol.topic_partition import TopicPartition
from josef.testing import eventually
from josef_storage_local.logdir import CLEAN_SHUTDOWN_FILE
from josef_storage_local.storage import LocalLogStorage


def storage_on(dirs, clock):
    return LocalLogStorage(
        Config.build(ConfigDef(CORE_KEYS), {"log.dirs": ",".join(str(d) for d in dirs)}), clock=clock
    )


def append(log, value=b"v"):
    buf = bytearray(build_batch([(None, value, 1)]))
    info = validate_and_assign(buf, log.log_end_offset, 0, 1 << 20)
    log.append(buf, info)
    return info


@pytest.fixture
def dirs(tmp_path):
    return [tmp_path / name for name in ("a", "b", "c")]


def test_new_logs_go_to_the_directory_with_the_fewest_partitions(dirs, clock):
    (dirs[0] / "old-0").mkdir(parents=True)
    (dirs[0] / "old-1").mkdir()
    (dirs[2] / "old-2").mkdir(parents=True)
    storage = storage_on(dirs, clock)
    placed = [storage.open(TopicPartition("t", p), LogConfig()).dir.parent for p in range(6)]
    # b has none; then b and c have one each (b first, in configured order); then all have two...
    assert placed == [dirs[1], dirs[1], dirs[2], dirs[0], dirs[1], dirs[2]]
    assert [storage.dir_of(TopicPartition("t", p)) for p in range(2)] == [str(dirs[1])] * 2
    storage.close()


def test_the_metadata_log_goes_to_the_first_directory_and_is_not_counted(dirs, clock):
    (dirs[1] / "old-0").mkdir(parents=True)
    storage = storage_on(dirs[:2], clock)
    metadata = storage.open(TopicPartition("__cluster_metadata", 0), LogConfig())
    assert metadata.dir.parent == dirs[0]
    assert storage.open(TopicPartition("t", 0), LogConfig()).dir.parent == dirs[0]  # 0 partitions against 1
    assert storage.open(TopicPartition("t", 1), LogConfig()).dir.parent == dirs[0]  # a tie: the first
    assert storage.open(TopicPartition("t", 2), LogConfig()).dir.parent == dirs[1]
    storage.close()


def test_an_existing_log_stays_where_it_is(dirs, clock):
    storage = storage_on(dirs[1:2], clock)
    append(storage.open(TopicPartition("t", 0), LogConfig()))
    storage.close()
    storage = storage_on(dirs, clock)
    log = storage.open(TopicPartition("t", 0), LogConfig())
    assert (log.dir.parent, log.log_end_offset) == (dirs[1], 1)
    storage.close()


def full_disk(monkeypatch, directory):
    """Every write of a file under ``directory`` fails with ENOSPC, as on a full disk; other disks work."""
    real_pwrite = os.pwrite

    def pwrite(fd, data, position):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", pwrite)


def test_a_disk_error_takes_its_directory_offline_alone(dirs, clock, monkeypatch):
    storage = storage_on(dirs[:2], clock)
    in_a, in_b = (storage.open(TopicPartition("t", p), LogConfig()) for p in range(2))
    also_in_a = storage.open(TopicPartition("t", 2), LogConfig())
    assert (in_a.dir.parent, in_b.dir.parent, also_in_a.dir.parent) == (dirs[0], dirs[1], dirs[0])
    for log in (in_a, in_b, also_in_a):
        append(log)
    assert storage.offline_dirs() == []

    full_disk(monkeypatch, dirs[0])
    with pytest.raises(LogDirError, match="ENOSPC"):
        append(in_a)
    monkeypatch.undo()

    assert storage.offline_dirs() == [str(dirs[0])]
    # Every log of the directory fails fast now, even one that never saw an error, and even for reads.
    with pytest.raises(LogDirError, match="offline.*ENOSPC"):
        append(also_in_a)
    with pytest.raises(LogDirError, match="offline"):
        also_in_a.read(0, 1 << 20, 1)
    with pytest.raises(LogDirError, match="offline"):
        in_a.flush()
    # The other directory keeps working, and gets every new log.
    assert append(in_b).first_offset == 1
    assert in_b.read(0, 1 << 20, 2)
    assert storage.open(TopicPartition("t", 3), LogConfig()).dir.parent == dirs[1]
    with pytest.raises(LogDirError, match="offline"):
        append(storage.open(TopicPartition("t", 0), LogConfig()))

    infos = storage.log_dirs()
    assert [(i.path, i.error is not None) for i in infos] == [(str(dirs[0]), True), (str(dirs[1]), False)]
    assert "ENOSPC" in infos[0].error and infos[1].total_bytes > 0
    assert storage.stored() == [TopicPartition("t", 1), TopicPartition("t", 3)]
    storage.close()
    # The offline directory gets no clean-shutdown marker: its logs are recovered at the next start.
    assert not (dirs[0] / CLEAN_SHUTDOWN_FILE).exists() and (dirs[1] / CLEAN_SHUTDOWN_FILE).exists()

    storage = storage_on(dirs[:2], clock)  # a restart brings the directory back (once the disk is fixed)
    assert storage.offline_dirs() == []
    log = storage.open(TopicPartition("t", 0), LogConfig())
    assert (log.log_end_offset, append(log).first_offset) == (1, 1)
    storage.close()


def test_moves_into_or_out_of_an_offline_directory_fail(dirs, clock, monkeypatch):
    storage = storage_on(dirs[:2], clock)
    in_a, in_b = (storage.open(TopicPartition("t", p), LogConfig()) for p in range(2))
    full_disk(monkeypatch, dirs[0])
    with pytest.raises(LogDirError):
        append(in_a)
    monkeypatch.undo()
    with pytest.raises(LogDirError, match="offline"):
        storage.move(TopicPartition("t", 1), str(dirs[0]))
    with pytest.raises(LogDirError, match="offline"):
        storage.move(TopicPartition("t", 0), str(dirs[1]))
    assert storage.dir_of(TopicPartition("t", 1)) == str(dirs[1])
    storage.close()


def test_with_every_directory_offline_no_log_can_be_created(dirs, clock, monkeypatch):
    storage = storage_on(dirs[:1], clock)
    log = storage.open(TopicPartition("t", 0), LogConfig())
    full_disk(monkeypatch, dirs[0])
    with pytest.raises(LogDirError):
        append(log)
    monkeypatch.undo()
    with pytest.raises(LogDirError, match="every log directory is offline"):
        storage.open(TopicPartition("t", 1), LogConfig())
    storage.close()


def test_deleting_a_log_of_an_offline_directory_leaves_the_disk_alone(dirs, clock, monkeypatch):
    storage = storage_on(dirs[:2], clock)
    log = storage.open(TopicPartition("t", 0), LogConfig())
    append(log)
    full_disk(monkeypatch, dirs[0])
    with pytest.raises(LogDirError):
        append(log)
    monkeypatch.undo()
    storage.delete(TopicPartition("t", 0))
    assert (dirs[0] / "t-0").is_dir()  # not touched; the next start finds it stray
    storage.close()


def test_a_failed_high_watermark_checkpoint_takes_the_directory_offline(dirs, clock, monkeypatch):
    storage = storage_on(dirs[:2], clock)
    tps = [TopicPartition("t", p) for p in range(2)]
    for tp in tps:
        storage.open(tp, LogConfig())
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).startswith(str(dirs[1])):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(LogDirError, match="EIO"):
        storage.checkpoint_high_watermarks({tps[0]: 5, tps[1]: 7})
    monkeypatch.undo()
    assert storage.offline_dirs() == [str(dirs[1])]
    storage.checkpoint_high_watermarks({tps[0]: 6, tps[1]: 8})  # the online directory alone, without an error
    assert storage.high_watermarks() == {tps[0]: 6}
    storage.close()


def test_background_flushes_and_checkpoints_skip_an_offline_directory(dirs, clock, monkeypatch):
    config = Config.build(ConfigDef(CORE_KEYS), {
        "log.dirs": f"{dirs[0]},{dirs[1]}", "log.flush.scheduler.interval.ms": "1000",
        "log.flush.offset.checkpoint.interval.ms": "1000"})
    storage = LocalLogStorage(config, clock=clock)
    in_a, in_b = (storage.open(TopicPartition("t", p), LogConfig(flush_ms=1500)) for p in range(2))
    assert (in_a.dir.parent, in_b.dir.parent) == (dirs[0], dirs[1])
    append(in_a)
    append(in_b)
    full_disk(monkeypatch, dirs[0])
    with pytest.raises(LogDirError):
        append(in_a)
    monkeypatch.undo()
    checkpoint = dirs[0] / "recovery-point-offset-checkpoint"
    before = checkpoint.read_bytes() if checkpoint.exists() else None
    storage.startup()
    try:
        clock.now += 2000
        storage.scheduler.run_due()  # what the manual clock made due (the background thread may take some)
        # The offline log is skipped, not the ones after it; the online directory's checkpoint is written.
        eventually(lambda: in_b.recovery_point == 1, what="the flush of the online log")
        clock.now += 1000
        storage.scheduler.run_due()
        eventually(lambda: (dirs[1] / "recovery-point-offset-checkpoint").read_text().endswith("t 1 1\n"),
                   what="the online directory's checkpoint")
        assert in_a.recovery_point == 0
        assert (checkpoint.read_bytes() if checkpoint.exists() else None) == before
    finally:
        storage.close()


def test_a_directory_that_cannot_be_opened_at_start_is_offline_and_the_storage_starts(dirs, clock):
    dirs[1].parent.mkdir(parents=True, exist_ok=True)
    dirs[1].write_text("not a directory")  # as unusable as a dead disk
    storage = storage_on(dirs[:2], clock)
    assert storage.offline_dirs() == [str(dirs[1])]
    assert storage.open(TopicPartition("t", 0), LogConfig()).dir.parent == dirs[0]
    assert [i.error is not None for i in storage.log_dirs()] == [False, True]
    assert storage.clean_shutdown_epoch() == -1  # what the failed disk holds was not closed cleanly for sure
    storage.close()
    dirs[0].rename(dirs[0].with_name("gone"))
    dirs[0].write_text("not a directory either")
    with pytest.raises(LogDirError, match="opening log directory"):
        storage_on(dirs[:2], clock)


def test_the_cleaner_leaves_an_offline_directory_alone(dirs, clock, monkeypatch):
    storage = storage_on(dirs[:1], clock)
    compacted = storage.open(TopicPartition("c", 0), LogConfig(cleanup_policy=("compact",)))
    compacted.attach_last_stable_offset(lambda: compacted.log_end_offset)
    other = storage.open(TopicPartition("t", 0), LogConfig())
    full_disk(monkeypatch, dirs[0])
    with pytest.raises(LogDirError):
        append(other)
    monkeypatch.undo()
    with pytest.raises(LogDirError, match="offline"):
        compacted.clean(clock())
    storage.close()
