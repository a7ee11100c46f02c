"""Bench step (j): a Structured Streaming query draining a topic, and SQL over it on Spark's own
Parquet reader, against Spark reading the same Parquet files directly.

All run in the same Spark session, on the same data files (the partition leaders' Delta
tables), with the same columns into Spark's `noop` sink. The JVM's JIT keeps speeding Spark's
own Parquet reader up over the first few reads (2.9 -> 6.4 M records/s over four reads here), so
one read of each compares whatever state the JIT was in: after a warm-up of each on a small topic
and one untimed round on the big one, `rounds` interleaved rounds (5 by default) are timed and
the medians are compared. The streaming rate is Spark's own measure, input rows over the
micro-batches' trigger time (`processedRowsPerSecond`); the wall time from `start()` to the end,
query start-up included, is reported beside it.

Each round also times a Python data source that yields Arrow batches already in memory (the same
records, no I/O at all): what Spark's Python data source path itself can carry on this machine,
the ceiling for any reader built on it, as deltabus's source is, so the stream is judged against
it. That source's class is pickled by value, so Spark's Python workers need not find the `bench`
package, which is not installed.

The same in-memory records are also served by a Python *streaming* source (`MemoryStreamSource`)
drained by the same kind of query (one micro-batch, availableNow, the noop sink): the ceiling of
Spark's Python streaming path, whose micro-batch execution and streaming write carry costs the
batch read does not. Against it, the stream's figure is deltabus's reader's own share.

And a Python streaming source that reads the partition leaders' files with pyarrow alone
(`ParquetFloorSource`: a row group at a time, the source's columns, no offsets, markers or
Delta log) gives the floor of any reader that must decode those files: between it and the
in-memory ceiling is the cost of decoding Parquet at all, on the same cores Spark converts the
rows on; between it and the stream, deltabus's reader's own work.

And each round times SQL over the topic through Spark's own Parquet reader (issue 21): a
snapshot view (`register_topic_views(..., snapshot=True)`, which resolves the offsets and files
on the driver with `read_topic`) and a `SELECT` of the Kafka source's columns, from the
registration on, into the same sink. It is judged against the direct read: the same reader on
the same files, plus the offset resolution, the filter and the literal topic and partition.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark import cloudpickle
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from deltabus.client.admin import AdminClient
from deltabus.client.consumer import Consumer
from deltabus.client.producer import Producer
from deltabus.log_tables.layout import replica_path
from deltabus.metadata import NewTopic
from deltabus.spark.source import kafka_schema, to_kafka_columns
from deltabus.spark.views import register_topic_views

PARTITIONS = 4
WARM_UP_RECORDS_MAX = 200_000  # the small topic warming each reader up
COLUMNS = ["key", "value", "offset", "timestamp", "timestamp_type"]  # what the source reads
SQL_COLUMNS = "key, value, topic, partition, offset, timestamp, timestampType"


def fill(bootstrap: str, topic: str, values: pa.Table, records: int) -> None:
    """`records` records over the topic's partitions, with the bulk producer."""
    per_partition = records // PARTITIONS
    with Producer(bootstrap, acks=1) as producer:
        for partition in range(PARTITIONS):
            left = per_partition + (records % PARTITIONS if partition == 0 else 0)
            while left > 0:
                chunk = values.slice(0, min(values.num_rows, left))
                producer.send_batch(topic, chunk, partition=partition)
                left -= chunk.num_rows


def leader_files_by_partition(bootstrap: str, topic: str) -> list[list[str]]:
    """The Parquet files of each partition leader's table."""
    consumer = Consumer(bootstrap)
    try:
        image = consumer.metadata()
    finally:
        consumer.close()
    state = image.topics[topic]
    return [DeltaTable(replica_path(image.log_root, topic, p.partition, p.leader)).file_uris()
            for p in state.partitions]


def leader_files(bootstrap: str, topic: str) -> list[str]:
    """The Parquet files of the partition leaders' tables."""
    return [uri for files in leader_files_by_partition(bootstrap, topic) for uri in files]


def direct_read(spark: Any, files: list[str]) -> float:
    """Seconds for Spark's own Parquet reader to read the files into the noop sink."""
    start = time.perf_counter()
    spark.read.parquet(*files).select(*COLUMNS).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


class _MemoryPartition(InputPartition):
    def __init__(self, file: str, records: int) -> None:
        self.file, self.records = file, records


class _MemoryReader(DataSourceReader):
    def __init__(self, files: list[str], records: int, topic: str) -> None:
        self.files, self.records, self.topic = files, records, topic

    def partitions(self) -> list[_MemoryPartition]:
        return [_MemoryPartition(f, self.records // len(self.files)) for f in self.files]

    def read(self, partition: _MemoryPartition) -> Any:  # type: ignore[override]
        """One data file's records as the Kafka source's columns, read once and then yielded
        again and again from memory until the partition's share of the records is out."""
        log = pq.read_table(partition.file, columns=["offset", "timestamp", "timestamp_type",
                                                     "key", "value"])
        batches = [to_kafka_columns(b, self.topic, 0, False) for b in log.to_batches()]
        left = partition.records
        while left > 0:
            for batch in batches:
                if left <= 0:
                    break
                yield batch.slice(0, left) if batch.num_rows > left else batch
                left -= batch.num_rows


class MemorySource(DataSource):
    """`deltabus-bench-memory`: the ceiling of Spark's Python data source path (module doc)."""

    @classmethod
    def name(cls) -> str:
        return "deltabus-bench-memory"

    def schema(self) -> str:
        return kafka_schema(False)

    def reader(self, schema: Any) -> _MemoryReader:
        return _MemoryReader(self.options["files"].split(","), int(self.options["records"]),
                             self.options["topic"])


class _OneBatchReader(DataSourceStreamReader):
    """A bench stream of one micro-batch (offsets 0 to 1) of `batch_partitions`."""

    def batch_partitions(self) -> list[InputPartition]:
        raise NotImplementedError

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        return {"batch": 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return self.batch_partitions() if end["batch"] > start["batch"] else []

    def commit(self, end: dict) -> None:
        pass


class _MemoryStreamReader(_OneBatchReader):
    """The in-memory records as one micro-batch of a stream."""

    def __init__(self, files: list[str], records: int, topic: str) -> None:
        self._batch = _MemoryReader(files, records, topic)

    def batch_partitions(self) -> list[InputPartition]:
        return list(self._batch.partitions())

    def read(self, partition: _MemoryPartition) -> Any:  # type: ignore[override]
        return self._batch.read(partition)


class MemoryStreamSource(MemorySource):
    """`deltabus-bench-memory-stream`: the ceiling of Spark's Python streaming source path."""

    @classmethod
    def name(cls) -> str:
        return "deltabus-bench-memory-stream"

    def streamReader(self, schema: Any) -> _MemoryStreamReader:
        return _MemoryStreamReader(self.options["files"].split(","),
                                   int(self.options["records"]), self.options["topic"])


class _FilesPartition(InputPartition):
    def __init__(self, files: list[str]) -> None:
        self.files = files


class _ParquetFloorReader(_OneBatchReader):
    """Each partition leader's files, read with pyarrow alone, as one micro-batch."""

    def __init__(self, partitions: list[list[str]], topic: str) -> None:
        self.files, self.topic = partitions, topic

    def batch_partitions(self) -> list[InputPartition]:
        return [_FilesPartition(f) for f in self.files]

    def read(self, partition: _FilesPartition) -> Any:  # type: ignore[override]
        """The files' records, a row group at a time, as the Kafka source's columns: what any
        reader of these tables must decode, and nothing else (no offsets, no markers)."""
        for file in partition.files:
            reader = pq.ParquetFile(file)
            for group in range(reader.num_row_groups):
                for batch in reader.read_row_group(group, columns=COLUMNS).to_batches():
                    yield to_kafka_columns(batch, self.topic, 0, False)


class ParquetFloorSource(MemorySource):
    """`deltabus-bench-parquet-floor`: the cost of decoding the topic's Parquet at all."""

    @classmethod
    def name(cls) -> str:
        return "deltabus-bench-parquet-floor"

    def streamReader(self, schema: Any) -> _ParquetFloorReader:
        return _ParquetFloorReader([p.split(",") for p in self.options["partitions"].split(";")],
                                   self.options["topic"])


def _one_batch_stream(spark: Any, source: str, options: dict[str, str], records: int) -> float:
    """Seconds of the micro-batch (trigger time, as the stream's figure) of a query draining
    a bench streaming source's `records` records into the noop sink."""
    with tempfile.TemporaryDirectory(prefix="deltabus-bench-checkpoint-") as checkpoint:
        query = (spark.readStream.format(source).options(**options).load()
                 .writeStream.format("noop").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the {source} streaming query failed: {query.exception()}")
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    if rows != records:
        raise RuntimeError(f"the {source} stream gave {rows} records, not {records}")
    return sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress) / 1000


def memory_stream_read(spark: Any, files: list[str], records: int, topic: str) -> float:
    """Seconds of the micro-batch of a query draining the in-memory streaming source."""
    return _one_batch_stream(spark, MemoryStreamSource.name(),
                             {"files": ",".join(files), "records": str(records), "topic": topic},
                             records)


def parquet_floor_read(spark: Any, partitions: list[list[str]], records: int,
                       topic: str) -> float:
    """Seconds of the micro-batch of a query draining the Parquet floor source."""
    return _one_batch_stream(spark, ParquetFloorSource.name(),
                             {"partitions": ";".join(",".join(p) for p in partitions),
                              "topic": topic}, records)


def memory_read(spark: Any, files: list[str], records: int, topic: str) -> float:
    """Seconds for the in-memory Python data source to hand Spark `records` records, one
    partition per leader (as the stream has), into the noop sink."""
    start = time.perf_counter()
    (spark.read.format(MemorySource.name()).option("files", ",".join(files))
     .option("records", str(records)).option("topic", topic).load()
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - start


def sql_read(spark: Any, bootstrap: str, topic: str) -> float:
    """Seconds for SQL over the topic on Spark's Parquet reader: registering its snapshot view
    (offsets and files resolved on the driver) and selecting every record into the noop sink."""
    start = time.perf_counter()
    view = register_topic_views(spark, bootstrap, [topic], snapshot=True)[topic]
    (spark.sql(f"SELECT {SQL_COLUMNS} FROM {view}")
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - start


def sql_count(spark: Any, bootstrap: str, topic: str) -> int:
    """The records SQL over the topic's snapshot view counts (a check, not timed)."""
    view = register_topic_views(spark, bootstrap, [topic], snapshot=True)[topic]
    return int(spark.sql(f"SELECT count(*) AS n FROM {view}").first().n)


def stream_drain(spark: Any, bootstrap: str, topic: str) -> dict[str, float]:
    """A query from the earliest offsets until the topic is drained (availableNow)."""
    with tempfile.TemporaryDirectory(prefix="deltabus-bench-checkpoint-") as checkpoint:
        start = time.perf_counter()
        query = (spark.readStream.format("deltabus")
                 .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
                 .option("startingOffsets", "earliest").load()
                 .writeStream.format("noop").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        wall = time.perf_counter() - start
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    trigger_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    return {"rows": rows, "trigger_s": trigger_s, "wall_s": wall, "batches": len(progress)}


def drain_vs_parquet(spark: Any, bootstrap: str, values: pa.Table, records: int,
                     rounds: int) -> dict[str, Any]:
    """Medians of `rounds` interleaved rounds of the direct read, the in-memory ceiling, the
    streaming query and SQL on the Parquet path, each round's figures kept beside them."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(MemorySource)
    spark.dataSource.register(MemoryStreamSource)
    spark.dataSource.register(ParquetFloorSource)
    run_id = uuid.uuid4().hex[:8]
    warm, topic = f"bench-drain-warm-{run_id}", f"bench-drain-{run_id}"
    timed: list[dict[str, float]] = []
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(warm, PARTITIONS, 1), NewTopic(topic, PARTITIONS, 1)])
        try:
            fill(bootstrap, warm, values, min(WARM_UP_RECORDS_MAX, records))
            direct_read(spark, leader_files(bootstrap, warm))
            stream_drain(spark, bootstrap, warm)
            sql_read(spark, bootstrap, warm)
            fill(bootstrap, topic, values, records)
            by_partition = leader_files_by_partition(bootstrap, topic)
            files = [uri for p in by_partition for uri in p]
            memory_files = [files[0]] * PARTITIONS
            if (counted := sql_count(spark, bootstrap, topic)) != records:
                raise RuntimeError(f"SQL counted {counted} records, not {records}")
            for i in range(rounds + 1):  # the first round warms up
                direct_s = direct_read(spark, files)
                memory_s = memory_read(spark, memory_files, records, topic)
                memory_stream_s = memory_stream_read(spark, memory_files, records, topic)
                floor_s = parquet_floor_read(spark, by_partition, records, topic)
                stream = stream_drain(spark, bootstrap, topic)
                sql_s = sql_read(spark, bootstrap, topic)
                if stream["rows"] != records:
                    raise RuntimeError(f"the query read {stream['rows']} records, not {records}")
                if i:
                    timed.append({"direct_rps": records / direct_s,
                                  "memory_rps": records / memory_s,
                                  "memory_stream_rps": records / memory_stream_s,
                                  "parquet_floor_rps": records / floor_s,
                                  "stream_rps": records / stream["trigger_s"],
                                  "stream_wall_rps": records / stream["wall_s"],
                                  "sql_rps": records / sql_s})
        finally:
            admin.delete_topics([warm, topic])
    median = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
    return {"records": records, **median,
            "stream_vs_direct": median["stream_rps"] / median["direct_rps"],
            "memory_vs_direct": median["memory_rps"] / median["direct_rps"],
            "stream_vs_memory": median["stream_rps"] / median["memory_rps"],
            "stream_vs_memory_stream": median["stream_rps"] / median["memory_stream_rps"],
            "parquet_floor_vs_memory_stream": (median["parquet_floor_rps"]
                                               / median["memory_stream_rps"]),
            "stream_vs_parquet_floor": median["stream_rps"] / median["parquet_floor_rps"],
            "sql_vs_direct": median["sql_rps"] / median["direct_rps"],
            "micro_batches": stream["batches"], "rounds": timed}
