"""Fetch: whole batches below the high watermark, with long polling on max_wait_ms/min_bytes.

A fetch naming a replica (``replica_state.replica_id``, ``replica_id``
before v15) comes from a follower: it is served up to the log end, its
fetch offset is the follower's log end offset (which moves the high
watermark and the ISR), and a ``last_fetched_epoch`` that our log does not
end the same way is answered with ``diverging_epoch`` instead of records,
so the follower cuts its log (KIP-320). A follower outside the ISR gets no
records of a partition in ``leader.replication.throttled.replicas`` while
the leader throttle is exceeded, and what throttled partitions send counts
towards it (KIP-73, :mod:`josef.replication.replication_quota`).

A partition this broker does not lead is answered NOT_LEADER_OR_FOLLOWER
with the leader it knows and its endpoint (KIP-951), so clients go there
without a metadata round trip. Consumers from v11 on may fetch from
followers (KIP-392), which serve up to their own high watermark; with
``replica.selector.class`` set, a leader sends a consumer that names its
rack to an in-sync replica there (``preferred_read_replica``).

Fetch sessions (KIP-227, :mod:`josef.server.fetch_session`) let a fetcher
send only the partitions whose parameters changed and get back only the
partitions that changed; a fetch of session epoch -1 is answered in full,
without a session, as before.

The request is read and the response written by
:mod:`josef.protocol.fetch_codec`, not kio: this handler runs for every
poll of every consumer and follower, over every partition they read, so
its per-partition work is kept to a few dictionary lookups and one
``struct`` pack. A waiting fetch is woken only by a partition it reads
gaining something it may see (:meth:`josef.replication.replica_manager.ReplicaManager.wait_for_data`),
and then reads only the partitions that woke it again.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from josef.log import OffsetMovedToTieredStorageError
from josef.metrics.topics import BYTES_OUT, FAILED_FETCH, REPLICATION_BYTES_OUT, TOTAL_FETCH
from josef.replication.partition import FOLLOWER, READ_COMMITTED, Partition, PartitionError
from josef.protocol.fetch_codec import TOPIC_ID_VERSION, FetchPartition, FetchRequest, response_encoder
from josef.protocol.topic_partition import TopicPartition
from josef.server.apis.common import (
    current_leader,
    error_of,
    leader_endpoints,
    partition_for,
    topic_name,
    topic_name_of_id,
)
from josef.server.dispatch import Encoded, RequestContext
from josef.server.fetch_session import CachedPartition, FetchSession, must_respond, new_context


#: Consumers name their rack and may fetch from followers from this Fetch version on (KIP-392).
FOLLOWER_FETCH_VERSION = 11

_NONE = ErrorCode.none
#: ``throttle_time_ms`` is the first field of every FetchResponse josef answers (v4+).
THROTTLE_AT = (0, 0)


class _Result:
    """One partition's answer, as the response encoder takes it."""

    __slots__ = ("error_code", "high_watermark", "last_stable_offset", "log_start_offset", "records", "aborted",
                 "preferred_read_replica", "diverging_epoch", "current_leader", "tp", "remote")

    def __init__(self, high_watermark: int = -1, last_stable_offset: int = -1, log_start_offset: int = -1,
                 records: Any = b"", error_code: int = _NONE) -> None:
        self.error_code = error_code
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.records = records
        self.aborted: list[tuple[int, int]] | None = None
        self.preferred_read_replica = -1
        self.diverging_epoch: tuple[int, int] | None = None
        self.current_leader: tuple[int, int] | None = None
        #: The partition whose changes can complete this fetch; None for one answered with an error.
        self.tp: TopicPartition | None = None
        #: A consumer's read below the local log start, to answer from remote storage: (partition, offset, max bytes).
        self.remote: tuple[Partition, int, int] | None = None


async def fetch(ctx: RequestContext, request: FetchRequest) -> Encoded:
    deadline = time.monotonic() + request.max_wait_ms / 1000
    replica_id = request.replica_id
    min_bytes, max_bytes = request.min_bytes, request.max_bytes
    isolation = FOLLOWER if replica_id >= 0 else request.isolation_level
    rack = request.rack_id
    names = [topic_name(ctx, topic) for topic in request.topics]
    sessions = ctx.broker.fetch_sessions
    context = new_context(sessions, request, names, replica_id >= 0, _now_ms(), ctx.api_version >= TOPIC_ID_VERSION,
                          lambda topic_id: topic_name_of_id(ctx, topic_id))
    if context.error:
        return Encoded(response_encoder(ctx.api_version).response([], 0, error_code=context.error), THROTTLE_AT)
    wanted = context.wanted
    results: list[_Result] = [None] * len(wanted)  # type: ignore[list-item]
    reading = range(len(wanted))
    total = 0
    replicas = ctx.broker.replicas
    hosted = replicas.partitions
    broker_id = ctx.broker.node_id
    # A consumer's partition with nothing new is answered from its state alone: no storage call.
    refused = request.refused_topics
    quick = replica_id < 0 and not rack and not refused
    committed = isolation == READ_COMMITTED
    any_replica = ctx.api_version >= FOLLOWER_FETCH_VERSION
    #: Consumers' reads to answer from remote storage (below the local log start of a tiered partition).
    remote: list[_Result] = []
    while True:
        failed = False
        offline = replicas.offline
        for i in reading:
            name, _, part = wanted[i]
            previous = results[i]
            if previous is not None:
                total -= len(previous.records)
            if quick and name is not None:
                tp = TopicPartition(name, part.partition)
                partition = hosted.get(tp)
                if partition is not None:
                    high_watermark = partition.high_watermark
                    # The last stable offset costs a look at the open transactions: only when it decides.
                    visible = partition.last_stable_offset if committed else high_watermark
                    if (part.fetch_offset == visible
                            and (any_replica or partition.leader_id == broker_id)
                            and part.current_leader_epoch in (-1, partition.leader_epoch)
                            and part.last_fetched_epoch <= partition.leader_epoch
                            and not (offline and tp in offline)):
                        stable = visible if committed else partition.last_stable_offset
                        result = results[i] = _Result(high_watermark, stable, partition.log.log_start_offset)
                        result.tp = tp
                        if committed:
                            result.aborted = []
                        continue
            result = results[i] = _read(ctx, name, part, max(max_bytes - total, 0), total == 0, replica_id, rack, isolation,
                                        refused)
            total += len(result.records)
            failed = failed or result.error_code != _NONE
            if result.remote is not None:
                remote.append(result)
        if remote:
            for other in remote[1:]:
                other.remote = None
            total += await _read_remote(ctx, remote[0], max(max_bytes - total, 0), total == 0, committed)
            break
        remaining = deadline - time.monotonic()
        if total >= min_bytes or remaining <= 0 or failed:
            break
        waiting = {r.tp: i for i, r in enumerate(results) if r.tp is not None}
        if not waiting:
            break
        woken = await replicas.wait_for_data(waiting, int(remaining * 1000), followers=replica_id >= 0)
        # Let the requests already waiting on the event loop (appends, most often) run before reading:
        # under load one answer then carries what several appends wrote, instead of one answer each.
        await anyio.sleep(0)
        reading = sorted(waiting[tp] for tp in woken if tp in waiting)
    if replica_id >= 0:
        quota = replicas.leader_quota
        quota.record(sum(len(r.records) for r in results if r.tp is not None and quota.is_throttled(r.tp)))
    answered = list(zip(wanted, results))
    session_id = context.response_session_id
    session = context.session
    if session is not None:
        if session.epoch != context.expected_epoch:  # a request of the same session came meanwhile
            return Encoded(response_encoder(ctx.api_version).response(
                [], 0, error_code=ErrorCode.invalid_fetch_session_epoch, session_id=session.id), THROTTLE_AT)
        answered = _changed(session, answered)
    elif context.create:
        cached = {}
        for (name, topic_id, part), r in answered:
            key = (topic_id if ctx.api_version >= TOPIC_ID_VERSION else name, part.partition)
            cached[key] = CachedPartition(name, topic_id, part, r.high_watermark, r.log_start_offset)
        session_id = sessions.create(_now_ms(), replica_id >= 0, ctx.api_version >= TOPIC_ID_VERSION, cached)
    # Partitions' bytes and errors are counted one by one only when there are some: not for a caught-up poll.
    return _encode(ctx, answered, session_id, replica_id >= 0, bool(total or failed or remote))


def _changed(session: FetchSession, answered: list[tuple[tuple[str | None, Any, FetchPartition], _Result]]
             ) -> list[tuple[tuple[str | None, Any, FetchPartition], _Result]]:
    """The partitions an incremental response names; they move to the end of the session's order (round robin)."""
    partitions = session.partitions
    changed = []
    for (name, topic_id, part), r in answered:
        key = (topic_id if session.uses_topic_ids else name, part.partition)
        cached = partitions.get(key)
        if cached is None or must_respond(cached, len(r.records), r.high_watermark, r.log_start_offset, r.error_code,
                                          r.preferred_read_replica, r.diverging_epoch is not None):
            changed.append(((name, topic_id, part), r))
            if cached is not None:
                del partitions[key]
                partitions[key] = cached
    return changed


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _read(ctx: RequestContext, name: str | None, part: FetchPartition, budget: int, first: bool, replica_id: int,
          client_rack: str, isolation: int, refused: frozenset[str]) -> _Result:
    """One partition's answer; ``budget`` is what is left of the request's max_bytes, ``first`` whether
    nothing was read before it (so at least one batch is returned, KIP-74)."""
    partition: Partition | None = None
    try:
        if name in refused:
            raise PartitionError(ErrorCode.topic_authorization_failed)
        partition = partition_for(ctx, name, part.partition)
        if replica_id >= 0 or ctx.api_version < FOLLOWER_FETCH_VERSION:
            partition.require_leader()
        if part.current_leader_epoch != -1:
            partition.check_leader_epoch(part.current_leader_epoch)
        partition.check_epoch_seen(part.last_fetched_epoch)
        replicas = ctx.broker.replicas
        high_watermark = partition.high_watermark
        log = partition.log
        if client_rack:
            preferred = replicas.preferred_read_replica(partition, client_rack, part.fetch_offset)
            if preferred >= 0:
                result = _Result(high_watermark, partition.last_stable_offset, log.log_start_offset)
                result.preferred_read_replica = preferred
                return result
        offset = part.fetch_offset
        if replica_id >= 0:
            diverging = _diverging_epoch(partition, part)
            if diverging is not None:
                result = _Result(high_watermark, -1, log.log_start_offset)
                result.diverging_epoch = diverging
                return result
            if replicas.leader_quota.should_throttle(partition.tp, replica_id in partition.isr):
                records: Any = b""
            else:
                limit = min(part.partition_max_bytes, budget)
                records = partition.read(offset, limit, first, FOLLOWER, zero_copy=True) if limit or first else b""
            replicas.follower_fetched(partition, replica_id, offset)
            high_watermark = partition.high_watermark
            stable = partition.last_stable_offset
        else:
            stable = partition.last_stable_offset
            visible = stable if isolation == READ_COMMITTED else high_watermark
            if offset == visible:
                records = b""  # caught up: nothing to read, and nothing out of range
            else:
                limit = min(part.partition_max_bytes, budget)
                try:
                    records = partition.read(offset, limit, first, isolation, zero_copy=True) if limit or first else b""
                except OffsetMovedToTieredStorageError:
                    result = _Result(high_watermark, stable, log.log_start_offset)
                    result.remote = (partition, offset, part.partition_max_bytes)
                    result.aborted = [] if isolation == READ_COMMITTED else None
                    return result
    except Exception as exc:
        code, _ = error_of(exc)
        result = _Result(error_code=code)
        if partition is not None and code == ErrorCode.offset_out_of_range:
            result.high_watermark = partition.high_watermark
            result.log_start_offset = partition.log.log_start_offset
        leader = current_leader(ctx, name, part.partition, code)
        result.current_leader = (leader["leader_id"], leader["leader_epoch"])
        return result
    result = _Result(high_watermark, stable, log.log_start_offset, records)
    result.tp = partition.tp
    if isolation == READ_COMMITTED:
        # Only what overlaps the records returned: from the fetch offset to the last stable offset.
        result.aborted = [(t.producer_id, t.first_offset) for t in log.aborted_txns(offset, stable)] if records else []
    return result


async def _read_remote(ctx: RequestContext, result: _Result, budget: int, first: bool, committed: bool) -> int:
    """Answer a consumer's read below the local log start from remote storage; returns the bytes read.

    As Kafka's DelayedRemoteFetch: one partition per fetch is read remotely
    (the caller answers any other such partition without records, and the
    consumer asks again), waiting at most ``remote.fetch.max.wait.ms``,
    after which it too is answered without records. The read returns at
    least one batch when nothing was read before it (``first``, KIP-74).
    """
    partition, offset, partition_max_bytes = result.remote  # type: ignore[misc]
    result.remote = None
    limit = min(partition_max_bytes, budget)
    with anyio.move_on_after(ctx.broker.config["remote.fetch.max.wait.ms"] / 1000):
        try:
            remote = await partition.read_remote(offset, limit, first, committed)
        except Exception as exc:
            result.error_code, _ = error_of(exc)
            return 0
        result.records = remote.records
        if committed:
            result.aborted = [(t.producer_id, t.first_offset) for t in remote.aborted_txns]
    return len(result.records)


def _encode(ctx: RequestContext, answered: list[tuple[tuple[str | None, Any, FetchPartition], _Result]],
            session_id: int, follower: bool, eventful: bool) -> Encoded:
    """The response: consecutive partitions of one topic under one topic entry, as Kafka groups them."""
    encoder = response_encoder(ctx.api_version)
    out: list[Any] = []
    n_topics = 0
    meters = ctx.broker.topic_metrics
    bytes_meter = REPLICATION_BYTES_OUT if follower else BYTES_OUT
    i, n = 0, len(answered)
    while i < n:
        (name, topic_id, _), _ = answered[i]
        j = i + 1
        while j < n and answered[j][0][0] == name and answered[j][0][1] == topic_id:
            j += 1
        encoder.topic(out, name, topic_id, j - i)
        size = failed = 0
        for (_, _, part), r in answered[i:j]:
            encoder.partition(out, part.partition, r.error_code, r.high_watermark, r.last_stable_offset,
                              r.log_start_offset, r.records, r.aborted, r.preferred_read_replica, r.diverging_epoch,
                              r.current_leader)
        if eventful:
            for _, r in answered[i:j]:
                if r.records:
                    size += len(r.records)
                if r.error_code != _NONE:
                    failed += 1
        encoder.topic_end(out)
        if name is not None:
            counts = meters.of(name)
            counts[bytes_meter] += size
            counts[TOTAL_FETCH] += j - i
            counts[FAILED_FETCH] += failed
        n_topics += 1
        i = j
    leaders = [{"leader_id": r.current_leader[0], "leader_epoch": r.current_leader[1]}
               for _, r in answered if r.current_leader is not None]
    endpoints = [(e["node_id"], e["host"], e["port"], e["rack"]) for e in leader_endpoints(ctx, leaders)] if leaders else ()
    return Encoded(encoder.response(out, n_topics, session_id=session_id, node_endpoints=endpoints), THROTTLE_AT)


def _diverging_epoch(partition: Partition, part: FetchPartition) -> tuple[int, int] | None:
    """Where our log stops agreeing with a follower's last fetched epoch, or None if it agrees (Kafka's fetchRecords)."""
    last_epoch = part.last_fetched_epoch
    if last_epoch < 0:
        return None
    epoch, end_offset = partition.log.end_offset_for_epoch(last_epoch)
    if epoch < last_epoch or end_offset < part.fetch_offset:
        return (epoch, end_offset)
    return None
