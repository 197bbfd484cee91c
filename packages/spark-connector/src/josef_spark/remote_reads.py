"""remoteReads=direct: the records below the brokers' local logs, read by the executors from remote storage.

A tiered topic (KIP-405) keeps its old segments in object storage, and a
broker serves a fetch of them by reading them from there. A backfill over a
year of data needs no broker in between: the driver reads the remote log
metadata (``__remote_log_metadata``, through an ordinary consumer) of the
partitions the query reads and plans what copied segments hold as tasks of
their own, of up to :data:`TASK_BYTES` of segments each; the executors open
the remote storage the brokers use, from the same keys, fetch the segments'
batches with the offset index, check them and decode them with the
consumer's own code, so rows and schema are those of a read through the
brokers. Offsets beyond what is remote are read through the brokers.

Which copy holds an offset: segments whose copy finished
(COPY_SEGMENT_FINISHED), in offset order, a copy that reaches further
preferred where copies overlap (a new leader's copy beside a deposed
one's). Brokers copy only records below the high watermark and the last
stable offset, committed records that every copy holds alike, as long as
no unclean leader election (``unclean.leader.election.enable``, off by
default) threw committed records away.

A segment that retention deleted between planning and reading, or any
other failed remote read, leaves the rest of the task to the brokers, which
judge lost data as for any read (failOnDataLoss). With
``kafka.isolation.level=read_committed`` aborted transactions come from the
segments' transaction indexes, searched from the task's first segment on as
a broker searches them; where that search cannot end in remote storage (no
aborted transaction after the task's records says that every transaction
there is settled) the task reads through the brokers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs
import pyarrow as pa

from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import RemoteLogSegmentMetadata, RemoteLogSegmentState, RemoteStorageManager
from josef_client import Admin
from josef_client.records import FetchedPartition
from josef_client.remote_log_metadata import remote_log_metadata
from josef_spark.options import ReadOptions, RemoteStorageOptions
from josef_spark.planning import OffsetRange

log = logging.getLogger(__name__)

#: The most bytes of remote segments one task reads (Spark's default spark.sql.files.maxPartitionBytes): enough
#: that per-task costs vanish, few enough that a backfill spreads over the executors.
TASK_BYTES = 128 << 20
#: Bytes of batches fetched from remote storage at once, and the bound of a task's cache of segment indexes.
READ_BYTES = 8 << 20
INDEX_CACHE_BYTES = 32 << 20


@attrs.frozen
class RemotePiece:
    """Offsets of one partition that remote segments hold: the unit of work of a task that reads them itself.

    ``segments`` are those holding the range, in offset order, then (for
    read_committed) the rest of the partition's remote segments, whose
    transaction indexes may tell of transactions aborted in the range.
    """

    range: OffsetRange
    segments: tuple[RemoteLogSegmentMetadata, ...]


def remote_segments(options: ReadOptions, admin: Admin, partitions: Iterable[tuple[str, int]],
                    group_id: str) -> dict[tuple[str, int], list[RemoteLogSegmentMetadata]]:
    """Each partition's readable remote segments, one after the other from its lowest remote offset (see
    :func:`chain`), from ``__remote_log_metadata`` read to its current end on the driver."""
    found = remote_log_metadata({**options.client_config, "bootstrap.servers": options.bootstrap_servers,
                                 "group.id": group_id}, partitions, admin)
    chained = {tp: chain(cache.list_segments()) for tp, cache in found.items()}
    return {tp: segments for tp, segments in chained.items() if segments}


def chain(segments: Iterable[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
    """Finished segments that follow one another from the lowest remote offset, each the copy that reaches furthest
    among those holding the offset after its predecessor; the chain stops at the first offset no copy holds."""
    ordered = sorted((m for m in segments if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED),
                     key=lambda m: m.start_offset)
    out: list[RemoteLogSegmentMetadata] = []
    i = 0
    position = ordered[0].start_offset if ordered else 0
    while i < len(ordered):
        best = None
        while i < len(ordered) and ordered[i].start_offset <= position:
            if ordered[i].end_offset >= position and (best is None or ordered[i].end_offset > best.end_offset):
                best = ordered[i]
            i += 1
        if best is None:
            break
        out.append(best)
        position = best.end_offset + 1
    return out


def split(ranges: Sequence[OffsetRange], remote: dict[tuple[str, int], list[RemoteLogSegmentMetadata]],
          read_committed: bool) -> list[OffsetRange | RemotePiece]:
    """``ranges`` with the offsets that remote segments hold cut out into :class:`RemotePiece`\\ s of at most
    :data:`TASK_BYTES` of segments (at least one segment each); the offsets after them stay ranges for the brokers."""
    out: list[OffsetRange | RemotePiece] = []
    for r in ranges:
        segments = remote.get((r.topic, r.partition), [])
        if not segments or not segments[0].start_offset <= r.start <= segments[-1].end_offset:
            out.append(r)
            continue
        remote_end = min(r.end, segments[-1].end_offset + 1)
        holding = [m for m in segments if m.end_offset >= r.start and m.start_offset < remote_end]
        start, piece, size = r.start, [], 0
        for m in holding:
            if piece and size + m.segment_size_in_bytes > TASK_BYTES:
                out.append(_piece(r, start, piece, segments, read_committed))
                start, piece, size = piece[-1].end_offset + 1, [], 0
            piece.append(m)
            size += m.segment_size_in_bytes
        out.append(_piece(r, start, piece, segments, read_committed, end=remote_end))
        if remote_end < r.end:
            out.append(OffsetRange(r.topic, r.partition, remote_end, r.end))
    return out


def _piece(r: OffsetRange, start: int, piece: list[RemoteLogSegmentMetadata], segments: list[RemoteLogSegmentMetadata],
           read_committed: bool, end: int | None = None) -> RemotePiece:
    end = piece[-1].end_offset + 1 if end is None else end
    rest = tuple(m for m in segments if m.start_offset > piece[-1].end_offset) if read_committed else ()
    return RemotePiece(OffsetRange(r.topic, r.partition, start, end), (*piece, *rest))


def read_piece(options: ReadOptions, piece: RemotePiece, max_records: int,
               to_arrow: Callable[[list[Any]], pa.RecordBatch],
               through_brokers: Callable[[OffsetRange], Iterator[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` (on an executor) from remote storage, as Arrow batches of up to ``max_records``
    made by ``to_arrow``; from the first offset remote storage cannot give on, through the brokers
    (``through_brokers``)."""
    from josef.log import LogDirError
    from josef_storage_tiered.remote_reader import IndexCache, aborted_txns, read_batches

    r = piece.range
    read_committed = options.client_config.get("isolation.level", "read_uncommitted") == "read_committed"
    storage = open_storage(options.remote_storage)
    indexes = IndexCache(storage, INDEX_CACHE_BYTES)
    tp = TopicPartition(r.topic, r.partition)
    position = r.start
    try:
        for i, segment in enumerate(piece.segments):
            if position >= r.end or segment.start_offset > position:
                break
            if segment.end_offset < position:
                continue
            aborted: list[tuple[int, int]] = []
            if read_committed:
                found, complete = aborted_txns(indexes, list(piece.segments[i:]), position, r.end)
                if not complete:
                    log.info("%s-%d: whether transactions of offsets %d..%d were aborted is not in remote storage "
                             "yet: reading them through the brokers", r.topic, r.partition, position, r.end - 1)
                    break
                aborted = [(txn.producer_id, txn.first_offset) for txn in found]
            while position <= segment.end_offset and position < r.end:
                data = read_batches(storage, indexes, segment, position, READ_BYTES, r.end, True)
                if not data:
                    position = segment.end_offset + 1
                    break
                fetched = FetchedPartition(tp, data, position, aborted_transactions=aborted,
                                           read_committed=read_committed)
                while records := fetched.take(max_records):
                    if records[-1].offset >= r.end:
                        records = [record for record in records if record.offset < r.end]
                    if records:
                        yield to_arrow(records)
                position = max(position + 1, fetched.next_offset)
    except LogDirError as exc:
        log.warning("%s-%d: reading offset %d from remote storage failed (%s): reading on through the brokers",
                    r.topic, r.partition, position, exc)
    finally:
        storage.close()
    if position < r.end:
        yield from through_brokers(OffsetRange(r.topic, r.partition, position, r.end))


def open_storage(remote: RemoteStorageOptions | None) -> RemoteStorageManager:
    """The brokers' remote storage, opened on an executor from the keys the query was given."""
    from josef_storage_tiered.remote import open_backend

    assert remote is not None
    return open_backend(remote.class_name, remote.settings)
