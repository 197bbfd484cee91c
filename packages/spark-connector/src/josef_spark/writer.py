"""Batch and streaming writers: each task sends its rows through josef's idempotent producer.

The columns are those of Spark's Kafka sink: ``value`` (required), ``key``,
``topic`` (unless the ``topic`` option is set, which wins), ``partition`` and
``headers``; other columns are ignored. Strings are written as UTF-8.

What a write guarantees today: a task's records are acknowledged by all
in-sync replicas (acks=all) before the task succeeds, and the idempotent
producer stores each record once and in order however often a request is
retried inside the task. A task that Spark runs again (a failure, a
speculative copy, a streaming batch replayed after a restart) sends its rows
again, so across task attempts delivery is at-least-once; exactly-once needs
the transactional producer, which josef does not have yet.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import attrs
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from josef_client import Producer
from josef_spark.options import OptionError, WriteOptions


@attrs.frozen
class Written(WriterCommitMessage):
    """What a task reports to the driver: how many records it wrote."""

    records: int


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


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> Written:
    """Send every row (on an executor); returns once all are acknowledged, or raises the first failure."""
    config = {**options.client_config, "bootstrap.servers": options.bootstrap_servers}
    failures: list[BaseException] = []

    def delivered(_: Any, error: BaseException | None) -> None:
        if error is not None:
            failures.append(error)

    count = 0
    with Producer(config) as producer:
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
                producer.send(topics[i], _utf8(values[i]), _utf8(keys[i]), partitions[i],
                              headers=[(h["key"], h["value"]) for h in row_headers] if row_headers else None,
                              on_delivery=delivered)
                if failures:
                    break
            count += n
            if failures:
                break
        producer.flush()
    if failures:
        raise failures[0]
    return Written(count)


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: the records were acknowledged when each task finished."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what was acknowledged stays (see the module docs on guarantees)."""
