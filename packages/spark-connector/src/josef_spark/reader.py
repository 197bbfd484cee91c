"""Batch and streaming readers: ranges planned on the driver, read on executors into Arrow batches.

Each Spark input partition is one :class:`~josef_spark.planning.OffsetRange`
read with josef's consumer (assigned, not in a group, so nothing is
committed to the cluster: the checkpoint is the only record of progress, as
with Spark's Kafka source). Records come back as Arrow record batches built
column by column, which Spark takes without converting row by row.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from josef_client import Consumer, ConsumerRecord, OffsetOutOfRangeError, TopicPartition
from josef_spark.options import ReadOptions
from josef_spark.planning import OffsetRange, Offsets, Planner, data_lost, offset_ranges, rate_limit

log = logging.getLogger(__name__)

#: ListOffsets' "earliest local" (KIP-405): the first offset a broker holds on its own disk.
EARLIEST_LOCAL = -4
#: Records per poll, and so per Arrow batch: large enough that per-batch costs vanish.
MAX_POLL_RECORDS = 20_000


class RangePartition(InputPartition):
    """One offset range of one topic-partition: the unit of work of a task."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


class RemotePartition(InputPartition):
    """Offsets that remote segments hold, read from remote storage by the task (remoteReads=direct)."""

    def __init__(self, piece: Any) -> None:  # josef_spark.remote_reads.RemotePiece
        super().__init__(piece.range)
        self.piece = piece


def _arrow_columns(records: Sequence[ConsumerRecord], schema: pa.Schema, include_headers: bool) -> pa.RecordBatch:
    """Records as one Arrow batch in Spark's Kafka schema, built column by column."""
    topic, partition, offset, timestamp, timestamp_type, key, value, headers, _ = zip(*records)
    n = len(records)
    stamps = pc.multiply(pa.array(timestamp, pa.int64()), 1000).cast(schema.field("timestamp").type)
    columns = [
        pa.array(key, pa.binary()),
        pa.array(value, pa.binary()),
        pa.repeat(pa.scalar(topic[0], pa.string()), n),
        pa.repeat(pa.scalar(partition[0], pa.int32()), n),
        pa.array(offset, pa.int64()),
        stamps,
        pa.array(timestamp_type, pa.int32()),
    ]
    if include_headers:
        columns.append(pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def consumer_config(options: ReadOptions, group_id: str) -> dict[str, Any]:
    """The configuration of an executor's consumer: the kafka.* options, assigned reading, nothing committed."""
    return {**options.client_config, "bootstrap.servers": options.bootstrap_servers, "group.id": group_id,
            "enable.auto.commit": False, "auto.offset.reset": "none", "max.poll.records": MAX_POLL_RECORDS}


def executor_group_id(options: ReadOptions) -> str:
    """The group.id of a query's consumers, as Spark's Kafka source sets it.

    ``kafka.group.id`` as given; otherwise ``{groupIdPrefix}-{a new UUID}-executor``,
    one id per query. The consumers are assigned their partitions and commit
    nothing, so the id never joins a group: it is what the cluster's ACLs and
    quotas see.
    """
    return options.group_id or f"{options.group_id_prefix}-{uuid.uuid4()}-executor"


def read_range(options: ReadOptions, arrow_schema: pa.Schema, r: OffsetRange,
               group_id: str) -> Iterator[pa.RecordBatch]:
    """The records of ``r`` (on an executor), in Arrow batches of up to MAX_POLL_RECORDS.

    Offsets may have gaps (compaction, transaction markers), so the range
    ends when the consumer's position reaches ``r.end``, not after a count.
    Records deleted since planning show as an out-of-range fetch: a
    :class:`DataLossError`, or with failOnDataLoss=false a skip to what is left.
    """
    tp = TopicPartition(r.topic, r.partition)
    consumer = Consumer(consumer_config(options, group_id))
    try:
        consumer.assign([tp])
        consumer.seek(tp, r.start)
        position = r.start
        progress_at = time.monotonic()
        while position < r.end:
            try:
                polled = consumer.poll(timeout_ms=min(options.poll_timeout_ms, 1000))
            except OffsetOutOfRangeError:
                earliest = consumer.beginning_offsets([tp])[tp]
                message = f"offsets {position}..{min(earliest, r.end) - 1} of {r.topic}-{r.partition} are gone"
                data_lost(options.fail_on_data_loss, message, "skip what was lost")
                if earliest >= r.end:
                    return
                consumer.seek(tp, earliest)
                position = earliest
                continue
            records = polled.get(tp)
            new_position = consumer.position(tp)
            if new_position == position and not records:
                if time.monotonic() - progress_at > options.poll_timeout_ms / 1000:
                    raise TimeoutError(f"no records of {r.topic}-{r.partition} after offset {position} within "
                                       f"kafkaConsumer.pollTimeoutMs ({options.poll_timeout_ms} ms); expected up to {r.end}")
                continue
            progress_at = time.monotonic()
            position = new_position
            if records:
                if records[-1].offset >= r.end:
                    records = [rec for rec in records if rec.offset < r.end]
                if records:
                    yield _arrow_columns(records, arrow_schema, options.include_headers)
    finally:
        consumer.close()


class _RangeReading:
    """What batch and stream readers share: the options, the Arrow schema, and reading one range."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        #: Chosen once where the query is planned, so that every task of the query uses the same id.
        self.group_id = executor_group_id(options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RemotePartition):
            from josef_spark.remote_reads import read_piece  # the tiered extra's, imported where it is used

            return read_piece(self.options, partition.piece, MAX_POLL_RECORDS,
                              lambda records: _arrow_columns(records, self.arrow_schema, self.options.include_headers),
                              lambda r: read_range(self.options, self.arrow_schema, r, self.group_id))
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark plans one empty InputPartition(None) when there is nothing to read
        return read_range(self.options, self.arrow_schema, partition.range, self.group_id)

    def input_partitions(self, planner: Planner, ranges: list[OffsetRange]) -> list[InputPartition]:
        """A task per range; with remoteReads=direct, what remote segments hold in tasks that read them there."""
        if self.options.remote_storage is None:
            return [RangePartition(r) for r in ranges]
        from josef_spark.remote_reads import RemotePiece, remote_segments, split
        # Only partitions read from below the brokers' local logs (ListOffsets EARLIEST_LOCAL) can need remote data.
        local = planner.list_offsets({(r.topic, r.partition): EARLIEST_LOCAL for r in ranges})
        below = {(r.topic, r.partition) for r in ranges if r.start < local.get((r.topic, r.partition), -1)}
        remote = remote_segments(self.options, planner.admin, below, self.group_id) if below else {}
        return [RemotePartition(p) if isinstance(p, RemotePiece) else RangePartition(p)
                for p in split(ranges, remote, planner.read_committed)]


class BatchReader(_RangeReading, DataSourceReader):
    """``spark.read``: one input partition per partition's range [start, end), split by maxRecordsPerPartition and minPartitions."""

    def partitions(self) -> Sequence[InputPartition]:
        planner = Planner(self.options)
        try:
            tps = planner.partitions()
            start = planner.resolve(self.options.starting, tps, "startingOffsets")
            end = planner.resolve(self.options.ending, tps, "endingOffsets")
            start = planner.checked_start(start, planner.earliest(tps), "startingOffsets")
            backwards = sorted(tp for tp in tps if end[tp] < start[tp])
            if backwards:
                t, p = backwards[0]
                raise ValueError(f"{t}-{p}: the ending offset {end[(t, p)]} is before the starting offset "
                                 f"{start[(t, p)]}")
            return self.input_partitions(planner, offset_ranges(start, end, self.options.min_partitions,
                                                                self.options.max_records_per_partition))
        finally:
            planner.close()


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Offsets as Spark's Kafka source checkpoints them: ``{"topic": {"0": 23}}``."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = offset
    return result


def from_json(data: dict[str, Any]) -> Offsets:
    return {(topic, int(p)): int(o) for topic, partitions in data.items() for p, o in partitions.items()}


class StreamReader(_RangeReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: per-partition offsets in the checkpoint, admission control, new partitions, data loss.

    Lives in one long-running Python process for the whole query, so the
    admin connection is opened once and kept.
    """

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self._planner: Planner | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow: read no further than this
        #: When the last micro-batch was let through (time.monotonic()), for minOffsetsPerTrigger; None: never yet.
        self._last_trigger: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Sent to executors for read(): without the driver's admin connection."""
        return {**self.__dict__, "_planner": None}

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.options)
        return self._planner

    def initialOffset(self) -> dict:
        tps = self.planner.partitions()
        return to_json(self.planner.resolve(self.options.starting, tps, "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        """maxOffsetsPerTrigger, else minOffsetsPerTrigger, else everything.

        Spark's Kafka source hands Spark both limits at once; Python sources
        have no composite limit, so when both are set Spark gets the maximum
        and :meth:`latestOffset` applies the minimum from the options.
        """
        o = self.options
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def _delay_batch(self, begin: Offsets, end: Offsets) -> bool:
        """minOffsetsPerTrigger: hold the micro-batch back while fewer offsets are new, unless maxTriggerDelay passed.

        As Spark's Kafka source: the delay runs from the last micro-batch let
        through (the first is never held back), and counts offsets, not records.
        """
        now = time.monotonic()
        if self._last_trigger is None or (now - self._last_trigger) * 1000 >= self.options.max_trigger_delay_ms:
            self._last_trigger = now
            return False
        new = sum(max(0, offset - begin.get(tp, offset)) for tp, offset in end.items())
        assert self.options.min_offsets_per_trigger is not None
        if new < self.options.min_offsets_per_trigger:
            return True
        self._last_trigger = now
        return False

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available()

    def _available(self) -> Offsets:
        """The latest offset of every partition read now (topics and partitions that appeared included)."""
        return self.planner.latest(self.planner.partitions())

    def reportLatestOffset(self) -> dict:
        return to_json(self._available())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        end = self._target if self._target is not None else self._available()
        new = [tp for tp in end if tp not in begin]
        if new:  # partitions that appeared since start are read from their beginning, as Spark does
            begin = {**begin, **self.planner.earliest(new)}
        # A partition that went away keeps its offset, so partitions() can tell it was lost.
        end = {**{tp: o for tp, o in begin.items() if tp not in end}, **end}
        # minOffsetsPerTrigger is not applied with Trigger.AvailableNow (a batch held back would end the query
        # early) nor when Spark asks for everything (ReadAllAvailable).
        if (self.options.min_offsets_per_trigger is not None and self._target is None
                and not isinstance(limit, ReadAllAvailable) and self._delay_batch(begin, end)):
            return start
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, end, limit.max_rows)
        # An end below its start (a log that shrank: a re-created topic) is left as it is for partitions() to judge.
        return to_json(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = from_json(start), from_json(end)
        new = [tp for tp in finish if tp not in begin]
        if new:
            begin = {**begin, **self.planner.earliest(new)}
        existing = set(self.planner.partitions())
        gone = sorted(tp for tp in begin if tp not in existing and tp in finish)
        if gone:
            t, p = gone[0]
            data_lost(self.options.fail_on_data_loss, f"{t}-{p} no longer exists (its topic was deleted?)",
                      "go on without it")
            finish = {tp: o for tp, o in finish.items() if tp not in gone}
        shrunk = sorted(tp for tp in finish if tp in begin and finish[tp] < begin[tp])
        if shrunk:
            t, p = shrunk[0]
            data_lost(self.options.fail_on_data_loss,
                      f"{t}-{p} went back from offset {begin[(t, p)]} to {finish[(t, p)]} (was its topic re-created?)",
                      "go on from the new end")
        live = [tp for tp in finish if tp in existing and tp not in shrunk]
        begin = self.planner.checked_start({tp: begin[tp] for tp in live}, self.planner.earliest(live),
                                           "the micro-batch")
        return self.input_partitions(self.planner, offset_ranges(begin, finish, self.options.min_partitions,
                                                                 self.options.max_records_per_partition))

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in the cluster."""

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None
