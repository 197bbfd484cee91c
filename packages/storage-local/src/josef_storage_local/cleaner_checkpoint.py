"""Kafka's ``cleaner-offset-checkpoint``: per log directory, where each compacted log's dirty section starts.

Read and rewritten by cleaning passes, which are rare and may run in
several threads on logs of one directory: each update rereads the file
under a lock of that directory, so nothing is cached that a restart (or
another storage on the same directory) could make stale.
"""

from __future__ import annotations

import threading
from pathlib import Path

from josef.protocol.topic_partition import TopicPartition
from josef_storage_local.checkpoints import read_offsets, write_offsets

FILE_NAME = "cleaner-offset-checkpoint"
_locks: dict[Path, threading.Lock] = {}
_locks_lock = threading.Lock()


def _lock(log_dir: Path) -> threading.Lock:
    with _locks_lock:
        return _locks.setdefault(log_dir, threading.Lock())


def first_dirty_offset(log_dir: Path, tp: TopicPartition) -> int:
    """Where ``tp``'s last cleaning stopped; -1 when it was never cleaned (or the file is unreadable)."""
    with _lock(log_dir):
        try:
            return read_offsets(log_dir / FILE_NAME).get(tp, -1)
        except (OSError, ValueError):
            return -1


def update(log_dir: Path, tp: TopicPartition, offset: int | None) -> None:
    """Record where ``tp``'s dirty section starts now; None forgets ``tp`` (its log is deleted)."""
    path = log_dir / FILE_NAME
    with _lock(log_dir):
        try:
            offsets = read_offsets(path)
        except ValueError:
            offsets = {}
        if offset is None:
            if tp not in offsets:
                return
            del offsets[tp]
        else:
            offsets[tp] = offset
        write_offsets(path, offsets)
