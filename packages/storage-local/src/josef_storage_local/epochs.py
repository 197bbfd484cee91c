"""The leader-epoch cache of one partition (Kafka's LeaderEpochFileCache).

It maps each leader epoch to the first offset written under it. Followers
ask the leader for the end offset of their latest epoch
(OffsetsForLeaderEpoch) and truncate to it, which is how diverging logs are
reconciled after a leader change; so the cache must survive restarts and
follow every truncation of the log.
"""

from __future__ import annotations

from pathlib import Path

from josef.log import EpochEntry, end_offset_for_epoch

from josef_storage_local.checkpoints import read_epochs, write_epochs

FILE_NAME = "leader-epoch-checkpoint"


class LeaderEpochCache:
    """Epoch entries, oldest first, with strictly increasing epochs and start offsets.

    Mutations change memory only; :meth:`checkpoint` writes the file when
    something changed, so a recovery that learns many epochs writes once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries = read_epochs(path)
        self._written = list(self._entries)

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else -1

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``; ignored unless newer than the latest epoch.

        Entries starting at or after ``start_offset`` are dropped first (as
        Kafka does), so start offsets stay increasing.
        """
        if epoch < 0 or start_offset < 0 or epoch <= self.latest_epoch:
            return
        self._entries = [e for e in self._entries if e.start_offset < start_offset]
        self._entries.append(EpochEntry(epoch, start_offset))

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's ``endOffsetFor`` (:func:`josef.log.end_offset_for_epoch`) over this cache."""
        return end_offset_for_epoch(self._entries, epoch, log_end_offset)

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs starting at or after ``end_offset`` (the log was truncated there)."""
        self._entries = [e for e in self._entries if e.start_offset < end_offset]

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs that ended before ``start_offset``; the one holding it now starts there."""
        keep = [e for e in self._entries if e.start_offset > start_offset]
        older = [e for e in self._entries if e.start_offset <= start_offset]
        if older:
            keep.insert(0, EpochEntry(older[-1].epoch, start_offset))
        self._entries = keep

    def clear(self) -> None:
        self._entries = []

    def checkpoint(self) -> None:
        """Write the checkpoint file (atomically) if the entries changed since it was last written."""
        if self._entries != self._written:
            write_epochs(self.path, self._entries)
            self._written = list(self._entries)
