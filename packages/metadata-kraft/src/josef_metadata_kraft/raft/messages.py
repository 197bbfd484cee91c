"""The Raft RPCs as kio dataclasses, and the KRaft control records, at the versions Kafka 4.x speaks.

Vote v2 (with ``pre_vote``, KIP-996), BeginQuorumEpoch v1, EndQuorumEpoch v1,
Fetch v17, FetchSnapshot v1 and DescribeQuorum v2: a network driver encodes
these objects unchanged (their class carries the API key and version). Every
RPC names the single partition ``__cluster_metadata-0``; Fetch names it by
Kafka's fixed metadata topic id.

Control records (LeaderChange, SnapshotHeader, SnapshotFooter) are control
batches whose one record has the key ``(version int16 = 0, type int16)`` and
the message, without a version prefix, as the value (Kafka's
``ControlRecordUtils``).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import struct
import uuid
from typing import Any, Iterable, Mapping, Sequence

from kio.schema.begin_quorum_epoch.v1 import request as bqe_req
from kio.schema.begin_quorum_epoch.v1 import response as bqe_resp
from kio.schema.describe_quorum.v2 import response as dq_resp
from kio.schema.end_quorum_epoch.v1 import request as eqe_req
from kio.schema.end_quorum_epoch.v1 import response as eqe_resp
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v17 import request as fetch_req
from kio.schema.fetch.v17 import response as fetch_resp
from kio.schema.fetch_snapshot.v1 import request as fs_req
from kio.schema.fetch_snapshot.v1 import response as fs_resp
from kio.schema.leader_change_message.v0.data import LeaderChangeMessage, Voter
from kio.schema.snapshot_footer_record.v0.data import SnapshotFooterRecord
from kio.schema.snapshot_header_record.v0.data import SnapshotHeaderRecord
from kio.schema.vote.v2 import request as vote_req
from kio.schema.vote.v2 import response as vote_resp
from kio.serial import entity_reader, entity_writer

from josef.protocol.messages import build
from josef.protocol.records import CONTROL_BIT, build_batch, decode_batch

from .log import OffsetAndEpoch

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
#: Kafka's ``Uuid.METADATA_TOPIC_ID``: Uuid(0, 1).
METADATA_TOPIC_ID = uuid.UUID(int=1)

#: Control record types (Kafka's ``ControlRecordType``).
LEADER_CHANGE, SNAPSHOT_HEADER, SNAPSHOT_FOOTER = 2, 3, 4
_CONTROL_KEY = struct.Struct(">hh")

NONE = ErrorCode.none
Endpoints = dict[int, tuple[str, int]]


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _encode(cls: type, value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)  # type: ignore[arg-type]
    return buf.getvalue()


# ------------------------------------------------------------------ control records


def control_batch(record_type: int, value: bytes, *, base_offset: int, epoch: int, timestamp_ms: int) -> bytes:
    """One control batch holding one control record, at ``base_offset`` in ``epoch``."""
    return build_batch([(_CONTROL_KEY.pack(0, record_type), value, timestamp_ms)], base_offset=base_offset,
                       leader_epoch=epoch, attributes=CONTROL_BIT)


def _voters(ids: Iterable[int]) -> tuple[Voter, ...]:
    return tuple(Voter(voter_id=v) for v in sorted(ids))  # type: ignore[arg-type]


def leader_change_batch(*, base_offset: int, epoch: int, leader_id: int, voters: Iterable[int],
                        granting_voters: Iterable[int], timestamp_ms: int) -> bytes:
    """The LeaderChange control batch a new leader writes first in its epoch (LeaderChangeMessage v0)."""
    message = LeaderChangeMessage(version=0, leader_id=leader_id,  # type: ignore[arg-type]
                                  voters=_voters(voters), granting_voters=_voters(granting_voters))
    return control_batch(LEADER_CHANGE, _encode(LeaderChangeMessage, message), base_offset=base_offset,
                         epoch=epoch, timestamp_ms=timestamp_ms)


def control_record(batch: bytes) -> tuple[int, bytes]:
    """``(type, value)`` of the record in a control batch."""
    record = decode_batch(bytes(batch), 0, METADATA_TOPIC, METADATA_PARTITION, check_crc=False)[0]
    return _CONTROL_KEY.unpack_from(record.key)[1], record.value or b""


def decode_leader_change(value: bytes) -> LeaderChangeMessage:
    message, _ = entity_reader(LeaderChangeMessage)(value, 0)  # type: ignore[arg-type]
    return message


def snapshot_bytes(snapshot_id: OffsetAndEpoch, payloads: Sequence[bytes], timestamp_ms: int,
                   batch_bytes: int = 1024 * 1024, control: Sequence[tuple[int, bytes]] = ()) -> bytes:
    """A snapshot as Kafka's RecordsSnapshotWriter lays it out: header, data batches, footer.

    Offsets inside a snapshot start at 0; every batch carries the snapshot's epoch.
    ``control`` (KRaftVersion and Voters records, KIP-853) go in one control
    batch right after the header, as Kafka's writer puts them.
    """
    header = SnapshotHeaderRecord(version=0, last_contained_log_timestamp=timestamp_ms)  # type: ignore[arg-type]
    parts = [control_batch(SNAPSHOT_HEADER, _encode(SnapshotHeaderRecord, header), base_offset=0,
                           epoch=snapshot_id.epoch, timestamp_ms=timestamp_ms)]
    offset = 1
    if control:
        parts.append(build_batch([(_CONTROL_KEY.pack(0, t), v, timestamp_ms) for t, v in control],
                                 base_offset=offset, leader_epoch=snapshot_id.epoch, attributes=CONTROL_BIT))
        offset += len(control)
    chunk: list[tuple[bytes | None, bytes | None, int]] = []
    size = 0
    for payload in payloads:
        chunk.append((None, payload, timestamp_ms))
        size += len(payload)
        if size >= batch_bytes:
            parts.append(build_batch(chunk, base_offset=offset, leader_epoch=snapshot_id.epoch))
            offset += len(chunk)
            chunk, size = [], 0
    if chunk:
        parts.append(build_batch(chunk, base_offset=offset, leader_epoch=snapshot_id.epoch))
        offset += len(chunk)
    footer = SnapshotFooterRecord(version=0)  # type: ignore[arg-type]
    parts.append(control_batch(SNAPSHOT_FOOTER, _encode(SnapshotFooterRecord, footer), base_offset=offset,
                               epoch=snapshot_id.epoch, timestamp_ms=timestamp_ms))
    return b"".join(parts)


# ------------------------------------------------------------------ request/response shapes


def single_partition(topics: Sequence[Any], name_field: str, partitions_field: str = "partitions",
                     index_field: str = "partition_index", topic: Any = METADATA_TOPIC) -> Any | None:
    """The partition data when ``topics`` names exactly ``__cluster_metadata-0``, else ``None``."""
    if len(topics) != 1:
        return None
    partitions = getattr(topics[0], partitions_field)
    if getattr(topics[0], name_field) != topic or len(partitions) != 1:
        return None
    partition = partitions[0]
    return partition if getattr(partition, index_field) == METADATA_PARTITION else None


def vote_request(*, cluster_id: str, voter_id: int, epoch: int, candidate_id: int, last_epoch: int,
                 last_offset: int, pre_vote: bool) -> vote_req.VoteRequest:
    partition = vote_req.PartitionData(partition_index=0, replica_epoch=epoch, replica_id=candidate_id,
                                       replica_directory_id=None, voter_directory_id=None,
                                       last_offset_epoch=last_epoch, last_offset=last_offset, pre_vote=pre_vote)
    return vote_req.VoteRequest(cluster_id=cluster_id, voter_id=voter_id,  # type: ignore[arg-type]
                                topics=(vote_req.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),))


def vote_response(error: ErrorCode, *, partition_error: ErrorCode = NONE, epoch: int = -1,
                  leader_id: int = -1, granted: bool = False,
                  endpoints: Endpoints | None = None) -> vote_resp.VoteResponse:
    if error != NONE:
        return vote_resp.VoteResponse(error_code=error, topics=())
    partition = vote_resp.PartitionData(partition_index=0, error_code=partition_error, leader_id=leader_id,
                                        leader_epoch=epoch, vote_granted=granted)
    return vote_resp.VoteResponse(
        error_code=NONE, topics=(vote_resp.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),),
        node_endpoints=_node_endpoints(vote_resp.NodeEndpoint, leader_id, endpoints))


def _node_endpoints(cls: type, leader_id: int, endpoints: Endpoints | None) -> tuple[Any, ...]:
    if leader_id < 0 or not endpoints or leader_id not in endpoints:
        return ()
    host, port = endpoints[leader_id]
    return (cls(node_id=leader_id, host=host, port=port),)


def _leader_endpoints(cls: type, listener: str, leader_id: int, endpoints: Endpoints) -> tuple[Any, ...]:
    if leader_id not in endpoints:
        return ()
    host, port = endpoints[leader_id]
    return (cls(name=listener, host=host, port=port),)


def add_raft_voter_response(version: int, error: ErrorCode, message: str | None = None) -> Any:
    module = importlib.import_module(f"kio.schema.add_raft_voter.v{version}.response")
    return module.AddRaftVoterResponse(throttle_time=_ms(0), error_code=error, error_message=message)


def remove_raft_voter_response(error: ErrorCode, message: str | None = None) -> Any:
    from kio.schema.remove_raft_voter.v0.response import RemoveRaftVoterResponse
    return RemoveRaftVoterResponse(throttle_time=_ms(0), error_code=error,  # type: ignore[arg-type]
                                   error_message=message)


def update_raft_voter_request(*, cluster_id: str, epoch: int, voter_id: int, directory_id: uuid.UUID | None,
                              endpoints: Sequence[tuple[str, str, int]]) -> Any:
    from kio.schema.update_raft_voter.v0 import request as urv

    return urv.UpdateRaftVoterRequest(
        cluster_id=cluster_id, current_leader_epoch=epoch, voter_id=voter_id,  # type: ignore[arg-type]
        voter_directory_id=directory_id,
        listeners=tuple(urv.Listener(name=n, host=h, port=p) for n, h, p in endpoints),  # type: ignore[arg-type]
        k_raft_version_feature=urv.KRaftVersionFeature(min_supported_version=0,  # type: ignore[arg-type]
                                                       max_supported_version=1))  # type: ignore[arg-type]


def update_raft_voter_response(error: ErrorCode, *, leader_id: int = -1, epoch: int = -1,
                               endpoint: tuple[str, int] | None = None) -> Any:
    from kio.schema.update_raft_voter.v0 import response as urv

    host, port = endpoint or ("", -1)
    return urv.UpdateRaftVoterResponse(throttle_time=_ms(0), error_code=error,  # type: ignore[arg-type]
                                       current_leader=urv.CurrentLeader(leader_id=leader_id,  # type: ignore[arg-type]
                                                                        leader_epoch=epoch, host=host, port=port))


def begin_quorum_epoch_request(*, cluster_id: str, voter_id: int, epoch: int, leader_id: int, listener: str,
                               endpoints: Endpoints) -> bqe_req.BeginQuorumEpochRequest:
    partition = bqe_req.PartitionData(partition_index=0, voter_directory_id=None, leader_id=leader_id,
                                      leader_epoch=epoch)
    return bqe_req.BeginQuorumEpochRequest(
        cluster_id=cluster_id, voter_id=voter_id,  # type: ignore[arg-type]
        topics=(bqe_req.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),),
        leader_endpoints=_leader_endpoints(bqe_req.LeaderEndpoint, listener, leader_id, endpoints))


def begin_quorum_epoch_response(error: ErrorCode, *, partition_error: ErrorCode = NONE, epoch: int = -1,
                                leader_id: int = -1,
                                endpoints: Endpoints | None = None) -> bqe_resp.BeginQuorumEpochResponse:
    if error != NONE:
        return bqe_resp.BeginQuorumEpochResponse(error_code=error, topics=())
    partition = bqe_resp.PartitionData(partition_index=0, error_code=partition_error, leader_id=leader_id,
                                       leader_epoch=epoch)
    return bqe_resp.BeginQuorumEpochResponse(
        error_code=NONE, topics=(bqe_resp.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),),
        node_endpoints=_node_endpoints(bqe_resp.NodeEndpoint, leader_id, endpoints))


def end_quorum_epoch_request(*, cluster_id: str, epoch: int, leader_id: int, preferred: Sequence[int],
                             listener: str, endpoints: Endpoints) -> eqe_req.EndQuorumEpochRequest:
    partition = eqe_req.PartitionData(
        partition_index=0, leader_id=leader_id, leader_epoch=epoch,
        preferred_candidates=tuple(eqe_req.ReplicaInfo(candidate_id=c, candidate_directory_id=None)
                                   for c in preferred))
    return eqe_req.EndQuorumEpochRequest(
        cluster_id=cluster_id, topics=(eqe_req.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),),
        leader_endpoints=_leader_endpoints(eqe_req.LeaderEndpoint, listener, leader_id, endpoints))


def end_quorum_epoch_response(error: ErrorCode, *, partition_error: ErrorCode = NONE, epoch: int = -1,
                              leader_id: int = -1,
                              endpoints: Endpoints | None = None) -> eqe_resp.EndQuorumEpochResponse:
    if error != NONE:
        return eqe_resp.EndQuorumEpochResponse(error_code=error, topics=())
    partition = eqe_resp.PartitionData(partition_index=0, error_code=partition_error, leader_id=leader_id,
                                       leader_epoch=epoch)
    return eqe_resp.EndQuorumEpochResponse(
        error_code=NONE, topics=(eqe_resp.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),),
        node_endpoints=_node_endpoints(eqe_resp.NodeEndpoint, leader_id, endpoints))


def fetch_request(*, cluster_id: str, replica_id: int, epoch: int, fetch_offset: int, last_fetched_epoch: int,
                  log_start_offset: int, max_wait_ms: int, max_bytes: int,
                  directory_id: uuid.UUID | None = None) -> fetch_req.FetchRequest:
    partition = fetch_req.FetchPartition(partition=0, current_leader_epoch=epoch, fetch_offset=fetch_offset,
                                         last_fetched_epoch=last_fetched_epoch, log_start_offset=log_start_offset,
                                         partition_max_bytes=max_bytes, replica_directory_id=directory_id)
    return fetch_req.FetchRequest(
        cluster_id=cluster_id, replica_state=fetch_req.ReplicaState(replica_id=replica_id),  # type: ignore[arg-type]
        max_wait=_ms(max_wait_ms), min_bytes=0, max_bytes=max_bytes,  # type: ignore[arg-type]
        topics=(fetch_req.FetchTopic(topic_id=METADATA_TOPIC_ID, partitions=(partition,)),),
        forgotten_topics_data=())


_NO_EPOCH_END = fetch_resp.EpochEndOffset()
_NO_SNAPSHOT = fetch_resp.SnapshotId()


def fetch_response(error: ErrorCode, *, partition_error: ErrorCode = NONE, high_watermark: int = -1,
                   log_start_offset: int = -1, leader_id: int = -1, epoch: int = -1,
                   diverging: OffsetAndEpoch | None = None, snapshot_id: OffsetAndEpoch | None = None,
                   records: bytes = b"", endpoints: Endpoints | None = None) -> fetch_resp.FetchResponse:
    if error != NONE:
        return fetch_resp.FetchResponse(throttle_time=_ms(0), error_code=error,  # type: ignore[arg-type]
                                        responses=())
    partition = fetch_resp.PartitionData(
        partition_index=0, error_code=partition_error, high_watermark=high_watermark,
        log_start_offset=log_start_offset,
        diverging_epoch=(_NO_EPOCH_END if diverging is None
                         else fetch_resp.EpochEndOffset(epoch=diverging.epoch, end_offset=diverging.offset)),
        current_leader=fetch_resp.LeaderIdAndEpoch(leader_id=leader_id, leader_epoch=epoch),
        snapshot_id=(_NO_SNAPSHOT if snapshot_id is None
                     else fetch_resp.SnapshotId(end_offset=snapshot_id.offset, epoch=snapshot_id.epoch)),
        aborted_transactions=None, records=records)  # type: ignore[arg-type]
    return fetch_resp.FetchResponse(
        throttle_time=_ms(0), error_code=NONE,  # type: ignore[arg-type]
        responses=(fetch_resp.FetchableTopicResponse(topic_id=METADATA_TOPIC_ID, partitions=(partition,)),),
        node_endpoints=_node_endpoints(fetch_resp.NodeEndpoint, leader_id, endpoints))


def fetch_snapshot_request(*, cluster_id: str, replica_id: int, epoch: int, snapshot_id: OffsetAndEpoch,
                           position: int, max_bytes: int) -> fs_req.FetchSnapshotRequest:
    partition = fs_req.PartitionSnapshot(
        partition=0, current_leader_epoch=epoch,
        snapshot_id=fs_req.SnapshotId(end_offset=snapshot_id.offset, epoch=snapshot_id.epoch), position=position)
    return fs_req.FetchSnapshotRequest(
        cluster_id=cluster_id, replica_id=replica_id, max_bytes=max_bytes,  # type: ignore[arg-type]
        topics=(fs_req.TopicSnapshot(name=METADATA_TOPIC, partitions=(partition,)),))


def fetch_snapshot_response(error: ErrorCode, *, partition_error: ErrorCode = NONE, leader_id: int = -1,
                            epoch: int = -1, snapshot_id: OffsetAndEpoch | None = None, size: int = -1,
                            position: int = -1, data: bytes = b"",
                            endpoints: Endpoints | None = None) -> fs_resp.FetchSnapshotResponse:
    if error != NONE:
        return fs_resp.FetchSnapshotResponse(throttle_time=_ms(0), error_code=error,  # type: ignore[arg-type]
                                             topics=())
    sid = snapshot_id or OffsetAndEpoch(-1, -1)
    partition = fs_resp.PartitionSnapshot(
        index=0, error_code=partition_error, snapshot_id=fs_resp.SnapshotId(end_offset=sid.offset, epoch=sid.epoch),
        current_leader=fs_resp.LeaderIdAndEpoch(leader_id=leader_id, leader_epoch=epoch), size=size,
        position=position, unaligned_records=data)  # type: ignore[arg-type]
    return fs_resp.FetchSnapshotResponse(
        throttle_time=_ms(0), error_code=NONE,  # type: ignore[arg-type]
        topics=(fs_resp.TopicSnapshot(name=METADATA_TOPIC, partitions=(partition,)),),
        node_endpoints=_node_endpoints(fs_resp.NodeEndpoint, leader_id, endpoints))


def describe_quorum_response(*, partition_error: ErrorCode = NONE, leader_id: int = -1, epoch: int = -1,
                             high_watermark: int = -1, voters: Sequence[dq_resp.ReplicaState] = (),
                             observers: Sequence[dq_resp.ReplicaState] = (), listener: str = "",
                             endpoints: Endpoints | None = None,
                             topic: str = METADATA_TOPIC, partition_index: int = 0) -> dq_resp.DescribeQuorumResponse:
    message = None if partition_error == NONE else partition_error.name.upper()
    partition = dq_resp.PartitionData(
        partition_index=partition_index, error_code=partition_error, error_message=message, leader_id=leader_id,
        leader_epoch=epoch, high_watermark=high_watermark, current_voters=tuple(voters),
        observers=tuple(observers))
    nodes = () if partition_error != NONE or not endpoints else tuple(
        dq_resp.Node(node_id=node, listeners=(dq_resp.Listener(name=listener, host=host, port=port),))
        for node, (host, port) in sorted(endpoints.items()) if port >= 0)  # a voter whose endpoint is unknown
    return dq_resp.DescribeQuorumResponse(error_code=NONE, error_message=None,
                                          topics=(dq_resp.TopicData(topic_name=topic, partitions=(partition,)),),
                                          nodes=nodes)


def with_nodes(response: dq_resp.DescribeQuorumResponse,
               listeners: Mapping[int, Sequence[tuple[str, str, int]]]) -> dq_resp.DescribeQuorumResponse:
    """``response`` naming ``(listener, host, port)`` of each node in ``listeners`` in its nodes."""
    return dataclasses.replace(response, nodes=tuple(
        dq_resp.Node(node_id=node, listeners=tuple(dq_resp.Listener(name=n, host=h, port=p) for n, h, p in found))
        for node, found in sorted(listeners.items())))


def describe_quorum_at_version(response: dq_resp.DescribeQuorumResponse, version: int) -> Any:
    """The response at the request's version (admin tools of Kafka 3.x ask with v0 or v1)."""
    if version == 2:
        return response
    module = importlib.import_module(f"kio.schema.describe_quorum.v{version}.response")
    return build(module.DescribeQuorumResponse, dataclasses.asdict(response))


def replica_state(replica_id: int, log_end_offset: int, last_fetch_ms: int,
                  last_caught_up_ms: int, directory_id: uuid.UUID | None = None) -> dq_resp.ReplicaState:
    return dq_resp.ReplicaState(replica_id=replica_id, replica_directory_id=directory_id,  # type: ignore[arg-type]
                                log_end_offset=log_end_offset, last_fetch_timestamp=last_fetch_ms,
                                last_caught_up_timestamp=last_caught_up_ms)
