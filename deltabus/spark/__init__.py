"""deltabus in Spark: the `deltabus` data source (read, readStream, write, writeStream) and SQL
views over topics.

    >>> import deltabus.spark
    >>> deltabus.spark.register(spark)  # done by deltabus.local_spark and Cluster(spark)
    >>> spark.readStream.format("deltabus").option("kafka.bootstrap.servers", bootstrap) \\
    ...     .option("subscribe", "payments").load()
    >>> deltabus.spark.read_topic(spark, bootstrap, "payments")  # a batch read, Spark's reader

Runs in the Spark driver (planning: offsets, partitions) and on executors (reading partition
tables with delta-rs, producing with deltabus's `Producer`). May import the pure modules,
`log_tables` (readers) and `client`; never a server module (tests/test_layering.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from deltabus.spark.parquet_reads import read_topic, remember_storage_options
from deltabus.spark.sink import BatchWriter, SinkOptions, StreamWriter
from deltabus.spark.source import (
    STORAGE_OPTION_PREFIX,
    BatchReader,
    DataLossError,
    SourceOptions,
    StreamReader,
    kafka_schema,
    spark_ddl,
    typed_column_type,
    wanted_typed_columns,
)
from deltabus.spark.views import register_topic_views

__all__ = ["DataLossError", "DeltaBusDataSource", "read_topic", "register",
           "register_topic_views"]


class DeltaBusDataSource(DataSource):
    """Spark's Kafka source and sink, for deltabus topics (format name `deltabus`).

    Readers reach the partition tables with `storage_options`: those `register` was given
    (the cluster's, when a Cluster registered it), under any `storage.KEY` source options."""

    storage_options: dict[str, str] = {}

    @classmethod
    def name(cls) -> str:
        return "deltabus"

    def schema(self) -> str:
        headers = str(self.options.get("includeHeaders", "false")).lower() == "true"
        wanted = wanted_typed_columns(self.options)
        if not wanted:
            return kafka_schema(headers)
        # keyFields, valueFields: a typed topic's decoded keys or values, in the type their
        # subject and tables hold now (a stream keeps it: see source.typed_column_type)
        options = SourceOptions.parse(self._source_options(), streaming=False)
        return kafka_schema(headers) + "".join(
            f", {c} {spark_ddl(typed_column_type(options, c))}" for c in wanted)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self._parsed(schema, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self._parsed(schema, streaming=True))

    def _parsed(self, schema: StructType, *, streaming: bool) -> SourceOptions:
        options = SourceOptions.parse(self._source_options(), streaming=streaming)
        wanted = wanted_typed_columns(self.options)
        if not wanted:
            return options
        from pyspark.sql.pandas.types import to_arrow_type

        return dataclasses.replace(options, typed=tuple(
            (c, to_arrow_type(schema[c].dataType)) for c in wanted))

    def _source_options(self) -> dict[str, str]:
        defaults = {f"{STORAGE_OPTION_PREFIX}{k}": v for k, v in self.storage_options.items()}
        return {**defaults, **dict(self.options)}

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BatchWriter(SinkOptions.parse(dict(self.options)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StreamWriter(SinkOptions.parse(dict(self.options)))


def register(spark: Any, storage_options: Mapping[str, str] | None = None) -> None:
    """Make `format("deltabus")` available in this SparkSession; its reads reach the topics'
    tables with `storage_options` (a copy of the class carries them to Spark's Python
    workers, so a notebook need not repeat them on every read)."""
    source: type[DeltaBusDataSource] = DeltaBusDataSource
    if storage_options:
        source = type("DeltaBusDataSource", (DeltaBusDataSource,),
                      {"storage_options": dict(storage_options),
                       "__doc__": DeltaBusDataSource.__doc__})
    spark.dataSource.register(source)
    remember_storage_options(spark, storage_options or {})
