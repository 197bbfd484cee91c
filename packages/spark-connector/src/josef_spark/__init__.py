"""josef's PySpark data source: ``spark.dataSource.register(JosefDataSource)``, then ``format("josef")``.

It takes the schema and options of Spark's built-in Kafka source, so an
existing job switches by changing the format name, and batch writes also by
``.mode("append")`` (Spark refuses its default save mode for Python data sources).
"""

import importlib.metadata

from josef_spark.options import OptionError
from josef_spark.planning import DataLossError
from josef_spark.source import JosefDataSource
from josef_spark.writer import RerunMismatchError

__all__ = ["DataLossError", "JosefDataSource", "OptionError", "RerunMismatchError"]
__version__ = importlib.metadata.version("josef-spark")
