"""The contract between the Raft core and the ``__cluster_metadata`` log it replicates.

:class:`RaftLog` is what :class:`~josef_metadata_kraft.raft.node.RaftNode` needs
from storage, modelled on Kafka's ``ReplicatedLog``/``KafkaMetadataLog``: whole
record batches (magic v2, as on the wire), a leader-epoch cache answering
``end_offset_for_epoch``, truncation, an explicit ``flush`` that decides what
survives a crash, and snapshots named by ``(end offset, epoch)``.

The Raft rules that depend on the log (divergence, snapshot redirection) live
here as plain functions over those primitives, so every implementation of the
contract answers exactly as Kafka's does and an adapter only stores bytes.
"""

from __future__ import annotations

import bisect
from typing import Protocol, Sequence

import attrs

#: Kafka's UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET.
NO_EPOCH = -1
NO_OFFSET = -1


@attrs.frozen
class OffsetAndEpoch:
    """An offset and the epoch it belongs to (Kafka's ``OffsetAndEpoch``).

    Used for log end positions (``(end offset, last epoch)``), diverging
    points and snapshot ids (``(end offset, epoch of the record before it)``).
    Logs are compared by epoch first, then offset: :meth:`at_least` is
    Kafka's ``compareTo(...) >= 0``.
    """

    offset: int
    epoch: int

    def at_least(self, other: OffsetAndEpoch) -> bool:
        return (self.epoch, self.offset) >= (other.epoch, other.offset)


@attrs.frozen
class AppendResult:
    """Offsets of what an append wrote (inclusive)."""

    first_offset: int
    last_offset: int


class RaftLogError(Exception):
    """The log refused an operation: a batch that does not continue the log, a bad CRC, a bad snapshot."""


class RaftLog(Protocol):
    """Storage of the replicated log, as the Raft core uses it.

    Offsets are Kafka offsets; every append is of whole batches whose
    ``partitionLeaderEpoch`` is their epoch. Reads and truncation happen at
    batch boundaries (the core only ever asks for them). Writes are volatile
    until :meth:`flush`; after a crash the log holds exactly what was flushed
    (snapshots created or installed are durable when the call returns).
    """

    @property
    def start_offset(self) -> int:
        """First offset held in the log; equals the earliest snapshot's end offset once the prefix is trimmed."""

    @property
    def end_offset(self) -> int:
        """Next offset to be written (LEO)."""

    @property
    def last_fetched_epoch(self) -> int:
        """Epoch of the last batch; the latest snapshot's epoch when the log is empty; 0 when there is neither."""

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """Kafka's ``KafkaMetadataLog.endOffsetForEpoch``: see :func:`end_offset_for_epoch`."""

    def append_as_leader(self, batch: bytes, epoch: int) -> AppendResult:
        """Append one batch the leader built: base offset = :attr:`end_offset`, leader epoch = ``epoch``.

        The first batch of a new epoch starts that epoch in the epoch cache.
        """

    def append_as_follower(self, batches: bytes, epoch: int) -> AppendResult:
        """Append whole batches fetched from the leader of ``epoch``.

        Validates before writing anything: CRC, magic, the first base offset
        equals :attr:`end_offset`, offsets are contiguous, batch epochs never
        go down and never exceed ``epoch``. Raises :class:`RaftLogError`.
        """

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``; at least one batch even if larger than ``max_bytes``.

        Empty at the log end. ``offset`` below :attr:`start_offset` is an error.
        """

    def truncate_to(self, offset: int) -> None:
        """Drop every batch at or after ``offset`` and the epoch-cache entries that start there."""

    def flush(self) -> None:
        """Make everything appended (and truncated) so far durable."""

    def latest_snapshot_id(self) -> OffsetAndEpoch | None:
        """The newest snapshot, if any."""

    def earliest_snapshot_id(self) -> OffsetAndEpoch | None:
        """The oldest snapshot kept, if any (Kafka keeps none older than the log start)."""

    def snapshot_size(self, snapshot_id: OffsetAndEpoch) -> int | None:
        """Size in bytes of a snapshot, ``None`` if there is no such snapshot."""

    def read_snapshot(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> bytes | None:
        """Up to ``max_bytes`` of a snapshot from byte ``position``; ``None`` if there is no such snapshot."""

    def create_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """Store a snapshot (batches, as in ``<end offset>-<epoch>.checkpoint``) of the log below its end offset."""

    def delete_before_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        """Trim the log prefix: start offset becomes the snapshot's end offset, older snapshots go."""

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """Store a snapshot downloaded from the leader and replace the whole log by it.

        Afterwards the log is empty and starts (and ends) at the snapshot's
        end offset, with the snapshot's epoch as :attr:`last_fetched_epoch`.
        """


def epoch_cache_end_offset(entries: Sequence[tuple[int, int]], epoch: int,
                           log_end_offset: int) -> OffsetAndEpoch | None:
    """Kafka's ``LeaderEpochFileCache.endOffsetFor``: ``(largest epoch <= epoch, its end offset)``.

    ``entries`` are ``(epoch, start offset)`` pairs, oldest first. ``None``
    is Kafka's ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)``.
    """
    if epoch == NO_EPOCH:
        return None
    if entries and entries[-1][0] == epoch:
        return OffsetAndEpoch(log_end_offset, epoch)
    epochs = [e for e, _ in entries]
    higher = bisect.bisect_right(epochs, epoch)
    if higher == len(entries):
        return None  # larger than any known epoch
    if higher == 0:
        # Smaller than any known epoch: the start of the first known one.
        return OffsetAndEpoch(entries[0][1], epoch)
    return OffsetAndEpoch(entries[higher][1], entries[higher - 1][0])


def end_offset_for_epoch(
    found: OffsetAndEpoch | None,
    earliest_snapshot: OffsetAndEpoch | None,
    log_end_offset: int,
    last_fetched_epoch: int,
) -> OffsetAndEpoch:
    """Kafka's ``KafkaMetadataLog.endOffsetForEpoch`` given the epoch cache's answer ``found``.

    When the cache answers with the earliest snapshot's offset but an older
    epoch, its entries before the snapshot were trimmed, so the snapshot id is
    the truthful answer; an unknown epoch answers with the log end.
    """
    if (found is not None and earliest_snapshot is not None and found.offset == earliest_snapshot.offset
            and found.epoch < earliest_snapshot.epoch):
        return earliest_snapshot
    if found is not None:
        return found
    return OffsetAndEpoch(log_end_offset, last_fetched_epoch)


@attrs.frozen
class FetchPosition:
    """Kafka's ``ValidOffsetAndEpoch``: how a leader answers a fetch at ``(offset, epoch)``.

    ``kind`` is ``"valid"`` (send records from the offset), ``"diverging"``
    (``position`` is where the follower must truncate to) or ``"snapshot"``
    (``position`` is the snapshot id to download).
    """

    kind: str
    position: OffsetAndEpoch

    VALID = "valid"
    DIVERGING = "diverging"
    SNAPSHOT = "snapshot"


def validate_offset_and_epoch(log: RaftLog, offset: int, epoch: int) -> FetchPosition:
    """Kafka's ``ReplicatedLog.validateOffsetAndEpoch``, preceded by the leader's empty-follower shortcut.

    A follower whose ``(last fetched epoch, fetch offset)`` is not on this
    log is told the largest ``(epoch, end offset)`` both can agree on; one
    below the log start (or whose epoch the trimmed prefix cannot vouch for)
    is sent to the latest snapshot.
    """
    latest = log.latest_snapshot_id()
    if offset == 0 and latest is not None and latest.offset > 0:
        # An empty follower is better served by the snapshot than by the log
        # (Kafka excludes the bootstrap snapshot, id (0, 0)).
        return FetchPosition(FetchPosition.SNAPSHOT, latest)
    start = log.start_offset
    if start == 0 and offset == 0:
        return FetchPosition(FetchPosition.VALID, OffsetAndEpoch(0, 0))
    earliest = log.earliest_snapshot_id()
    if earliest is not None and (offset < start or (offset == start and epoch != earliest.epoch)
                                 or epoch < earliest.epoch):
        assert latest is not None
        return FetchPosition(FetchPosition.SNAPSHOT, latest)
    end = log.end_offset_for_epoch(epoch)
    if end.epoch != epoch or end.offset < offset:
        return FetchPosition(FetchPosition.DIVERGING, end)
    return FetchPosition(FetchPosition.VALID, OffsetAndEpoch(offset, epoch))


def truncation_offset(log: RaftLog, diverging: OffsetAndEpoch) -> int:
    """Kafka's ``ReplicatedLog.truncateToEndOffset`` without the truncation: where a follower cuts its log.

    The leader said its log agrees with ours up to ``diverging.offset`` in
    ``diverging.epoch``. If we have that epoch we keep the shorter of the two
    ends; if not, we keep what precedes the first epoch we have above it.
    """
    if diverging.epoch == 0:
        return min(diverging.offset, log.end_offset)
    local = log.end_offset_for_epoch(diverging.epoch)
    if local.epoch == diverging.epoch:
        return min(local.offset, diverging.offset)
    return local.offset
