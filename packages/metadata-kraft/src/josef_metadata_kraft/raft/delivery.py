"""What the owner's state machine learns from the node, in order: leader changes, snapshots to load, committed batches.

The high watermark lives here, not with replication alone, because two
parts learn it: replication (from a majority of fetches as leader, from
the leader's answers as follower) and a snapshot download (everything
below the snapshot's end is committed). Delivery reads the log up to it.
"""

from __future__ import annotations

import attrs

from josef.protocol.records import iter_batches

from .errors import RaftInvariantError
from .log import OffsetAndEpoch, RaftLog


@attrs.frozen
class CommittedBatch:
    """One committed batch of the log, in offset order; ``data`` is the batch as stored (magic v2)."""

    base_offset: int
    last_offset: int
    epoch: int
    is_control: bool
    data: bytes


@attrs.frozen
class SnapshotLoaded:
    """Replace the state machine by this snapshot (header, data batches, footer); commits continue after it."""

    snapshot_id: OffsetAndEpoch
    data: bytes


@attrs.frozen
class LeaderChanged:
    """The known leader (``None`` during an election) of ``epoch``.

    The node announces its own leadership only once every batch before its
    epoch's start has been delivered, as Kafka's listeners see it.
    """

    leader_id: int | None
    epoch: int


RaftEvent = CommittedBatch | SnapshotLoaded | LeaderChanged


class Delivery:
    """The high watermark, and how far below it the state machine has been told."""

    def __init__(self, node_id: int, log: RaftLog) -> None:
        self._node_id = node_id
        self._log = log
        self.high_watermark: int | None = None
        self._next: int | None = None
        self._announced: tuple[int | None, int] | None = None

    def advance(self, high_watermark: int) -> None:
        """More is known committed; the high watermark never decreases while the process lives."""
        if self.high_watermark is None or high_watermark > self.high_watermark:
            self.high_watermark = high_watermark

    def drain(self, max_bytes: int, leader_id: int | None, epoch: int,
              epoch_start_offset: int | None) -> list[RaftEvent]:
        """The events not yet delivered; ``epoch_start_offset`` is this node's own epoch's, while it leads."""
        events: list[RaftEvent] = []
        current = (leader_id, epoch)
        own = leader_id == self._node_id
        if not own and current != self._announced:
            events.append(LeaderChanged(*current))
            self._announced = current
        hw = self.high_watermark
        if hw is not None:
            self._deliver(hw, max_bytes, events)
        if own and epoch_start_offset is not None and current != self._announced:
            if self._next is not None and self._next >= epoch_start_offset:
                events.append(LeaderChanged(*current))
                self._announced = current
        return events

    def _deliver(self, hw: int, max_bytes: int, events: list[RaftEvent]) -> None:
        log = self._log
        nxt = self._next
        start = log.start_offset
        if nxt is None or nxt < start:
            snapshot = log.latest_snapshot_id()
            if snapshot is not None and snapshot.offset > 0 and (nxt is None or nxt < snapshot.offset):
                size = log.snapshot_size(snapshot) or 0
                events.append(SnapshotLoaded(snapshot, log.read_snapshot(snapshot, 0, size) or b""))
                nxt = snapshot.offset
            elif nxt is None:
                nxt = start
            if nxt < start:
                raise RaftInvariantError(f"next offset {nxt} to deliver is below the log start {start}")
        delivered = 0
        while nxt < hw and delivered < max_bytes:
            chunk = log.read(nxt, max_bytes)
            progressed = False
            for pos, header in iter_batches(chunk):
                if header.last_offset < nxt:
                    continue
                if header.last_offset >= hw:
                    break
                events.append(CommittedBatch(header.base_offset, header.last_offset, header.partition_leader_epoch,
                                             header.is_control, bytes(chunk[pos:pos + header.size])))
                nxt = header.last_offset + 1
                delivered += header.size
                progressed = True
            if not progressed:
                break
        self._next = nxt
