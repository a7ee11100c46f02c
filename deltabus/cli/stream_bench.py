"""Bench step (j): a Structured Streaming query draining a topic, against Spark reading the same
Parquet files directly.

Both run in the same Spark session, on the same data files (the partition leaders' Delta
tables), with the same columns into Spark's `noop` sink, after one warm-up of each on a small
topic (JIT and Python workers). The streaming rate is Spark's own measure, input rows over the
micro-batches' trigger time (`processedRowsPerSecond`); the wall time from `start()` to the end,
query start-up included, is reported beside it.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from deltabus.log_tables.layout import replica_path
from deltabus.metadata import NewTopic
from deltabus.rpc.admin import AdminClient
from deltabus.rpc.consumer import Consumer
from deltabus.rpc.producer import Producer

PARTITIONS = 4
WARM_UP_RECORDS = 200_000
COLUMNS = ["key", "value", "offset", "timestamp", "timestamp_type"]  # what the source reads


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


def leader_files(bootstrap: str, topic: str) -> list[str]:
    """The Parquet files of the partition leaders' tables."""
    consumer = Consumer(bootstrap)
    try:
        image = consumer.metadata()
    finally:
        consumer.close()
    state = image.topics[topic]
    return [uri for p in state.partitions
            for uri in DeltaTable(replica_path(image.log_root, topic, p.partition,
                                               p.leader)).file_uris()]


def direct_read(spark: Any, files: list[str]) -> float:
    """Seconds for Spark's own Parquet reader to read the files into the noop sink."""
    start = time.perf_counter()
    spark.read.parquet(*files).select(*COLUMNS).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def stream_drain(spark: Any, bootstrap: str, topic: str) -> dict[str, float]:
    """A query from the earliest offsets until the topic is drained (availableNow)."""
    checkpoint = tempfile.mkdtemp(prefix="deltabus-bench-checkpoint-")
    start = time.perf_counter()
    query = (spark.readStream.format("deltabus").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
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


def drain_vs_parquet(spark: Any, bootstrap: str, values: pa.Table,
                     records: int) -> dict[str, float]:
    run_id = uuid.uuid4().hex[:8]
    warm, topic = f"bench-drain-warm-{run_id}", f"bench-drain-{run_id}"
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(warm, PARTITIONS, 1), NewTopic(topic, PARTITIONS, 1)])
        try:
            fill(bootstrap, warm, values, WARM_UP_RECORDS)
            direct_read(spark, leader_files(bootstrap, warm))
            stream_drain(spark, bootstrap, warm)
            fill(bootstrap, topic, values, records)
            direct_s = direct_read(spark, leader_files(bootstrap, topic))
            stream = stream_drain(spark, bootstrap, topic)
        finally:
            admin.delete_topics([warm, topic])
    if stream["rows"] != records:
        raise RuntimeError(f"the query read {stream['rows']} records, not {records}")
    direct_rps = records / direct_s
    stream_rps = records / stream["trigger_s"]
    return {"records": records, "direct_rps": direct_rps, "stream_rps": stream_rps,
            "stream_vs_direct": stream_rps / direct_rps,
            "stream_wall_rps": records / stream["wall_s"],
            "micro_batches": stream["batches"]}
