"""ListOffsets, OffsetForLeaderEpoch and DeleteRecords: questions and changes about a partition's offsets."""

from __future__ import annotations

import bisect
from typing import Any, Callable

import anyio
from kio.schema.errors import ErrorCode

from josef.log import LogDirError, OffsetOutOfRangeError
from josef.replication.partition import READ_COMMITTED, READ_UNCOMMITTED, Partition, PartitionError
from josef.protocol.topic_partition import TopicPartition
from josef.server.apis.common import error_of, partition_for
from josef.server.dispatch import RequestContext

#: What a remote timestamp search answered a partition: ``(offset, timestamp)``, nothing, or its failure.
Remote = tuple[int, int] | LogDirError | PartitionError | None

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING_UPLOAD = -1, -2, -3, -4, -5, -6


def _epoch_at(partition: Partition, offset: int) -> int:
    """The leader epoch the batch at ``offset`` was written in (the epoch cache entry covering it)."""
    entries = partition.log.epoch_entries()
    index = bisect.bisect_right([e.start_offset for e in entries], offset) - 1
    return entries[index].epoch if index >= 0 else -1


def _lookup(partition: Partition, timestamp: int, isolation: int, remote: Remote) -> tuple[int, int]:
    """(timestamp, offset) answering a ListOffsets query, (-1, -1) when no record qualifies.

    Nothing at or past what the isolation level may read counts: the high
    watermark, or the last stable offset for ``read_committed``. ``remote``
    is what remote storage answered a timestamp search, searched first.
    """
    log = partition.log
    fetchable = partition.last_stable_offset if isolation == READ_COMMITTED else partition.high_watermark
    if timestamp == LATEST:
        return -1, fetchable
    if timestamp == EARLIEST:
        return -1, log.log_start_offset
    if timestamp == EARLIEST_LOCAL:  # the first offset held on this broker's disk: above the log start once tiered
        # A storage written for plugin API 1.2 has no local log start: it holds everything locally.
        return -1, getattr(log, "local_log_start_offset", log.log_start_offset)
    if timestamp == LATEST_TIERED:  # KIP-1005: how far remote storage reaches; -1 for a log that is not tiered
        return -1, getattr(log, "highest_offset_in_remote_storage", -1)
    if timestamp == EARLIEST_PENDING_UPLOAD:
        return -1, _earliest_pending_upload(log)
    if isinstance(remote, Exception):
        raise remote
    if timestamp == MAX_TIMESTAMP:
        found = log.max_timestamp()
    else:
        found = None
        hit = remote or log.offset_for_timestamp(timestamp)
        if hit is not None:
            found = (hit[1], hit[0])
    if found is None or found[1] < 0 or found[1] >= fetchable:
        return -1, -1
    return found


def _earliest_pending_upload(log: Any) -> int:
    """KIP-1023 (ListOffsets -6): the first offset not yet copied to remote storage; -1 for a log that is not
    tiered, or one whose leader does not know yet what was copied (its local log starts above its log start)."""
    if not getattr(log.config, "remote_storage_enable", False):
        return -1
    highest = getattr(log, "highest_offset_in_remote_storage", -1)
    if highest >= 0:
        return max(highest + 1, log.log_start_offset)
    return log.log_start_offset if getattr(log, "local_log_start_offset", log.log_start_offset) == log.log_start_offset \
        else -1


Answer = Callable[[Partition, Any], dict[str, Any]]


def _per_partition(ctx: RequestContext, request: Any, topic_field: str, index_field: str,
                   defaults: dict[str, Any], answer: Answer) -> dict[str, Any]:
    """Answer each partition of a request at its leader; an error becomes that partition's error code."""
    topics = []
    for topic in request.topics:
        name = getattr(topic, topic_field)
        partitions = []
        for part in topic.partitions:
            index = getattr(part, index_field)
            result = {index_field: index, "error_code": ErrorCode.none, **defaults}
            try:
                partition = partition_for(ctx, name, index)
                partition.require_leader()
                partition.check_leader_epoch(getattr(part, "current_leader_epoch", -1))
                result.update(answer(partition, part))
            except Exception as exc:
                result["error_code"], _ = error_of(exc)
            partitions.append(result)
        topics.append({topic_field: name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


def _list_offset(isolation: int, remote: dict[TopicPartition, Remote]) -> Answer:
    def answer(partition: Partition, part: Any) -> dict[str, Any]:
        timestamp, offset = _lookup(partition, part.timestamp, isolation, remote.get(partition.tp))
        epoch = partition.leader_epoch if part.timestamp == LATEST else _epoch_at(partition, offset)
        return {"timestamp": timestamp, "offset": offset, "leader_epoch": epoch if offset >= 0 else -1}
    return answer


def _end_of_epoch(partition: Partition, part: Any) -> dict[str, Any]:
    partition.check_epoch_seen(part.leader_epoch)
    if part.leader_epoch == partition.leader_epoch:
        return {"leader_epoch": partition.leader_epoch, "end_offset": partition.log.log_end_offset}
    epoch, end = partition.log.end_offset_for_epoch(part.leader_epoch)
    return {"leader_epoch": epoch, "end_offset": end}


def _delete_before(partition: Partition, part: Any) -> dict[str, Any]:
    offset = partition.high_watermark if part.offset == -1 else part.offset
    if not 0 <= offset <= partition.high_watermark:
        raise OffsetOutOfRangeError(f"offset {part.offset} is beyond the high watermark {partition.high_watermark}")
    return {"low_watermark": partition.log.delete_records_before(offset)}


async def list_offsets(ctx: RequestContext, request: Any) -> dict[str, Any]:
    remote = await _search_remote(ctx, request)
    return _per_partition(ctx, request, "name", "partition_index",
                          {"timestamp": -1, "offset": -1, "leader_epoch": -1, "old_style_offsets": ()},
                          _list_offset(getattr(request, "isolation_level", READ_UNCOMMITTED), remote))


async def _search_remote(ctx: RequestContext, request: Any) -> dict[TopicPartition, Remote]:
    """Timestamp searches of tiered partitions, awaited in remote storage first (Kafka's DelayedRemoteListOffsets).

    Only partitions this broker leads whose log reaches below its local log
    start are searched, within the request's ``timeout`` (v10+, KIP-1075;
    REQUEST_TIMED_OUT for what it did not reach). A failure is kept as that
    partition's answer (KAFKA_STORAGE_ERROR for it alone).
    """
    searches = []
    for topic in request.topics:
        for part in topic.partitions:
            if part.timestamp < 0:
                continue
            try:
                partition = partition_for(ctx, topic.name, part.partition_index)
            except Exception:
                continue  # answered with its error by _per_partition
            log = partition.log
            if partition.is_leader and log.log_start_offset < getattr(log, "local_log_start_offset", 0):
                searches.append((partition.tp, log, part.timestamp))
    timeout = getattr(request, "timeout", None)
    found: dict[TopicPartition, Remote] = {
        tp: PartitionError(ErrorCode.request_timed_out, f"{tp}: the remote timestamp search took longer than the "
                           f"request's timeout") for tp, _, _ in searches}
    with anyio.move_on_after(None if timeout is None else timeout.total_seconds()):
        for tp, log, timestamp in searches:
            try:
                found[tp] = await log.remote_offset_for_timestamp(timestamp)
            except LogDirError as exc:
                found[tp] = exc
    return found


async def offset_for_leader_epoch(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return _per_partition(ctx, request, "topic", "partition", {"leader_epoch": -1, "end_offset": -1}, _end_of_epoch)


async def delete_records(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return _per_partition(ctx, request, "name", "partition_index", {"low_watermark": -1}, _delete_before)
