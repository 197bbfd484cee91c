"""KRaft's Raft core, sans IO: elections, replication by fetch, snapshots, the quorum-state file.

:class:`RaftNode` is the state machine (Kafka's KafkaRaftClient without its
threads and sockets), :class:`RaftLog` the storage contract it replicates,
:class:`FileQuorumStateStore` the ``quorum-state`` file. A network driver
moves the kio messages it emits; a metadata state machine appends to it and
applies what :meth:`RaftNode.drain_events` delivers.
"""

from .config import RaftConfig
from .delivery import CommittedBatch, LeaderChanged, RaftEvent, SnapshotLoaded
from .election import Role
from .errors import NotLeaderError, RaftInvariantError
from .log import (
    AppendResult,
    OffsetAndEpoch,
    RaftLog,
    RaftLogError,
    end_offset_for_epoch,
    epoch_cache_end_offset,
)
from .messages import METADATA_PARTITION, METADATA_TOPIC, METADATA_TOPIC_ID
from .node import RaftNode
from .outbox import Outbound
from .quorum_state import ElectionState, FileQuorumStateStore, QuorumStateError, QuorumStateStore

__all__ = [
    "AppendResult",
    "CommittedBatch",
    "ElectionState",
    "FileQuorumStateStore",
    "LeaderChanged",
    "METADATA_PARTITION",
    "METADATA_TOPIC",
    "METADATA_TOPIC_ID",
    "NotLeaderError",
    "OffsetAndEpoch",
    "Outbound",
    "QuorumStateError",
    "QuorumStateStore",
    "RaftConfig",
    "RaftEvent",
    "RaftInvariantError",
    "RaftLog",
    "RaftLogError",
    "RaftNode",
    "Role",
    "SnapshotLoaded",
    "end_offset_for_epoch",
    "epoch_cache_end_offset",
]
