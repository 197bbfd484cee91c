"""A failing disk (full, read-only, I/O errors) surfaces as LogDirError and leaves the log consistent.

The error takes the log directory offline (every later call fails fast, see
test_log_dir_failures.py), so what the log left behind is checked in memory
and on disk, and by using the log after a restart, which brings the
directory back.
"""

from __future__ import annotations

import errno
import os

import attrs
import pytest
from josef.log import LogConfig, LogDirError


def failing(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


def snapshot(harness, log):
    """What the log holds, without reading through it (an offline log refuses reads)."""
    return (
        log.log_end_offset,
        log.size_bytes,
        harness.segment_file(0, ".log").read_bytes(),
    )


def offline_then_restarted(harness, log, config=None):
    """The directory went offline and the log fails fast; a restart (after a crash) brings it back."""
    assert harness.storage.offline_dirs() == [str(harness.root)]
    with pytest.raises(LogDirError, match="is offline"):
        log.read(0, 1 << 20, log.log_end_offset)
    harness.crash()
    return harness.reopen(config or LogConfig())


def test_a_full_disk_in_the_middle_of_a_write_leaves_the_log_as_it_was(harness, monkeypatch):
    log = harness.open(LogConfig())
    for _ in range(5):
        harness.append(log)
    before = snapshot(harness, log)
    real_pwrite = os.pwrite
    calls = []

    def half_then_full(fd, data, position):
        if calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        calls.append(position)
        return real_pwrite(fd, bytes(data)[: len(data) // 2], position)

    monkeypatch.setattr(os, "pwrite", half_then_full)
    with pytest.raises(LogDirError, match="ENOSPC"):
        harness.append(log)
    monkeypatch.undo()

    assert snapshot(harness, log) == before  # the partial write was cut off the file too
    log = offline_then_restarted(harness, log)
    assert harness.append(log).first_offset == 5
    assert harness.batches(log.read(0, 1 << 20, 6))[-1] == (5, 5)


def test_a_read_only_disk_that_cannot_even_truncate_still_leaves_a_consistent_log(
    harness, monkeypatch
):
    log = harness.open(LogConfig())
    for _ in range(5):
        harness.append(log)
    end, size = log.log_end_offset, log.size_bytes
    data = log.read(0, 1 << 30, end)
    real_pwrite = os.pwrite
    monkeypatch.setattr(
        os,
        "pwrite",
        lambda fd, d, p: real_pwrite(fd, bytes(d)[:10], p) if p == size else failing(errno.EROFS)(),
    )
    monkeypatch.setattr(os, "ftruncate", failing(errno.EROFS))
    with pytest.raises(LogDirError, match="EROFS"):
        harness.append(log)
    monkeypatch.undo()

    assert (log.log_end_offset, log.size_bytes) == (end, size)
    log = offline_then_restarted(harness, log)  # recovery cuts the 10 stray bytes
    assert (log.log_end_offset, log.size_bytes, log.read(0, 1 << 30, end)) == (end, size, data)
    harness.append(log)
    harness.crash()
    log = harness.reopen(LogConfig())
    assert log.log_end_offset == end + 1
    assert harness.batches(log.read(0, 1 << 20, end + 1))[-1] == (end, end)


def test_a_failed_index_write_undoes_the_log_write(harness, monkeypatch):
    log = harness.open(LogConfig(index_interval_bytes=0))
    for _ in range(3):
        harness.append(log)
    before = snapshot(harness, log)
    real_pwrite = os.pwrite
    log_fd_writes = []

    def log_ok_index_fails(fd, data, position):
        if not log_fd_writes:
            log_fd_writes.append(fd)
            return real_pwrite(fd, data, position)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "pwrite", log_ok_index_fails)
    with pytest.raises(LogDirError, match="EIO"):
        harness.append(log)
    monkeypatch.undo()

    assert snapshot(harness, log) == before
    log = offline_then_restarted(harness, log, LogConfig(index_interval_bytes=0))
    harness.append(log)
    log = harness.restart(LogConfig(index_interval_bytes=0))
    assert [harness.batches(log.read(o, 1 << 20, 4))[0] for o in range(4)] == [
        (o, o) for o in range(4)
    ]


def test_a_failed_roll_leaves_the_log_appendable(harness, monkeypatch):
    log = harness.open(LogConfig(segment_bytes=300))
    for _ in range(3):
        harness.append(log)
    monkeypatch.setattr(os, "open", failing(errno.ENOSPC))
    with pytest.raises(LogDirError, match="ENOSPC"):
        harness.append(log)  # does not fit: needs a new segment
    monkeypatch.undo()
    assert (log.log_end_offset, log.segment_base_offsets) == (3, [0])
    log = offline_then_restarted(harness, log, LogConfig(segment_bytes=300))
    harness.append(log)
    assert log.segment_base_offsets == [0, 3]
    assert harness.batches(log.read(3, 1 << 20, 4)) == [(3, 3)]


def test_a_failed_flush_keeps_the_recovery_point(harness, monkeypatch):
    log = harness.open()
    harness.append(log)
    monkeypatch.setattr(os, "fsync", failing(errno.EIO))
    with pytest.raises(LogDirError, match="EIO"):
        log.flush()
    monkeypatch.undo()
    assert log.recovery_point == 0
    log = offline_then_restarted(harness, log, harness.config)
    log.flush()
    assert log.recovery_point == 1


def test_a_failed_read_raises_log_dir_error(harness, monkeypatch):
    log = harness.open()
    harness.append(log)
    monkeypatch.setattr(os, "pread", failing(errno.EIO))
    with pytest.raises(LogDirError, match="EIO"):
        log.read(0, 1 << 20, 1)
    monkeypatch.undo()
    assert harness.batches(offline_then_restarted(harness, log, harness.config).read(0, 1 << 20, 1)) == [(0, 0)]


def test_a_failed_segment_deletion_raises_log_dir_error(harness, monkeypatch):
    log = harness.open(attrs.evolve(harness.config, retention_bytes=0))
    for _ in range(30):
        harness.append(log)
    monkeypatch.setattr(os, "rename", failing(errno.EROFS))
    with pytest.raises(LogDirError, match="EROFS"):
        log.apply_retention(harness.clock())
    monkeypatch.undo()
    log = offline_then_restarted(harness, log, attrs.evolve(harness.config, retention_bytes=0))
    start = log.log_start_offset
    assert harness.batches(log.read(start, 1 << 20, log.log_end_offset))[0] == (start, start)
    assert harness.append(log).first_offset == 30
