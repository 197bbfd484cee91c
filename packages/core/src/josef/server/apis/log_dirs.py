"""DescribeLogDirs and AlterReplicaLogDirs: where this broker keeps each partition's log, and moving logs between ``log.dirs``.

The storage does the file work (:meth:`josef.log.LogStorage.log_dirs`,
:meth:`~josef.log.LogStorage.dir_of`, :meth:`~josef.log.LogStorage.move`);
those calls touch the disk, so they run in worker threads. Offset lag is
always 0 and no log is ever a future one in the answers: a move finishes
before AlterReplicaLogDirs answers, so there is no future replica to report.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import anyio.to_thread
from kio.schema.errors import ErrorCode

from josef.log import LogDirError, LogDirInfo, LogDirNotFoundError, LogStorage
from josef.replication.partition import Partition
from josef.protocol.topic_partition import TopicPartition
from josef.server.dispatch import RequestContext


def _layout(storage: LogStorage, tps: list[TopicPartition]) -> tuple[list[LogDirInfo], dict[TopicPartition, str]]:
    """The log dirs and the dir of each partition, in one trip to a worker thread.

    A partition whose log cannot be found (its directory failed) is left
    out: Kafka lists no partitions under an offline directory.
    """
    dirs = {}
    for tp in tps:
        try:
            dirs[tp] = storage.dir_of(tp)
        except KeyError:
            continue
    return storage.log_dirs(), dirs


async def describe_log_dirs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """Every log dir with the hosted partitions in it: all of them for null ``topics``, else those asked for (others are left out, as Kafka does)."""
    hosted = ctx.broker.replicas.partitions
    if request.topics is None:
        wanted = list(hosted)
    else:
        asked = (TopicPartition(str(t.topic), p) for t in request.topics for p in t.partitions)
        wanted = list(dict.fromkeys(tp for tp in asked if tp in hosted))
    sizes = {tp: hosted[tp].log.size_bytes for tp in wanted}
    infos, dirs = await anyio.to_thread.run_sync(_layout, ctx.broker.storage, wanted)
    by_dir: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for tp in sorted(dirs):
        by_dir[dirs[tp]][tp.topic].append({"partition_index": tp.partition, "partition_size": sizes[tp],
                                           "offset_lag": 0, "is_future_key": False})
    results = []
    for info in infos:
        if info.error is not None:
            results.append({"error_code": ErrorCode.kafka_storage_error, "log_dir": info.path, "topics": (),
                            "total_bytes": -1, "usable_bytes": -1, "is_cordoned": False})
            continue
        topics = [{"name": name, "partitions": partitions} for name, partitions in by_dir[info.path].items()]
        results.append({"error_code": ErrorCode.none, "log_dir": info.path, "topics": topics,
                        "total_bytes": info.total_bytes, "usable_bytes": info.usable_bytes, "is_cordoned": False})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results": results}


async def alter_replica_log_dirs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """Move each requested partition's log into its requested dir, one after another; an error per partition."""
    online = {info.path: info for info in await anyio.to_thread.run_sync(ctx.broker.storage.log_dirs)}
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in request.dirs:
        info = online.get(os.path.abspath(entry.path))
        for topic in entry.topics:
            for index in topic.partitions:
                code = await _move(ctx, TopicPartition(str(topic.name), index), info)
                results[str(topic.name)].append({"partition_index": index, "error_code": code})
    return {"throttle_time": 0, "results": [
        {"topic_name": name, "partitions": partitions} for name, partitions in results.items()]}


async def _move(ctx: RequestContext, tp: TopicPartition, info: LogDirInfo | None) -> ErrorCode:
    """Kafka's checks in Kafka's order: the dir exists, is online, the replica is here; then the move."""
    if info is None:
        return ErrorCode.log_dir_not_found
    if info.error is not None:
        return ErrorCode.kafka_storage_error
    partition: Partition | None = ctx.broker.replicas.get(tp)
    if partition is None:
        topic = ctx.broker.image.topics.get(tp.topic)
        known = topic is not None and tp.partition in topic.partitions
        return ErrorCode.replica_not_available if known else ErrorCode.unknown_topic_or_partition
    try:
        await ctx.broker.replicas.move_log(partition, info.path)
    except LogDirNotFoundError:
        return ErrorCode.log_dir_not_found
    except KeyError:  # the log went away meanwhile (its topic was deleted)
        return ErrorCode.replica_not_available
    except LogDirError:
        return ErrorCode.kafka_storage_error
    return ErrorCode.none
