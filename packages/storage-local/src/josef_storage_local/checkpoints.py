"""Kafka's text checkpoint files: version ``0``, an entry count, then one entry per line.

Used for ``leader-epoch-checkpoint`` (``epoch startOffset``) in each
partition directory and for ``recovery-point-offset-checkpoint`` and
``log-start-offset-checkpoint`` (``topic partition offset``) in each log
directory, so that Kafka's tools and a Kafka broker read the same files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from josef.log import EpochEntry
from josef.protocol.topic_partition import TopicPartition
from josef.segment_files import decode_epoch_checkpoint, encode_epoch_checkpoint
from josef_storage_local.files import write_atomically

VERSION = 0


def _read(path: Path, fields: int) -> list[list[str]]:
    """The entry lines of a checkpoint file, split into ``fields`` words; ValueError when malformed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) < 2 or lines[0].strip() != str(VERSION):
        raise ValueError(f"{path}: not a version {VERSION} checkpoint file")
    entries = [line.split() for line in lines[2:] if line.strip()]
    if int(lines[1]) != len(entries) or any(len(entry) != fields for entry in entries):
        raise ValueError(f"{path}: expected {lines[1].strip()} entries of {fields} fields")
    return entries


def _write(path: Path, entries: Sequence[Iterable[object]]) -> None:
    lines = [str(VERSION), str(len(entries))] + [" ".join(map(str, entry)) for entry in entries]
    write_atomically(path, "\n".join(lines) + "\n")


def read_offsets(path: Path) -> dict[TopicPartition, int]:
    """A ``topic partition offset`` checkpoint; empty when the file does not exist."""
    if not path.exists():
        return {}
    return {
        TopicPartition(topic, int(partition)): int(offset)
        for topic, partition, offset in _read(path, 3)
    }


def write_offsets(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    _write(path, [(tp.topic, tp.partition, offset) for tp, offset in sorted(offsets.items())])


def read_epochs(path: Path) -> list[EpochEntry]:
    """A leader-epoch checkpoint; empty when the file does not exist."""
    if not path.exists():
        return []
    try:
        return decode_epoch_checkpoint(path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_epochs(path: Path, entries: Sequence[EpochEntry]) -> None:
    write_atomically(path, encode_epoch_checkpoint(entries).decode())
