"""Batch and streaming writers: each task's rows go out in one transaction, at most once per partition and batch.

The columns are those of Spark's Kafka sink: ``value`` (required), ``key``,
``topic`` (unless the ``topic`` option is set, which wins), ``partition`` and
``headers``; other columns are ignored. Strings are written as UTF-8.

Exactly once (``exactlyOnce``, the default). A task writes its rows with a
transactional producer whose ``transactional.id`` is
``{transactionalIdPrefix}-{write id}-{partition}``: the streaming query's id
(kept in its checkpoint, so the same after a restart) or a fresh id per batch
write, and the Spark partition. Every attempt at a partition has the same id,
so its ``init_transactions()`` fences the attempts before it (a failed task,
a speculative copy, a task of a killed driver) and aborts what they left
open. Then it asks whether the partition of this micro-batch (batch id 0 for
batch writes) is already written: with the rows, the transaction commits the
offset ``batch id + 1`` for partition 0 of the topic written to, in the
consumer group named like the transactional id. The group's committed offset
is that record of progress, committed atomically with the rows; a task that
finds it at or past its batch skips its rows. A read_committed consumer thus
sees every row once, across task retries and query restarts, provided the
input is replayed deterministically (the same rows in the same partition of
the same batch id, as Spark's Kafka and file sources do).

With ``exactlyOnce=false`` a task sends through the idempotent producer:
acknowledged by all in-sync replicas, stored once however often a request is
retried inside the task, but written again by a task Spark runs again
(at-least-once, like Spark's own Kafka sink).
"""

from __future__ import annotations

import itertools
import logging
import uuid
from typing import Any, Iterable, Iterator, Sequence

import attrs
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from josef_client import Admin, Producer, ProducerFencedError, TopicPartition
from josef_client.config import ADMIN
from josef_spark.options import OptionError, WriteOptions

log = logging.getLogger(__name__)

#: The local properties Spark's micro-batch execution gives every task of a batch.
BATCH_ID_PROPERTY, QUERY_ID_PROPERTY = "streaming.sql.batchId", "sql.streaming.queryId"

Row = tuple[str, Any, Any, Any, Any]  # topic, value, key, partition, headers


@attrs.frozen
class Written(WriterCommitMessage):
    """What a task reports to the driver."""

    records: int
    partition: int = -1
    #: The write id of an exactly-once write (its transactional ids are ``{prefix}-{write_id}-{partition}``).
    write_id: str | None = None
    #: An earlier attempt had committed this partition of this batch, so its rows were not written again.
    skipped: bool = False


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """The DataFrame's columns as Spark's Kafka sink wants them, or an :class:`OptionError` naming the column."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    text_or_bytes = (StringType(), BinaryType())
    if "value" not in fields:
        raise OptionError("the DataFrame to write needs a value column (string or binary)")
    for name in ("key", "value"):
        if name in fields and fields[name] not in text_or_bytes:
            raise OptionError(f"column {name} must be string or binary, not {fields[name].simpleString()}")
    if options.topic is None:
        if "topic" not in fields:
            raise OptionError("set the topic option or give the DataFrame a topic column")
        if fields["topic"] != StringType():
            raise OptionError(f"column topic must be string, not {fields['topic'].simpleString()}")
    if "partition" in fields and fields["partition"] != IntegerType():
        raise OptionError(f"column partition must be int, not {fields['partition'].simpleString()}")
    if "headers" in fields:
        headers = fields["headers"]
        ok = (isinstance(headers, ArrayType) and isinstance(headers.elementType, StructType)
              and [(f.name, f.dataType) for f in headers.elementType.fields] == [("key", StringType()), ("value", BinaryType())])
        if not ok:
            raise OptionError(f"column headers must be array<struct<key:string,value:binary>>, not {headers.simpleString()}")


def _utf8(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def rows(options: WriteOptions, batches: Iterable[pa.RecordBatch]) -> Iterator[Row]:
    """The records to send, one per row: ``(topic, value, key, partition, headers)``."""
    for batch in batches:
        n = batch.num_rows
        names = {name.lower(): i for i, name in enumerate(batch.schema.names)}

        def column(name: str, default: Any = None) -> Sequence[Any]:
            return batch.column(names[name]).to_pylist() if name in names else [default] * n

        values, keys = column("value"), column("key")
        topics = [options.topic] * n if options.topic is not None else column("topic")
        partitions, headers = column("partition"), column("headers")
        for i in range(n):
            if topics[i] is None:
                raise ValueError("a row has a null topic and no topic option is set")
            row_headers = headers[i]
            yield (topics[i], _utf8(values[i]), _utf8(keys[i]), partitions[i],
                   [(h["key"], h["value"]) for h in row_headers] if row_headers else None)


#: The kafka.* options that apply to the admin client an exactly-once task reads its progress with.
ADMIN_KEYS = frozenset(key.name for key in ADMIN)


def _config(options: WriteOptions, **extra: Any) -> dict[str, Any]:
    return {**options.client_config, "bootstrap.servers": options.bootstrap_servers, **extra}


def _admin_config(options: WriteOptions) -> dict[str, Any]:
    return {k: v for k, v in _config(options).items() if k in ADMIN_KEYS}


def write_at_least_once(options: WriteOptions, batches: Iterable[pa.RecordBatch]) -> Written:
    """Send every row through the idempotent producer; returns once all are acknowledged, or raises the first failure."""
    failures: list[BaseException] = []

    def delivered(_: Any, error: BaseException | None) -> None:
        if error is not None:
            failures.append(error)

    count = 0
    with Producer(_config(options)) as producer:
        for topic, value, key, partition, headers in rows(options, batches):
            producer.send(topic, value, key, partition, headers=headers, on_delivery=delivered)
            count += 1
            if failures:
                break
        producer.flush()
    if failures:
        raise failures[0]
    return Written(count)


def transactional_id(options: WriteOptions, write_id: str, partition: int) -> str:
    """The transactional id of a partition's every attempt; also the consumer group that records its progress."""
    return f"{options.transactional_id_prefix}-{write_id}-{partition}"


def write_exactly_once(options: WriteOptions, batches: Iterable[pa.RecordBatch], *, write_id: str, partition: int,
                       batch_id: int) -> Written:
    """Write a partition's rows of one batch in one transaction, unless an earlier attempt committed them."""
    pending = rows(options, batches)
    first = next(pending, None)
    if first is None:
        return Written(0, partition, write_id)  # a replay has no rows either: nothing to record
    txn_id = transactional_id(options, write_id, partition)
    with Producer(_config(options, **{"transactional.id": txn_id})) as producer:
        producer.init_transactions()  # fences every earlier attempt and ends what it left open
        with Admin(_admin_config(options)) as admin:
            committed = admin.list_consumer_group_offsets(txn_id)
        if max((om.offset for om in committed.values()), default=0) > batch_id:
            log.info("%s: batch %d was committed by an earlier attempt; its rows are not written again", txn_id, batch_id)
            return Written(0, partition, write_id, skipped=True)
        producer.begin_transaction()
        count = 0
        try:
            for topic, value, key, record_partition, headers in itertools.chain([first], pending):
                producer.send(topic, value, key, record_partition, headers=headers)
                count += 1
            progress = TopicPartition(options.topic or first[0], 0)
            producer.send_offsets_to_transaction({progress: batch_id + 1}, txn_id)
            producer.commit_transaction()
        except ProducerFencedError:
            raise  # a newer attempt owns the partition now
        except BaseException:
            _abort_quietly(producer, txn_id)
            raise
    return Written(count, partition, write_id)


def _abort_quietly(producer: Producer, txn_id: str) -> None:
    """End a failed task's transaction now, so read_committed consumers need not wait for its timeout."""
    try:
        producer.abort_transaction()
    except Exception as exc:  # the task's own failure is the one to report
        log.warning("%s: could not abort the transaction (%s); the next attempt or its timeout will", txn_id, exc)


def fence_failed_tasks(options: WriteOptions, messages: Sequence[WriterCommitMessage | None]) -> None:
    """On the driver, for a failed write: abort the open transactions of the partitions whose task did not finish.

    The messages are in partition order, None for a failed task. Only an
    exactly-once write whose other tasks said their write id can be
    fenced here; otherwise the next attempt, or the coordinator's
    ``transaction.timeout.ms``, ends those transactions.
    """
    write_id = next((m.write_id for m in messages if isinstance(m, Written) and m.write_id), None)
    if not options.exactly_once or write_id is None:
        return
    for partition, message in enumerate(messages):
        if message is not None:
            continue
        txn_id = transactional_id(options, write_id, partition)
        try:
            with Producer(_config(options, **{"transactional.id": txn_id})) as producer:
                producer.init_transactions()
        except Exception as exc:
            log.warning("%s: could not fence the failed task's transaction (%s)", txn_id, exc)


def _partition() -> int:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("josef-spark writers run in Spark tasks")
    return context.partitionId()


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        #: Made once on the driver: every task and attempt of this write shares it.
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if not self.options.exactly_once:
            return write_at_least_once(self.options, iterator)
        return write_exactly_once(self.options, iterator, write_id=self.write_id, partition=_partition(), batch_id=0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Tasks that finished stay written (a topic has no rollback); failed ones' transactions are aborted."""
        fence_failed_tasks(self.options, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if not self.options.exactly_once:
            return write_at_least_once(self.options, iterator)
        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        if batch_id is None or query_id is None:
            raise RuntimeError("a josef-spark streaming write runs in a micro-batch task "
                               "(continuous processing is not supported)")
        return write_exactly_once(self.options, iterator, write_id=query_id, partition=_partition(),
                                  batch_id=int(batch_id))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing left to do: each task committed its own transaction (see the module docs)."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Tasks that finished stay written (their progress is recorded); failed ones' transactions are aborted."""
        fence_failed_tasks(self.options, messages)
