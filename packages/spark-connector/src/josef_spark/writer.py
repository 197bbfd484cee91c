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
finds it at or past its batch skips its rows. The rows are committed only
if the executor ended the task's input (:mod:`josef_spark.task_input`): an
input cut short looks like a complete one to the writer. A read_committed
consumer thus sees every row once, across task retries and query restarts,
provided the input is replayed deterministically (the same rows in the same
partition of the same batch id, as Spark's Kafka and file sources do).

A batch write's id is new for every write unless the user names the write
with ``writeId``: then every run of the job has the same transactional ids,
and a re-run after a failure writes only the partitions earlier runs did not
commit. A partition is identified by its index alone, so a re-run must give
each partition the same rows: the progress record of a partition carries a
digest of its rows, which a re-run compares (:mod:`josef_spark.progress`),
and the driver records how many partitions the write had and whether it
completed, so a re-run of a complete write writes nothing and a re-run with
other partitions is refused (see :class:`BatchWriter`).

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

from josef_client import Admin, OffsetAndMetadata, Producer, ProducerFencedError, TopicPartition
from josef_client.config import ADMIN
from josef_spark.options import OptionError, WriteOptions
from josef_spark.progress import Outcome, RowDigest, read_outcome, record_outcome
from josef_spark.task_input import InputCutShort, TaskInput

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
    #: The topic whose partition 0 holds the progress record (None when the task had no rows).
    topic: str | None = None


class RerunMismatchError(RuntimeError):
    """A re-run of a batch write (the same ``writeId``) does not have the rows or partitions of the earlier run.

    Partitions are known by their index: with other rows in a partition, or
    other partitions, a re-run could write rows twice or miss some.
    """


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
                       batch_id: int, check_rows: bool = False) -> Written:
    """Write a partition's rows of one batch in one transaction, unless an earlier attempt committed them.

    With ``check_rows`` (a batch write with a ``writeId``) the progress
    record carries a digest of the rows, and a partition found committed is
    compared with it: :class:`RerunMismatchError` if its rows differ.

    In a Spark task, the rows are committed only if the executor ended the
    input (:mod:`josef_spark.task_input`): an input cut short by a failure
    upstream or the executor's death is aborted, and the attempt fails.
    """
    task_input = TaskInput.of_this_task()  # before this task opens connections of its own
    pending = rows(options, batches)
    first = next(pending, None)
    if first is None:
        return Written(0, partition, write_id)  # a replay has no rows either: nothing to record
    txn_id = transactional_id(options, write_id, partition)
    progress = TopicPartition(options.topic or first[0], 0)
    digest = RowDigest() if check_rows else None
    with Producer(_config(options, **{"transactional.id": txn_id})) as producer:
        producer.init_transactions()  # fences every earlier attempt and ends what it left open
        with Admin(_admin_config(options)) as admin:
            committed = admin.list_consumer_group_offsets(txn_id)
        done = max(committed.values(), key=lambda om: om.offset, default=None)
        if done is not None and done.offset > batch_id:
            if digest is not None and done.metadata:
                _check_same_rows(txn_id, done.metadata, digest, itertools.chain([first], pending), task_input)
            log.info("%s: batch %d was committed by an earlier attempt; its rows are not written again", txn_id, batch_id)
            return Written(0, partition, write_id, skipped=True, topic=progress.topic)
        producer.begin_transaction()
        count = 0
        try:
            for row in itertools.chain([first], pending):
                topic, value, key, record_partition, headers = row
                producer.send(topic, value, key, record_partition, headers=headers)
                count += 1
                if digest is not None:
                    digest.add(row)
            if task_input is not None and task_input.cut_short():
                raise InputCutShort(f"{txn_id}: the executor closed the input after {count} rows, before its end "
                                    "(it failed upstream, or died): they are not committed, the next attempt writes "
                                    "them")
            record = OffsetAndMetadata(batch_id + 1, None if digest is None else digest.metadata)
            producer.send_offsets_to_transaction({progress: record}, txn_id)
            producer.commit_transaction()
        except ProducerFencedError:
            raise  # a newer attempt owns the partition now
        except BaseException:
            _abort_quietly(producer, txn_id)
            raise
    return Written(count, partition, write_id, topic=progress.topic)


def _check_same_rows(txn_id: str, recorded: str, digest: RowDigest, pending: Iterable[Row],
                     task_input: TaskInput | None) -> None:
    """Raise :class:`RerunMismatchError` unless ``pending`` are the rows the earlier run committed."""
    for row in pending:
        digest.add(row)
    if digest.metadata == recorded:
        return
    if task_input is not None and task_input.cut_short():
        raise InputCutShort(f"{txn_id}: the executor closed the input after {digest.rows} rows, before its end")
    raise RerunMismatchError(
            f"{txn_id}: an earlier run of this write committed this partition with other rows ({recorded}) than this "
            f"run has ({digest.metadata}): the input changed, or how it is partitioned. A writeId names one write of "
            "one input; write this input with a new writeId")


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
    """A batch write: made on the driver when the write is planned, then copied to every task.

    With a ``writeId``, it reads how an earlier run of the write ended
    (:mod:`josef_spark.progress`) when it is made: after a complete run, every
    task skips its rows; after a failed one with N partitions, a task of
    partition N or later refuses to write (its rows belong to other
    partitions in that run), and ``commit()`` refuses a run with fewer
    partitions. A run whose driver was killed recorded no outcome: then only
    the row digests of its committed partitions are checked.
    """

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        #: Made once on the driver unless the user named the write: every task and attempt of this write shares it.
        self.write_id = options.write_id or uuid.uuid4().hex
        self.earlier: Outcome | None = None
        if options.write_id is not None:
            self.earlier = read_outcome(_admin_config(options), options.transactional_id_prefix, options.write_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if not self.options.exactly_once:
            return write_at_least_once(self.options, iterator)
        return self.write_partition(iterator, _partition())

    def write_partition(self, iterator: Iterable[pa.RecordBatch], partition: int) -> Written:
        """The task of Spark partition ``partition``."""
        if self.earlier is not None and self.earlier.complete:
            log.info("write %s was completed by an earlier run: partition %d is not written again", self.write_id,
                     partition)
            return Written(0, partition, self.write_id, skipped=True)
        if self.earlier is not None and partition >= self.earlier.partitions:
            raise RerunMismatchError(
                f"write {self.write_id} failed earlier with {self.earlier.partitions} partitions, and this run has "
                f"partition {partition}: a re-run must partition the same input the same way. Nothing of this "
                "partition was written")
        return write_exactly_once(self.options, iterator, write_id=self.write_id, partition=partition, batch_id=0,
                                  check_rows=self.options.write_id is not None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task committed its own rows; a named write records that it is complete."""
        if self.options.write_id is None or (self.earlier is not None and self.earlier.complete):
            return
        if self.earlier is not None and self.earlier.partitions != len(messages):
            raise RerunMismatchError(
                f"write {self.write_id} failed earlier with {self.earlier.partitions} partitions, and this run had "
                f"{len(messages)}: the rows of partitions {len(messages)} to {self.earlier.partitions - 1} of the "
                "earlier run may be missing, and its other rows doubled. A re-run must partition the same input the "
                "same way")
        self._record(messages, complete=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Tasks that finished stay written (a topic has no rollback); failed ones' transactions are aborted.

        A named write that had not failed before records how many partitions
        it has, for its re-run.
        """
        fence_failed_tasks(self.options, messages)
        if self.options.write_id is not None and self.earlier is None:
            try:
                self._record(messages, complete=False)
            except Exception as exc:  # the write's own failure is the one to report
                log.warning("write %s: could not record its outcome (%s); a re-run checks only row digests",
                            self.write_id, exc)

    def _record(self, messages: Sequence[WriterCommitMessage | None], *, complete: bool) -> None:
        topic = self.options.topic or next((m.topic for m in messages if isinstance(m, Written) and m.topic), None)
        if topic is None:
            return  # no finished task had rows: nothing to record in, and a re-run checks its row digests
        record_outcome(_admin_config(self.options), self.options.transactional_id_prefix, self.write_id, topic,
                       Outcome(len(messages), complete))


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
