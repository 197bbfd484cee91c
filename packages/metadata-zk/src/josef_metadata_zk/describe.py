"""DescribeQuorum on ZooKeeper: what ``josef metadata-quorum describe`` (``kafka-metadata-quorum.sh``) shows here.

ZooKeeper replicates the log, so Kafka's picture of a Raft quorum maps onto
this backend as: the leader is the active controller, its controller epoch
(``/controller_epoch``) the leader epoch, the end of the metadata log the
high watermark. The one voter is the active controller: any node with the
controller role may be elected next, and ZooKeeper names none in advance.
The observers are the registered brokers, which read the log from ZooKeeper,
so the controller knows no position of theirs (-1, as Kafka shows an
unknown one). Session ids are ``josef zookeeper-shell SERVER stat
/controller``'s ``ephemeralOwner``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.image import BrokerImage
from josef.metadata.records import Endpoint

METADATA_TOPIC = "__cluster_metadata"


def _replica(node_id: int, log_end_offset: int) -> dict[str, Any]:
    return {"replica_id": node_id, "replica_directory_id": None, "log_end_offset": log_end_offset,
            "last_fetch_timestamp": -1, "last_caught_up_timestamp": -1}


def describe_quorum(request: Any, *, node_id: int, controller_id: int, controller_epoch: int, high_watermark: int,
                    brokers: Mapping[int, BrokerImage], endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """The DescribeQuorum answer of node ``node_id``, the active controller when ``controller_id`` is it (else every
    partition answers NOT_LEADER_OR_FOLLOWER naming the controller, as a KRaft follower answers)."""
    topics = []
    for topic in request.topics:
        partitions = []
        for partition in topic.partitions:
            index = partition.partition_index
            if topic.topic_name != METADATA_TOPIC or index != 0:
                error = ErrorCode.unknown_topic_or_partition
            elif controller_id != node_id:
                error = ErrorCode.not_leader_or_follower
            else:
                error = ErrorCode.none
            answer: dict[str, Any] = {"partition_index": index, "error_code": error, "error_message": None,
                                      "leader_id": controller_id,
                                      "leader_epoch": controller_epoch, "high_watermark": -1, "current_voters": [],
                                      "observers": []}
            if error == ErrorCode.none:
                answer.update(high_watermark=high_watermark, current_voters=[_replica(node_id, high_watermark)],
                              observers=[_replica(b, -1) for b in sorted(brokers) if b != node_id])
            else:
                answer["error_message"] = error.name.upper()
            partitions.append(answer)
        topics.append({"topic_name": topic.topic_name, "partitions": partitions})
    nodes = [{"node_id": node_id, "listeners": [{"name": e.name, "host": e.host, "port": e.port} for e in endpoints]}]
    return {"error_code": ErrorCode.none, "error_message": None, "topics": topics, "nodes": nodes if controller_id == node_id else []}
