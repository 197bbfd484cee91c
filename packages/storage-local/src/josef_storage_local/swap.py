"""Crash-safe replacement of a group of segments by their cleaned rewrite, as Kafka's ``replaceSegments`` and ``LogLoader`` do it.

The rewrite of the segments from base offset B is written as
``B.{index,timeindex,txnindex,log}.cleaned`` and fsynced. Then:

1. :func:`commit`: each ``.cleaned`` becomes ``.swap``, the ``.log`` last:
   ``B.log.swap`` existing is the commit point;
2. the old segments are deleted (their files become ``.deleted``);
3. :func:`finish`: each ``.swap`` loses its suffix, the ``.log`` last.

:func:`recover`, run when a log loads, finishes what a crash interrupted:
``.cleaned`` files and ``.swap`` files without a ``B.log.swap`` are an
uncommitted rewrite and go; a ``B.log.swap`` wins over every old segment
whose base offset lies in ``[B, end of the rewrite)`` (Kafka's rule), and
over the old files named like its own. Old segments of the group past the
end of the rewrite may survive a crash: they hold only records the rewrite
dropped, all superseded by later ones, so the log stays correct and the
next cleaning drops them again.
"""

from __future__ import annotations

import os
from pathlib import Path

from josef.protocol.records import HEADER, HEADER_SIZE, LOG_OVERHEAD

from josef_storage_local.compaction import CLEANED_FILES, CLEANED_SUFFIX
from josef_storage_local.files import fsync_dir
from josef_storage_local.segment import SUFFIXES, file_name

SWAP_SUFFIX = ".swap"


def _rename_all(dir: Path, base_offset: int, old_suffix: str, new_suffix: str) -> None:
    for suffix in CLEANED_FILES:
        source = dir / (file_name(base_offset, suffix) + old_suffix)
        if source.exists():
            os.rename(source, dir / (file_name(base_offset, suffix) + new_suffix))


def commit(dir: Path, base_offset: int) -> None:
    """Step 1: the rewrite becomes the log's, durably (``.cleaned`` to ``.swap``, the ``.log`` last)."""
    _rename_all(dir, base_offset, CLEANED_SUFFIX, SWAP_SUFFIX)
    fsync_dir(dir)


def finish(dir: Path, base_offset: int) -> None:
    """Step 3, once the old segments are deleted: the ``.swap`` files take the segment's names."""
    _rename_all(dir, base_offset, SWAP_SUFFIX, "")
    fsync_dir(dir)


def _end_offset(path: Path, base_offset: int) -> int:
    """The offset after the last whole batch of a ``.log`` file (its base offset when it has none)."""
    end = base_offset
    with open(path, "rb") as file:
        data = file.read()
    position = 0
    while position + HEADER_SIZE <= len(data):
        fields = HEADER.unpack_from(data, position)
        size = fields[1] + LOG_OVERHEAD
        if size < HEADER_SIZE or position + size > len(data):
            break
        end = fields[0] + fields[6] + 1
        position += size
    return end


def recover(dir: Path) -> None:
    """Finish or undo the swaps a crash interrupted in a log directory; a no-op when there are none."""
    names = [path.name for path in dir.iterdir()]
    if not any(name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) for name in names):
        return
    for name in names:
        if name.endswith(CLEANED_SUFFIX):
            (dir / name).unlink()
    committed = sorted(int(name.split(".", 1)[0]) for name in names if name.endswith(".log" + SWAP_SUFFIX))
    for name in names:  # .swap index files of a rewrite whose .log never became .swap: uncommitted
        if name.endswith(SWAP_SUFFIX) and not name.endswith(".log" + SWAP_SUFFIX):
            if int(name.split(".", 1)[0]) not in committed:
                (dir / name).unlink()
    for base in committed:
        end = max(_end_offset(dir / (file_name(base, ".log") + SWAP_SUFFIX), base), base + 1)
        for path in dir.iterdir():
            stem, _, suffix = path.name.partition(".")
            if not stem.isdigit() or "." + suffix not in SUFFIXES:
                continue
            old_base = int(stem)
            if old_base == base:
                # Every file of a rewrite is written, so a B.* file without its .swap is the rewrite's,
                # renamed by step 3; one beside its .swap is the old segment's.
                if (dir / (path.name + SWAP_SUFFIX)).exists():
                    path.unlink()
            elif base < old_base < end:
                path.unlink()
        finish(dir, base)
