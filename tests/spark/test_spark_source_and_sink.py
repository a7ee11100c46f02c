"""The `deltabus` Spark data source against the shared cluster: Kafka-source columns and options,
exact micro-batches from live producers, restarts from a checkpoint, an exactly-once sink, SQL
views, query progress as a consumer group, and a broker failover while a query runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from deltabus import AdminClient, AlterConfigOp, NewTopic, Producer
from deltabus.config import SET
from deltabus.spark import register_topic_views
from tests.conftest import wait_until

pytestmark = pytest.mark.spark


def create(cluster, topic: str, partitions: int = 3, rf: int = 3) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, rf)])


def produce(cluster, topic: str, values: list[str], **kwargs) -> None:
    with Producer(cluster.bootstrap_servers) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, key=f"k{i % 13}", **kwargs)


def produce_until(cluster, topic: str, stop: threading.Event, produced: list[str], prefix: str,
                  keys: int) -> None:
    """A live producer: `prefix`NNNNNN values over `keys` keys until `stop`, noting each."""
    with Producer(cluster.bootstrap_servers, linger_ms=5) as producer:
        i = 0
        while not stop.is_set():
            value = f"{prefix}{i:06d}"
            producer.send(topic, value, key=f"k{i % keys}")
            produced.append(value)
            i += 1
            if i % 20 == 0:
                time.sleep(0.02)


def source(spark, cluster, kind: str = "read", **options: str):
    reader = spark.read if kind == "read" else spark.readStream
    reader = reader.format("deltabus").option("kafka.bootstrap.servers", cluster.bootstrap_servers)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def finished(query):
    """Wait for an availableNow query to end; its failure, or None."""
    try:
        query.awaitTermination(180)
    except StreamingQueryException as e:
        return e
    return query.exception()


def await_micro_batches(query, count: int, stall_s: float = 120) -> None:
    """Wait until the query has run `count` micro-batches. Waits on progress, not a clock: as
    long as the query's status moves (a trigger starts or ends, a batch completes), a loaded
    machine only makes this slower; it fails when the query stopped, failed, or stood still
    for `stall_s` (CI: a fixed 60 s ran out on a loaded 2-core machine)."""
    seen, moved = None, time.monotonic()
    while len(query.recentProgress) < count:
        if query.exception() is not None or not query.isActive:
            raise AssertionError(f"the query ended before {count} micro-batches: "
                                 f"{query.exception()}")
        now = (len(query.recentProgress), query.status["message"],
               query.status["isTriggerActive"])
        if now != seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise AssertionError(f"the query made no progress for {stall_s} s: {now}")
        time.sleep(0.05)


def rows_written(spark, path: Path) -> int:
    """Rows a streaming file sink has committed so far (0 before its first batch)."""
    if not (path / "_spark_metadata" / "0").exists():
        return 0
    return spark.read.parquet(str(path)).count()


def values_of(df) -> list[str]:
    return [r[0] for r in df.selectExpr("cast(value as string)").collect()]


def test_batch_read_gives_the_kafka_source_columns_and_every_record(spark, cluster, topic_name):
    create(cluster, topic_name)
    sent = [f"v{i}" for i in range(600)]
    produce(cluster, topic_name, sent, headers=[("trace", b"t1")])
    df = source(spark, cluster, subscribe=topic_name, includeHeaders="true")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>")]
    rows = df.collect()
    assert sorted(r.value.decode() for r in rows) == sorted(sent)
    for p in range(3):
        offsets = sorted(r.offset for r in rows if r.partition == p)
        assert offsets == list(range(len(offsets)))  # every offset, once
    assert {r.topic for r in rows} == {topic_name}
    assert all(r.headers[0].key == "trace" and r.headers[0].value == b"t1" for r in rows)
    by_key = {}
    for r in rows:  # a key always lands in one partition
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())
    assert "headers" not in source(spark, cluster, subscribe=topic_name).columns


def test_batch_read_honours_offsets_json_assign_and_pattern(spark, cluster, topic_name):
    create(cluster, topic_name, partitions=2)
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(20):
            producer.send(topic_name, f"a{i}", partition=0)
            producer.send(topic_name, f"b{i}", partition=1)
    df = source(spark, cluster, subscribe=topic_name,
                startingOffsets=f'{{"{topic_name}":{{"0":5,"1":-2}}}}',
                endingOffsets=f'{{"{topic_name}":{{"0":8,"1":-1}}}}')
    assert sorted(values_of(df)) == sorted([f"a{i}" for i in range(5, 8)]
                                           + [f"b{i}" for i in range(20)])
    assigned = source(spark, cluster, assign=f'{{"{topic_name}":[1]}}')
    assert sorted(values_of(assigned)) == sorted(f"b{i}" for i in range(20))
    pattern = source(spark, cluster, subscribePattern=topic_name[:-3] + ".*")
    assert pattern.count() >= 40
    split = source(spark, cluster, subscribe=topic_name, minPartitions="6")
    assert split.rdd.getNumPartitions() >= 6 and split.count() == 40


def test_batch_read_from_a_timestamp(spark, cluster, topic_name):
    create(cluster, topic_name, partitions=2)
    produce(cluster, topic_name, [f"old{i}" for i in range(10)])
    time.sleep(0.05)
    since_ms = int(time.time() * 1000)
    produce(cluster, topic_name, [f"new{i}" for i in range(10)])
    df = source(spark, cluster, subscribe=topic_name, startingTimestamp=str(since_ms))
    assert sorted(values_of(df)) == sorted(f"new{i}" for i in range(10))


def test_a_query_whose_topic_was_deleted_fails_unless_fail_on_data_loss_is_false(
        spark, cluster, topic_name, tmp_path: Path):
    create(cluster, topic_name, partitions=1)
    produce(cluster, topic_name, ["a", "b"])

    def run(checkpoint: Path, **options: str):
        return finished(source(spark, cluster, "stream", subscribe=topic_name,
                               startingOffsets="earliest", **options)
                        .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
                        .trigger(availableNow=True).start())

    for checkpoint in ("strict", "lenient"):
        assert run(tmp_path / checkpoint) is None
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.delete_topics([topic_name])
    failed = run(tmp_path / "strict")
    assert failed is not None and "set the source option failOnDataLoss to false" in str(failed)
    assert run(tmp_path / "lenient", failOnDataLoss="false") is None


@pytest.mark.parametrize("options, message", [
    ({}, "exactly one of the options assign, subscribe and subscribePattern"),
    ({"subscribe": "a", "assign": '{"a":[0]}'}, "exactly one of the options"),
    ({"subscribe": "a", "startingOffsets": "{oops"}, "option startingoffsets must be"),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "-5"}, "must be a positive number"),
    ({"subscribe": "a", "failOnDataLoss": "maybe"}, "must be true or false"),
])
def test_bad_options_fail_with_a_message_naming_the_option(spark, cluster, options, message):
    with pytest.raises(Exception, match=message):
        source(spark, cluster, **options).collect()


def test_stream_from_live_producers_restarted_from_its_checkpoint_neither_skips_nor_repeats(
        spark, cluster, topic_name, tmp_path: Path):
    create(cluster, topic_name)
    produced: list[str] = []
    stop = threading.Event()

    def keep_producing() -> None:
        produce_until(cluster, topic_name, stop, produced, "r", 17)

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(**trigger):
        stream = source(spark, cluster, "stream", subscribe=topic_name,
                        startingOffsets="earliest", maxOffsetsPerTrigger="700")
        return (stream.selectExpr("cast(value as string) as value", "partition", "offset")
                .writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    producer = threading.Thread(target=keep_producing)
    producer.start()
    try:
        query = start(processingTime="100 milliseconds")
        await_micro_batches(query, 3)
        query.stop()
        first_run = query.recentProgress
        query = start(processingTime="100 milliseconds")  # the same checkpoint
        await_micro_batches(query, 2)
        query.stop()
    finally:
        stop.set()
        producer.join()
    query = start(availableNow=True)  # drain what is left
    assert query.awaitTermination(180) and query.exception() is None
    assert all(p["numInputRows"] <= 700 for p in first_run + query.recentProgress)
    written = spark.read.parquet(str(out)).collect()
    values = [r.value for r in written]
    assert len(values) == len(set(values)), "a record was read twice"
    assert sorted(values) == sorted(produced), "a record was skipped"


def test_stream_sink_writes_a_replayed_micro_batch_once(spark, cluster, topic_name,
                                                      tmp_path: Path):
    source_topic, target = topic_name, topic_name + "-out"
    create(cluster, source_topic)
    create(cluster, target, partitions=2)
    produce(cluster, source_topic, [f"e{i}" for i in range(900)])
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        query = (source(spark, cluster, "stream", subscribe=source_topic,
                        startingOffsets="earliest", maxOffsetsPerTrigger="300")
                 .selectExpr("key", "upper(cast(value as string)) as value")
                 .writeStream.format("deltabus")
                 .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
                 .option("topic", target).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(180) and query.exception() is None

    run()
    # As if the query died after writing its last micro-batch but before recording it done:
    # Spark runs that batch again on restart.
    commits = sorted((f for f in (checkpoint / "commits").iterdir() if f.name.isdigit()),
                     key=lambda f: int(f.name))
    replayed = commits[-1]
    replayed.unlink()
    (replayed.parent / f".{replayed.name}.crc").unlink(missing_ok=True)
    run()
    assert (checkpoint / "commits" / replayed.name).exists()  # the batch did run again
    out = values_of(source(spark, cluster, subscribe=target))
    assert len(out) == 900 and set(out) == {f"E{i}" for i in range(900)}


def test_batch_sink_takes_the_kafka_sink_columns(spark, cluster, topic_name):
    create(cluster, topic_name, partitions=2)
    rows = [(f"k{i}", f"w{i}", topic_name) for i in range(50)]
    (spark.createDataFrame(rows, "key string, value string, topic string")
     .write.format("deltabus").mode("append")
     .option("kafka.bootstrap.servers", cluster.bootstrap_servers).save())
    df = source(spark, cluster, subscribe=topic_name)
    assert sorted(values_of(df)) == sorted(f"w{i}" for i in range(50))
    with pytest.raises(Exception, match="needs a topic column or the topic option"):
        (spark.createDataFrame([("x",)], "value string").write.format("deltabus").mode("append")
         .option("kafka.bootstrap.servers", cluster.bootstrap_servers).save())


def test_topics_as_sql_views_and_query_progress_as_a_consumer_group(
        spark, cluster, topic_name, tmp_path: Path):
    create(cluster, topic_name)
    produce(cluster, topic_name, [f"p{i}" for i in range(120)])
    views = register_topic_views(spark, cluster.bootstrap_servers, [topic_name])
    view = views[topic_name]
    assert "-" not in view
    assert spark.sql(f"SELECT count(*) AS n FROM {view}").first().n == 120
    produce(cluster, topic_name, ["late"])
    assert spark.sql(f"SELECT count(*) AS n FROM {view}").first().n == 121  # always current

    group = f"{topic_name}-query"
    query = (source(spark, cluster, "stream", subscribe=topic_name, startingOffsets="earliest",
                    **{"kafka.group.id": group})
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    with AdminClient(cluster.bootstrap_servers) as admin:
        committed = admin.list_consumer_group_offsets(group)
    assert sum(committed.values()) == 121 and len(committed) == 3


def test_a_stream_goes_on_through_a_leader_failover(spark, cluster, topic_name, tmp_path: Path,
                                                    all_brokers_back):
    create(cluster, topic_name)
    produce(cluster, topic_name, [f"before{i}" for i in range(300)])
    out = tmp_path / "out"
    query = (source(spark, cluster, "stream", subscribe=topic_name, startingOffsets="earliest")
             .selectExpr("cast(value as string) as value")
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        wait_until(lambda: rows_written(spark, out) == 300, "the first records")
        leader = cluster.controller.image().partition(topic_name, 0).leader
        cluster.kill_broker(leader, relaunch=False)
        wait_until(lambda: cluster.controller.image().partition(topic_name, 0).leader
                   not in (leader, -1), "a new leader")
        produce(cluster, topic_name, [f"after{i}" for i in range(300)])
        wait_until(lambda: rows_written(spark, out) == 600,
                   "the records sent after the failover")
        assert query.exception() is None
    finally:
        query.stop()
    values = values_of(spark.read.parquet(str(out)))
    assert sorted(values) == sorted([f"before{i}" for i in range(300)]
                                    + [f"after{i}" for i in range(300)])
    shutil.rmtree(out)


def test_a_killed_query_restarted_from_its_checkpoint_neither_skips_nor_repeats(
        spark, cluster, topic_name, tmp_path: Path):
    """SIGKILL the query's driver and JVM mid-stream, while producers send; a new process on
    the same checkpoint then reads on from exactly where the killed one's output ends."""
    create(cluster, topic_name)
    script = Path(__file__).with_name("stream_query_process.py")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = [sys.executable, str(script), cluster.bootstrap_servers, topic_name, str(out),
            str(checkpoint)]
    produced: list[str] = []
    stop = threading.Event()

    def keep_producing() -> None:
        produce_until(cluster, topic_name, stop, produced, "x", 11)

    produce(cluster, topic_name, [f"w{i:06d}" for i in range(300)])  # the first batch
    produced.extend(f"w{i:06d}" for i in range(300))
    producer = threading.Thread(target=keep_producing)
    query = subprocess.Popen([*args, "run"], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert query.stdout is not None
        for line in query.stdout:  # a few micro-batches in, kill it
            if line.startswith("progress 1") and not producer.is_alive():
                producer.start()  # the query is up: records arrive while it runs
            if line.startswith("progress 4"):
                break
        os.killpg(query.pid, signal.SIGKILL)
        query.wait(60)
    finally:
        stop.set()
        if producer.is_alive():
            producer.join()
        if query.poll() is None:
            os.killpg(query.pid, signal.SIGKILL)
    killed_at = rows_written(spark, out)
    assert 0 < killed_at < len(produced)
    drain = subprocess.run([*args, "drain"], capture_output=True, text=True, timeout=300)
    assert "drained" in drain.stdout, drain.stderr[-3000:]
    values = [r.value for r in spark.read.parquet(str(out)).collect()]
    assert len(values) == len(set(values)), "a record was read twice"
    assert sorted(values) == sorted(produced), "a record was skipped"


def test_a_query_behind_the_log_start_after_retention_follows_fail_on_data_loss(
        spark, cluster, topic_name, tmp_path: Path):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {"file.delete.delay.ms": "0"})])
    two_hours_ago = int(time.time() * 1000) - 2 * 3_600_000

    def run(name: str, **options: str):
        return finished(source(spark, cluster, "stream", subscribe=topic_name,
                               startingOffsets="earliest", **options)
                        .selectExpr("cast(value as string) as value", "offset")
                        .writeStream.format("parquet").option("path", str(tmp_path / name))
                        .option("checkpointLocation", str(tmp_path / f"{name}-checkpoint"))
                        .trigger(availableNow=True).start())

    produce(cluster, topic_name, [f"old-{i}" for i in range(50)], timestamp_ms=two_hours_ago)
    for name in ("strict", "lenient"):
        assert run(name) is None and rows_written(spark, tmp_path / name) == 50
    produce(cluster, topic_name, [f"old-{i}" for i in range(50, 100)], timestamp_ms=two_hours_ago)
    produce(cluster, topic_name, [f"new-{i}" for i in range(50)])
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.incremental_alter_configs(
            {topic_name: [AlterConfigOp("retention.ms", SET, "3600000")]})
    result = [r for r in cluster.log_cleaner.run([topic_name])][0]
    assert result.log_start_offset == 100  # offsets 50-99 went before either query read them

    failed = run("strict")
    assert failed is not None and "set the source option failOnDataLoss to false" in str(failed)
    assert run("lenient", failOnDataLoss="false") is None
    rows = spark.read.parquet(str(tmp_path / "lenient")).orderBy("offset").collect()
    assert [r.offset for r in rows] == [*range(50), *range(100, 150)]
