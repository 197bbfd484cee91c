"""Snapshots of the replicated state: creating them, serving them (FetchSnapshot) and downloading one.

A follower whose next fetch offset the leader no longer has (the leader
trimmed its log below a snapshot) is answered with the snapshot's id; it
downloads the snapshot with FetchSnapshot, installs it in place of its log
and learns the voter set it holds. The state machine loads it through
:class:`~josef_metadata_kraft.raft.delivery.SnapshotLoaded`.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.records import iter_batches

from . import messages as m
from .config import RaftConfig
from .delivery import Delivery
from .election import Election, Role
from .log import OffsetAndEpoch, RaftLog
from .membership import Membership
from .messages import NONE
from .voters import voters_control


@attrs.define
class _Download:
    snapshot_id: OffsetAndEpoch
    data: bytearray = attrs.field(factory=bytearray)


class Snapshots:
    """Snapshot creation on any node, FetchSnapshot on the leader, and a follower's download in progress."""

    def __init__(self, node_id: int, config: RaftConfig, log: RaftLog, membership: Membership,
                 election: Election, delivery: Delivery) -> None:
        self._node_id = node_id
        self._config = config
        self._log = log
        self._membership = membership
        self._election = election
        self._delivery = delivery
        #: The snapshot a follower is downloading; it fetches the log again once that is installed.
        self._download: _Download | None = None

    def stand_down(self) -> None:
        """A download belongs to the leader that offered it: a new role starts with a Fetch."""
        self._download = None

    # ---------------------------------------------------------------- creation

    def create(self, end_offset: int, payloads: Sequence[bytes], now: int, *, trim: bool) -> OffsetAndEpoch:
        """Store a snapshot of the state below ``end_offset`` (committed); ``trim`` drops the log it replaces."""
        snapshot_id, control = self.plan(end_offset)
        if self._log.snapshot_size(snapshot_id) is None:
            self._log.create_snapshot(snapshot_id, m.snapshot_bytes(snapshot_id, payloads, now, control=control))
        if trim:
            self._log.delete_before_snapshot(snapshot_id)
        return snapshot_id

    def plan(self, end_offset: int) -> tuple[OffsetAndEpoch, Sequence[tuple[int, bytes]]]:
        """The id of a snapshot ending at ``end_offset`` (committed), and the control records it starts with."""
        hw = self._delivery.high_watermark
        if hw is None or end_offset > hw or end_offset <= 0:
            raise ValueError(f"offset {end_offset} is not committed (high watermark {hw})")
        if end_offset < self._log.start_offset:
            raise ValueError(f"offset {end_offset} is below the log start {self._log.start_offset}")
        snapshot_id = OffsetAndEpoch(end_offset, self._epoch_before(end_offset))
        history = self._membership.history
        control = voters_control(history.at(end_offset - 1), with_version=True) if history.dynamic else ()
        return snapshot_id, control

    def _epoch_before(self, offset: int) -> int:
        """Epoch of the record at ``offset - 1`` (the id of a snapshot ending at ``offset``)."""
        start = self._log.start_offset
        if offset == start:
            snapshot = self._log.earliest_snapshot_id()
            return snapshot.epoch if snapshot is not None and snapshot.offset == start else 0
        data = self._log.read(offset - 1, 1)
        for _, header in iter_batches(data):
            if header.last_offset != offset - 1:
                raise ValueError(f"offset {offset} is inside a batch: snapshots end at batch boundaries")
            return header.partition_leader_epoch
        raise ValueError(f"offset {offset} is beyond the log end")

    # ---------------------------------------------------------------- FetchSnapshot (leader side)

    def on_fetch_snapshot_request(self, source: int, request: Any, now: int) -> Any:
        if not self._election.cluster_ok(request.cluster_id):
            return m.fetch_snapshot_response(ErrorCode.inconsistent_cluster_id)
        if len(request.topics) != 1 or len(request.topics[0].partitions) != 1:
            return m.fetch_snapshot_response(ErrorCode.invalid_request)
        ps = m.single_partition(request.topics, "name", index_field="partition")
        if ps is None:
            return m.fetch_snapshot_response(NONE, partition_error=ErrorCode.unknown_topic_or_partition)
        election = self._election
        leader = dict(leader_id=election.leader_or_minus_one(), epoch=election.epoch, endpoints=self._membership.voters)
        error = election.validate_leader_only(ps.current_leader_epoch)
        if error is not None:
            return m.fetch_snapshot_response(NONE, partition_error=error, **leader)  # type: ignore[arg-type]
        snapshot_id = OffsetAndEpoch(ps.snapshot_id.end_offset, ps.snapshot_id.epoch)
        size = self._log.snapshot_size(snapshot_id) if snapshot_id != OffsetAndEpoch(0, 0) else None
        if size is None:
            return m.fetch_snapshot_response(NONE, partition_error=ErrorCode.snapshot_not_found,
                                             **leader)  # type: ignore[arg-type]
        if ps.position < 0 or ps.position >= size:
            return m.fetch_snapshot_response(NONE, partition_error=ErrorCode.position_out_of_range,
                                             **leader)  # type: ignore[arg-type]
        data = self._log.read_snapshot(snapshot_id, ps.position, min(request.max_bytes, size)) or b""
        election.heard_from_voter(request.replica_id, now)
        return m.fetch_snapshot_response(NONE, snapshot_id=snapshot_id, size=size, position=ps.position,
                                         data=data, **leader)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- download (follower side)

    @property
    def downloading(self) -> bool:
        return self._download is not None

    def start_download(self, snapshot_id: OffsetAndEpoch) -> None:
        """The leader answered a Fetch with this snapshot's id: fetch it before the log."""
        self._download = _Download(snapshot_id)

    def fetch_request(self) -> Any:
        download = self._download
        assert download is not None
        election = self._election
        return m.fetch_snapshot_request(cluster_id=election.cluster_id, replica_id=self._node_id, epoch=election.epoch,
                                        snapshot_id=download.snapshot_id, position=len(download.data),
                                        max_bytes=self._config.fetch_max_bytes)

    def on_fetch_snapshot_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        if response.error_code != NONE:
            return False
        p = m.single_partition(response.topics, "name", index_field="index")
        if p is None:
            return False
        election = self._election
        leader_id = p.current_leader.leader_id
        handled = election.common_response(p.error_code, leader_id if leader_id >= 0 else None,
                                           p.current_leader.leader_epoch)
        if handled is not None:
            return handled
        if election.role is not Role.FOLLOWER:
            return True
        if (p.error_code == ErrorCode.snapshot_not_found or p.snapshot_id.end_offset < 0
                or p.snapshot_id.epoch < 0):
            # The leader replaced the snapshot meanwhile: start over with a Fetch.
            self._download = None
            election.restart_fetch_timeout(now)
            return True
        if p.error_code != NONE:
            return False
        download = self._download
        snapshot_id = OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch)
        if download is None or download.snapshot_id != snapshot_id or p.position != len(download.data):
            return False
        download.data += p.unaligned_records
        if len(download.data) >= p.size:
            self._log.install_snapshot(snapshot_id, bytes(download.data))
            self._membership.load_snapshot(snapshot_id, bytes(download.data))
            self._download = None
            self._delivery.advance(snapshot_id.offset)
        election.heard_from_leader(now)
        return True
