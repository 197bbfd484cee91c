"""``JosefDataSource``: the ``josef`` format, a drop-in for Spark's built-in ``kafka`` format."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from josef_spark.options import OptionError, read_options, write_options
from josef_spark.reader import BatchReader, StreamReader
from josef_spark.writer import BatchWriter, StreamWriter, check_schema

#: The columns of Spark's Kafka source, in its order; ``headers`` only with includeHeaders=true.
KAFKA_FIELDS = (
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
)
HEADERS = StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                        StructField("value", BinaryType())])))


class JosefDataSource(DataSource):
    """Read and write josef (or any Kafka) topics with the schema and options of Spark's Kafka source.

    Batch writes need ``.mode("append")``: Spark refuses its default save mode for Python data sources.

    >>> spark.dataSource.register(JosefDataSource)
    >>> spark.read.format("josef").option("kafka.bootstrap.servers", "localhost:9092").option("subscribe", "t").load()

    Options are checked here, when the query is defined; :class:`OptionError`
    names the option at fault.
    """

    @classmethod
    def name(cls) -> str:
        return "josef"

    def schema(self) -> StructType:
        """Called at ``load()``: the first chance to check the options (those that hold for batch and streaming)."""
        read_options(self.options, streaming=None)
        include_headers = str(self.options.get("includeheaders", "false")).strip().lower() == "true"
        return StructType([*KAFKA_FIELDS, HEADERS] if include_headers else list(KAFKA_FIELDS))

    def _read_schema(self, schema: StructType) -> None:
        if schema != self.schema():
            raise OptionError("the josef format has a fixed schema (Spark's Kafka source schema); do not pass one")

    def reader(self, schema: StructType) -> DataSourceReader:
        self._read_schema(schema)
        return BatchReader(read_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._read_schema(schema)
        return StreamReader(read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write...save()``: only with ``.mode("append")``.

        Spark's Kafka sink also takes the default save mode (errorifexists);
        Spark itself refuses it for Python data sources, with
        UNSUPPORTED_DATA_SOURCE_SAVE_MODE, before this is called. Its message
        suggests "Overwrite", which lands here.
        """
        if overwrite:
            raise OptionError('a topic cannot be overwritten: records are only appended to topics; '
                              'write with .mode("append")')
        options = write_options(self.options)
        check_schema(schema, options)
        return BatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = write_options(self.options, streaming=True)
        check_schema(schema, options)
        return StreamWriter(options)
