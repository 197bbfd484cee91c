"""The KRaft quorum as DescribeQuorum describes it, with each node's lag behind the leader.

``josef cluster status`` and the console show the same figures as
``kafka-metadata-quorum.sh describe --replication``: a node's lag is the
leader's log end offset less its own, and its lag time how long it has not
been caught up, on the leader's clock (Kafka's MaxFollowerLagTimeMs).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class QuorumNode:
    """A voter or observer of the metadata log, as the quorum leader sees it."""

    node_id: int
    role: str  # Leader, Follower or Observer
    log_end_offset: int
    #: Records behind the leader's log end (None: unknown: no leader, or it has not fetched from this one).
    lag: int | None
    #: How long it has not been caught up, by the leader's clock (None: not since the leader's election).
    lag_time_ms: int | None


@attrs.frozen
class Quorum:
    leader_id: int
    epoch: int
    high_watermark: int
    nodes: tuple[QuorumNode, ...]

    @property
    def voters(self) -> tuple[QuorumNode, ...]:
        return tuple(n for n in self.nodes if n.role != "Observer")


def quorum_of(partition: Any) -> Quorum:
    """The quorum from the ``__cluster_metadata-0`` entry of a DescribeQuorum response (any version)."""
    leader_id = int(partition.leader_id)
    voters, observers = list(partition.current_voters), list(partition.observers)
    leader = next((v for v in voters if v.replica_id == leader_id), None)

    def node(replica: Any, role: str) -> QuorumNode:
        end = int(replica.log_end_offset)
        if leader is None:
            return QuorumNode(int(replica.replica_id), role, end, None, None)
        lag_time = None
        leader_caught_up = int(getattr(leader, "last_caught_up_timestamp", -1))
        caught_up = int(getattr(replica, "last_caught_up_timestamp", -1))
        if leader_caught_up >= 0 and caught_up >= 0:
            lag_time = max(0, leader_caught_up - caught_up)
        # -1: it has not fetched from this leader
        return QuorumNode(int(replica.replica_id), role, end, int(leader.log_end_offset) - end if end >= 0 else None,
                          lag_time)

    return Quorum(leader_id, int(partition.leader_epoch), int(partition.high_watermark),
                  tuple([node(v, "Leader" if v.replica_id == leader_id else "Follower") for v in voters]
                        + [node(o, "Observer") for o in observers]))
