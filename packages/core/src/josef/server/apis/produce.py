"""Produce: append whole batches to partition leaders; acks 0, 1 and all.

acks=all waits until the high watermark covers the batch, that is, until
every member of the ISR has it. The ISR must hold ``min.insync.replicas``
members before the append (NOT_ENOUGH_REPLICAS, nothing written) and still
when the wait ends (NOT_ENOUGH_REPLICAS_AFTER_APPEND: written, but not as
safely as asked). A leader that loses its leadership while a producer waits
answers NOT_LEADER_OR_FOLLOWER: the new leader may not have the batch.

Requests are read and answered by :mod:`josef.protocol.produce_codec`, not
kio: each partition's records arrive as a view of the request frame (reading
the request copies nothing). A large request was read by the kernel straight
into a writable buffer of its own (:class:`josef.server.network._Wire`), so
the leader stamps offsets into the batches where they lie and the bytes are
copied once more only into the file; a small one, cut out of the
connection's receive buffer, is copied once into the buffer the offsets are
stamped into.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from josef.replication.partition import Partition, PartitionError
from josef.metrics.topics import BYTES_IN, BYTES_REJECTED, FAILED_PRODUCE, MESSAGES_IN, METERS, TOTAL_PRODUCE
from josef.server.apis.common import current_leader, error_of, leader_endpoints, partition_for, topic_name
from josef.protocol.produce_codec import ProduceRequest, response_encoder
from josef.protocol.records import HEADER_SIZE, BatchHeader, RecordErrors
from josef.producer.txn_verification import Verdict, verify
from josef.server.dispatch import Encoded, Later, RequestContext

log = logging.getLogger(__name__)

#: Errors of batches refused for what they are, whose bytes count as Kafka's BytesRejectedPerSec.
_REJECTED = frozenset({ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.corrupt_message,
                       ErrorCode.invalid_record, ErrorCode.invalid_timestamp})

#: Where the counts of partitions of a topic id no topic has go (nowhere to report them).
_UNCOUNTED = [0] * len(METERS)

#: From this Produce version on, clients use Transactions V2 and the leader adds the partition itself.
ADD_PARTITION_VERSION = 12


async def produce(ctx: RequestContext, request: ProduceRequest) -> Encoded | Later | None:
    acks = request.acks
    replicas = ctx.broker.replicas
    meters = ctx.broker.topic_metrics
    verdicts = await _verify_partitions(ctx, request)
    refused = request.refused_topics
    topics = []
    waiting = []  # (partition, offset the high watermark must pass, response dict)
    for topic in request.topic_data:
        name = topic_name(ctx, topic)
        counts = meters.of(name) if name is not None else _UNCOUNTED
        partitions = []
        for data in topic.partition_data:
            result: dict[str, Any] = {"index": data.index, "error_code": ErrorCode.none, "base_offset": -1,
                                      "log_append_time": -1, "log_start_offset": -1, "record_errors": ()}
            partitions.append(result)
            if acks not in (0, 1, -1):
                result["error_code"] = ErrorCode.invalid_required_acks
                continue
            verdict = verdicts.get((name, data.index))
            try:
                if refused and name in refused:
                    raise PartitionError(ErrorCode.topic_authorization_failed)
                if isinstance(verdict, ErrorCode):
                    raise PartitionError(verdict, f"{name}-{data.index} is not in transaction {request.transactional_id!r}")
                partition = partition_for(ctx, name, data.index)
                info, append_time = partition.append_as_leader(data.records or b"", acks, verification=verdict)
            except Exception as exc:
                code, message = error_of(exc)
                log.debug("produce to %s-%s failed: %s", name, data.index, message)
                counts[FAILED_PRODUCE] += 1
                counts[TOTAL_PRODUCE] += 1
                if code in _REJECTED:
                    counts[BYTES_REJECTED] += len(data.records or b"")
                result["error_code"], result["error_message"] = code, message
                result["current_leader"] = current_leader(ctx, name, data.index, code)
                if isinstance(exc, RecordErrors):
                    result["record_errors"] = [{"batch_index": index, "batch_index_error_message": why}
                                               for index, why in exc.errors]
                continue
            replicas.appended(partition.tp)
            counts[MESSAGES_IN] += info.record_count
            counts[BYTES_IN] += len(data.records)
            counts[TOTAL_PRODUCE] += 1
            result["base_offset"] = info.first_offset
            result["log_append_time"] = append_time
            result["log_start_offset"] = partition.log.log_start_offset
            if acks == -1:
                waiting.append((partition, info.last_offset, result))
        topics.append((name, topic.topic_id, partitions))
    if acks == 0:
        return None
    epochs = {id(partition): partition.leader_epoch for partition, _, _ in waiting}
    waiting = [w for w in waiting if not _replicated(w, epochs[id(w[0])])]
    if waiting:
        deadline = time.monotonic() + request.timeout_ms / 1000
        return Later(_answer_when_replicated(ctx, waiting, epochs, topics, deadline))
    return _response(ctx, topics)


async def _verify_partitions(ctx: RequestContext, request: ProduceRequest) -> dict[tuple[str, int], Verdict]:
    """Verdicts for the partitions of a transactional produce that need one; others are absent."""
    if not request.transactional_id:
        return {}
    written: dict[tuple[str, int], Partition] = {}
    producer = None
    for topic in request.topic_data:
        name = topic_name(ctx, topic)
        for data in topic.partition_data:
            records = data.records
            if name is None or not records or len(records) < HEADER_SIZE:
                continue
            header = BatchHeader.parse(records)
            if not header.is_transactional or header.producer_id < 0:
                continue
            try:
                partition = partition_for(ctx, name, data.index)
            except PartitionError:
                continue  # the append answers it
            written[(name, data.index)] = partition
            producer = (header.producer_id, header.producer_epoch)
    if producer is None:
        return {}
    return await verify(ctx.broker, request.transactional_id, *producer, written, ctx.api_version >= ADD_PARTITION_VERSION)


Topics = list[tuple[str | None, Any, list[dict[str, Any]]]]


def _response(ctx: RequestContext, topics: Topics) -> Encoded:
    encoder = response_encoder(ctx.api_version)
    leaders = []
    written = []
    for name, topic_id, partitions in topics:
        entries = []
        for p in partitions:
            leader = p.get("current_leader")
            if leader is not None:
                leaders.append(leader)
            entries.append(encoder.partition(
                p["index"], p["error_code"], p["base_offset"], p["log_append_time"], p["log_start_offset"],
                [(e["batch_index"], e["batch_index_error_message"]) for e in p["record_errors"]],
                p.get("error_message"), (leader["leader_id"], leader["leader_epoch"]) if leader else None))
        written.append(encoder.topic(name, topic_id, entries))
    endpoints = [(e["node_id"], e["host"], e["port"], e["rack"]) for e in leader_endpoints(ctx, leaders)] if leaders else ()
    offset = encoder.throttle_offset(written)
    return Encoded(encoder.response(written, node_endpoints=endpoints), None if offset is None else (0, offset))


async def _answer_when_replicated(ctx: RequestContext, waiting: list[tuple[Any, int, dict[str, Any]]],
                                  epochs: dict[int, int], topics: Topics, deadline: float) -> Encoded:
    await await_replication(ctx, waiting, epochs, deadline)
    return _response(ctx, topics)


async def await_replication(ctx: RequestContext, waiting: list[tuple[Any, int, dict[str, Any]]],
                             epochs: dict[int, int], deadline: float) -> None:
    """acks=all: hold the response until the ISR has every appended batch (Kafka's DelayedProduce), or time out.

    The request's timeout runs from its arrival (``deadline``), not from
    when its connection gets to its answer.
    """
    with anyio.move_on_after(deadline - time.monotonic()):
        while waiting:
            waiting = [w for w in waiting if not _replicated(w, epochs[id(w[0])])]
            if waiting:
                await ctx.broker.replicas.purgatory.wait([w[0].tp for w in waiting], max(deadline - time.monotonic(), 0))
    for _, _, result in waiting:
        result["error_code"] = ErrorCode.request_timed_out


def _replicated(waiting: tuple[Any, int, dict[str, Any]], leader_epoch: int) -> bool:
    """Whether a waiting write is settled: committed, failed, or orphaned by a leadership change."""
    partition, last_offset, result = waiting
    if not partition.is_leader or partition.leader_epoch != leader_epoch:
        result["error_code"] = ErrorCode.not_leader_or_follower
        result["error_message"] = f"{partition.tp}: leadership moved while waiting for replication"
        return True
    if partition.high_watermark <= last_offset:
        return False
    try:
        partition.check_enough_replicas()
    except Exception as exc:
        result["error_code"], result["error_message"] = error_of(exc)
    return True
