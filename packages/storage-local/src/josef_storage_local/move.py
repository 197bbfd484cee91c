"""Moving a partition's log to another log directory, and settling a move a crash interrupted.

The log is copied into ``<target>/<topic>-<partition>.<uuid>-future`` (Kafka
calls the replica being moved the future replica) in two passes: first while
the log keeps taking appends, then, with the log closed under its lock, only
what changed since (the active segment, checkpoints, snapshots), so appends
wait for a short catch-up rather than for the whole copy. The move commits
when the old directory is renamed to ``-delete``; only then does the future
directory take the partition's name.

Crash safety: until the commit the old directory is live and a leftover
future directory is removed at the next start; after it, the future
directory is complete and fsynced, and is renamed into place if the crash
came before that. Either way exactly one copy remains.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from josef.protocol.topic_partition import TopicPartition
from josef_storage_local.files import fsync_dir
from josef_storage_local.segment import SUFFIXES

FUTURE_SUFFIX = "-future"

#: What identifies a file's content cheaply: inode (replaced files), size (appends), mtime.
Stamp = tuple[int, int, int]


def _stamp(path: Path) -> Stamp:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _is_sealed_segment_file(name: str, active_base: int | None) -> bool:
    """Whether ``name`` belongs to a segment below the active one, which no append changes."""
    stem, dot, suffix = name.partition(".")
    return (
        active_base is not None and bool(dot) and "." + suffix in SUFFIXES
        and stem.isdigit() and int(stem) < active_base
    )


def sync(source: Path, future: Path, copied: dict[str, Stamp], active_base: int | None) -> dict[str, Stamp]:
    """Make ``future`` hold the files of ``source``; returns the stamp each copied file had before its copy.

    Files of sealed segments whose stamp still matches ``copied`` are
    skipped; every other file is copied again, since appends may have
    changed it without changing its stamp (timestamps are coarse). With
    ``active_base`` None (the first pass) every file is copied. Files that
    vanish meanwhile (retention) are skipped, and files gone from
    ``source`` are removed from ``future``.
    """
    future.mkdir(exist_ok=True)
    done: dict[str, Stamp] = {}
    for path in source.iterdir():
        try:
            stamp = _stamp(path)
            if copied.get(path.name) == stamp and _is_sealed_segment_file(path.name, active_base):
                done[path.name] = stamp
                continue
            shutil.copyfile(path, future / path.name)
        except FileNotFoundError:
            continue
        done[path.name] = stamp
    for path in future.iterdir():
        if path.name not in done:
            path.unlink()
    return done


def fsync_tree(path: Path) -> None:
    """fsync every file of a flat directory, then the directory: the copy must be durable before it commits."""
    for file in path.iterdir():
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(path)


def finish_interrupted_moves(paths: list[Path]) -> set[TopicPartition]:
    """At start-up, before the log directories load: settle every leftover future directory; returns their partitions.

    A future directory whose partition is live in some log directory never
    committed and is removed; one without a live partition is the committed
    copy (the old one was already renamed for deletion) and takes its name.
    """
    futures = [
        entry for path in paths if path.is_dir()
        for entry in path.iterdir() if entry.name.endswith(FUTURE_SUFFIX) and entry.is_dir()
    ]
    settled = set()
    for future in futures:
        tp = TopicPartition.parse(future.name.rsplit(".", 1)[0])
        if any((path / str(tp)).is_dir() for path in paths):
            shutil.rmtree(future)
        else:
            os.rename(future, future.with_name(str(tp)))
            fsync_dir(future.parent)
        settled.add(tp)
    return settled
