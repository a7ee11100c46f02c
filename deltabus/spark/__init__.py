"""deltabus in Spark: the `deltabus` data source (read, readStream, write, writeStream) and SQL
views over topics.

    >>> import deltabus.spark
    >>> deltabus.spark.register(spark)  # done by deltabus.local_spark and Cluster(spark)
    >>> spark.readStream.format("deltabus").option("kafka.bootstrap.servers", bootstrap) \\
    ...     .option("subscribe", "payments").load()

Runs in the Spark driver (planning: offsets, partitions) and on executors (reading partition
tables with delta-rs, producing with deltabus's `Producer`). May import the pure modules,
`log_tables` (readers) and `client`; never a server module (tests/test_layering.py).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from deltabus.spark.sink import BatchWriter, SinkOptions, StreamWriter
from deltabus.spark.source import (
    BatchReader,
    DataLossError,
    SourceOptions,
    StreamReader,
    kafka_schema,
)
from deltabus.spark.views import register_topic_views

__all__ = ["DataLossError", "DeltaBusDataSource", "register", "register_topic_views"]


class DeltaBusDataSource(DataSource):
    """Spark's Kafka source and sink, for deltabus topics (format name `deltabus`)."""

    @classmethod
    def name(cls) -> str:
        return "deltabus"

    def schema(self) -> str:
        headers = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return kafka_schema(headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(SourceOptions.parse(dict(self.options), streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(SourceOptions.parse(dict(self.options), streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BatchWriter(SinkOptions.parse(dict(self.options)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StreamWriter(SinkOptions.parse(dict(self.options)))


def register(spark: Any) -> None:
    """Make `format("deltabus")` available in this SparkSession."""
    spark.dataSource.register(DeltaBusDataSource)
