"""Fetch: whole batches below the high watermark, with long polling on max_wait_ms/min_bytes.

A fetch naming a replica (``replica_state.replica_id``, ``replica_id``
before v15) comes from a follower: it is served up to the log end, its
fetch offset is the follower's log end offset (which moves the high
watermark and the ISR), and a ``last_fetched_epoch`` that our log does not
end the same way is answered with ``diverging_epoch`` instead of records,
so the follower cuts its log (KIP-320). A follower outside the ISR gets no
records of a partition in ``leader.replication.throttled.replicas`` while
the leader throttle is exceeded, and what throttled partitions send counts
towards it (KIP-73, :mod:`josef.replication_quota`).

A partition this broker does not lead is answered NOT_LEADER_OR_FOLLOWER
with the leader it knows and its endpoint (KIP-951), so clients go there
without a metadata round trip. Consumers from v11 on may fetch from
followers (KIP-392), which serve up to their own high watermark; with
``replica.selector.class`` set, a leader sends a consumer that names its
rack to an in-sync replica there (``preferred_read_replica``).

Sessions (KIP-227) are answered with session id 0, which tells clients to
keep sending full fetch requests; that is always allowed by the protocol.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from josef.partition import FOLLOWER, READ_COMMITTED, READ_UNCOMMITTED, Partition
from josef.protocol.topic_partition import TopicPartition
from josef.server.apis.common import current_leader, error_of, leader_endpoints, partition_for, topic_name
from josef.server.dispatch import RequestContext


#: Consumers name their rack and may fetch from followers from this Fetch version on (KIP-392).
FOLLOWER_FETCH_VERSION = 11


def replica_of(request: Any) -> int:
    """The follower sending the fetch, or -1 for a consumer."""
    state = getattr(request, "replica_state", None)
    replica_id = state.replica_id if state is not None else getattr(request, "replica_id", -1)
    return replica_id if replica_id is not None else -1


async def fetch(ctx: RequestContext, request: Any) -> dict[str, Any]:
    deadline = time.monotonic() + request.max_wait.total_seconds()
    replica_id = replica_of(request)
    min_bytes = request.min_bytes
    max_bytes = getattr(request, "max_bytes", 2**31 - 1)
    wanted = []  # (topic entry, partition request, name)
    for topic in request.topics:
        name = topic_name(ctx, topic)
        for part in topic.partitions:
            wanted.append((topic, part, name))
    isolation = FOLLOWER if replica_id >= 0 else getattr(request, "isolation_level", READ_UNCOMMITTED)
    while True:
        responses, total, tps = _read_all(ctx, wanted, max_bytes, replica_id, getattr(request, "rack_id", "") or "",
                                          isolation)
        remaining = deadline - time.monotonic()
        if total >= min_bytes or remaining <= 0 or not tps or any(
            p["error_code"] for t in responses for p in t["partitions"]
        ):
            break
        await ctx.broker.replicas.wait_for_data(tps, int(remaining * 1000))
    if replica_id >= 0:
        quota = ctx.broker.replicas.leader_quota
        quota.record(sum(len(p["records"]) for t in responses for p in t["partitions"]
                         if quota.is_throttled(TopicPartition(t["topic"], p["partition_index"]))))
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses,
            "node_endpoints": leader_endpoints(ctx, [p.get("current_leader") for t in responses for p in t["partitions"]])}


def _read_all(ctx: RequestContext, wanted: list[tuple[Any, Any, str | None]], max_bytes: int, replica_id: int,
              client_rack: str, isolation: int) -> tuple[list[dict[str, Any]], int, list[Any]]:
    total = 0
    by_topic: dict[int, dict[str, Any]] = {}
    tps = []
    for topic, part, name in wanted:
        entry = by_topic.setdefault(id(topic), {"topic": name or "", "topic_id": getattr(topic, "topic_id", None),
                                                "partitions": []})
        result: dict[str, Any] = {"partition_index": part.partition, "error_code": ErrorCode.none,
                                  "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                                  "aborted_transactions": None, "preferred_read_replica": -1, "records": b""}
        entry["partitions"].append(result)
        partition: Partition | None = None
        try:
            partition = partition_for(ctx, name, part.partition)
            if replica_id >= 0 or ctx.api_version < FOLLOWER_FETCH_VERSION:
                partition.require_leader()
            partition.check_leader_epoch(getattr(part, "current_leader_epoch", -1))
            preferred = ctx.broker.replicas.preferred_read_replica(partition, client_rack, part.fetch_offset)
            if preferred >= 0:
                result.update(preferred_read_replica=preferred, high_watermark=partition.high_watermark,
                              last_stable_offset=partition.last_stable_offset, log_start_offset=partition.log.log_start_offset)
                continue
            if replica_id >= 0:
                diverging = _diverging_epoch(partition, part)
                if diverging is not None:
                    result.update(diverging_epoch=diverging, high_watermark=partition.high_watermark,
                                  log_start_offset=partition.log.log_start_offset)
                    continue
            limit = min(part.partition_max_bytes, max(max_bytes - total, 0))
            if replica_id >= 0 and ctx.broker.replicas.leader_quota.should_throttle(partition.tp, replica_id in partition.isr):
                records = b""
            else:
                records = partition.read(part.fetch_offset, limit, min_one_batch=total == 0,
                                         isolation=isolation) if limit or total == 0 else b""
            if replica_id >= 0:
                ctx.broker.replicas.follower_fetched(partition, replica_id, part.fetch_offset)
        except Exception as exc:
            result["error_code"], _ = error_of(exc)
            if partition is not None and result["error_code"] == ErrorCode.offset_out_of_range:
                result["high_watermark"] = partition.high_watermark
                result["log_start_offset"] = partition.log.log_start_offset
            result["current_leader"] = current_leader(ctx, name, part.partition, result["error_code"])
            continue
        tps.append(partition.tp)
        total += len(records)
        stable = partition.last_stable_offset
        result.update(records=records, high_watermark=partition.high_watermark,
                      last_stable_offset=stable, log_start_offset=partition.log.log_start_offset)
        if isolation == READ_COMMITTED:
            # Only what overlaps the records returned: from the fetch offset to the last stable offset.
            result["aborted_transactions"] = [
                {"producer_id": t.producer_id, "first_offset": t.first_offset}
                for t in partition.log.aborted_txns(part.fetch_offset, stable)] if records else []
    return list(by_topic.values()), total, tps


def _diverging_epoch(partition: Partition, part: Any) -> dict[str, int] | None:
    """Where our log stops agreeing with a follower's last fetched epoch, or None if it agrees (Kafka's fetchRecords)."""
    last_epoch = getattr(part, "last_fetched_epoch", -1)
    if last_epoch < 0:
        return None
    epoch, end_offset = partition.log.end_offset_for_epoch(last_epoch)
    if epoch < last_epoch or end_offset < part.fetch_offset:
        return {"epoch": epoch, "end_offset": end_offset}
    return None
