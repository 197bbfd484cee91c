"""Offsets looked up by ListOffsets at each partition's leader (Kafka's OffsetFetcher).

Two uses: the consumer's lookups (``beginning_offsets``, ``end_offsets``,
``offsets_for_times``, ``seek_to_*``, ``position``), which retry retriable
errors until their timeout; and the fetcher's offset resets, which send one
request per leader (:meth:`OffsetLookups.list_offsets_from`) and fold its
errors into their own backoff.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable, Mapping

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError, KafkaTimeoutError
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import STALE_METADATA, Cluster

__all__ = ["EARLIEST", "LATEST", "OffsetLookups", "reset_timestamp"]

#: ListOffsets' special timestamps.
LATEST, EARLIEST = -1, -2


def reset_timestamp(strategy: str | None) -> int:
    """The ListOffsets timestamp of an ``auto.offset.reset`` strategy: "earliest", or else the latest offset."""
    return EARLIEST if strategy == "earliest" else LATEST


class OffsetLookups:
    """ListOffsets requests, with the consumer's isolation level (read_committed ends at the last stable offset)."""

    def __init__(self, config: Mapping[str, Any], cluster: Cluster) -> None:
        self.cluster = cluster
        self._isolation = 1 if config["isolation.level"] == "read_committed" else 0
        self._backoff_s = config["retry.backoff.ms"] / 1000

    async def beginning_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int) -> dict[TopicPartition, int]:
        found = await self.list_offsets({tp: EARLIEST for tp in partitions}, timeout_ms)
        return {tp: offset for tp, (offset, _, _) in found.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int) -> dict[TopicPartition, int]:
        found = await self.list_offsets({tp: LATEST for tp in partitions}, timeout_ms)
        return {tp: offset for tp, (offset, _, _) in found.items()}

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int], timeout_ms: int
                                ) -> dict[TopicPartition, tuple[int, int] | None]:
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp for {tp.topic}-{tp.partition} must be an int >= 0, not {ts!r}")
        found = await self.list_offsets(dict(timestamps), timeout_ms)
        return {tp: None if offset < 0 else (offset, ts) for tp, (offset, ts, _) in found.items()}

    async def list_offsets(self, query: Mapping[TopicPartition, int], timeout_ms: int
                           ) -> dict[TopicPartition, tuple[int, int, int]]:
        """``{tp: (offset, timestamp, leader_epoch)}`` by ListOffsets at each leader, retrying retriable errors."""
        deadline = time.monotonic() + timeout_ms / 1000
        remaining = dict(query)
        result: dict[TopicPartition, tuple[int, int, int]] = {}
        last_error: Exception | None = None
        refresh = any(self.cluster.leader(tp) < 0 for tp in remaining)
        while remaining:
            try:
                if refresh:
                    await asyncio.wait_for(self.cluster.refresh({tp.topic for tp in remaining}),
                                           max(deadline - time.monotonic(), 0.001))
                self._check_topics(remaining)
                by_node: dict[int, dict[TopicPartition, int]] = {}
                for tp, ts in remaining.items():
                    by_node.setdefault(self.cluster.leader(tp), {})[tp] = ts
                if -1 in by_node:
                    last_error = KafkaError(ErrorCode.leader_not_available, "no leader known")
                    by_node.pop(-1)
                answers = await asyncio.wait_for(
                    asyncio.gather(*(self.list_offsets_from(node, q) for node, q in by_node.items()),
                                   return_exceptions=True),
                    max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                raise KafkaTimeoutError(f"offsets not found within {timeout_ms} ms"
                                        + (f" (last error: {last_error})" if last_error else "")) from None
            except KafkaError as exc:
                if not exc.retriable or exc.code == ErrorCode.unknown_topic_or_partition:
                    raise
                answers, last_error = [], exc
            for answer in answers:
                if isinstance(answer, KafkaError) and answer.retriable:
                    last_error = answer
                    continue
                if isinstance(answer, BaseException):
                    raise answer
                found, _, errors = answer
                if errors:
                    raise next(iter(errors.values()))
                for tp, value in found.items():
                    result[tp] = value
                    remaining.pop(tp, None)
            if remaining:
                if time.monotonic() + self._backoff_s >= deadline:
                    raise KafkaTimeoutError(f"offsets not found within {timeout_ms} ms"
                                            + (f" (last error: {last_error})" if last_error else ""))
                await asyncio.sleep(self._backoff_s)
                refresh = True
        return result

    def _check_topics(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            code = self.cluster.topic_errors.get(tp.topic)
            if code == ErrorCode.unknown_topic_or_partition:
                raise KafkaError(code, f"topic {tp.topic!r} does not exist")
            if code is not None and not code.retriable:
                raise KafkaError(code, f"metadata of topic {tp.topic!r}")
            known = self.cluster.partitions.get(tp.topic)
            if known is not None and tp.partition not in known:
                raise KafkaError(ErrorCode.unknown_topic_or_partition, f"topic {tp.topic!r} has no partition {tp.partition}")

    async def list_offsets_from(self, node: int, query: Mapping[TopicPartition, int]) -> tuple[
            dict[TopicPartition, tuple[int, int, int]], set[TopicPartition], dict[TopicPartition, KafkaError]]:
        """One ListOffsets: (answers, partitions worth retrying, partitions that failed for good)."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, ts in query.items():
            info = self.cluster.partitions.get(tp.topic, {}).get(tp.partition)
            topics.setdefault(tp.topic, []).append({"partition_index": tp.partition, "timestamp": ts, "max_num_offsets": 1,
                                                    "current_leader_epoch": info.leader_epoch if info else -1})
        conn = await self.cluster.connection(node)
        response = await conn.request(ApiKey.LIST_OFFSETS, {
            "replica_id": -1, "isolation_level": self._isolation,
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]})
        found: dict[TopicPartition, tuple[int, int, int]] = {}
        retry: set[TopicPartition] = set()
        errors: dict[TopicPartition, KafkaError] = {}
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if tp not in query:
                    continue
                if part.error_code == ErrorCode.none:
                    found[tp] = (part.offset, part.timestamp, getattr(part, "leader_epoch", -1))
                elif part.error_code in STALE_METADATA or part.error_code.retriable:
                    retry.add(tp)
                else:
                    errors[tp] = KafkaError(part.error_code, f"ListOffsets for {tp.topic}-{tp.partition}")
        retry |= set(query) - set(found) - set(errors)
        return found, retry, errors
