"""`read_topic` and snapshot views (deltabus/spark/parquet_reads.py) against the shared cluster:
Spark's own Parquet reader gives exactly the rows the Python source gives for the same options
(ranges, markers, isolation levels, the high watermark, compacted and truncated logs)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltabus import AdminClient, NewTopic, Producer, errors
from deltabus.log_tables.layout import replica_path
from deltabus.records import LOG_SCHEMA
from deltabus.spark import DataLossError, parquet_reads, read_topic, register_topic_views
from deltabus.spark.parquet_reads import spark_reads

KEYS = 20


def create(cluster, topic: str, partitions: int, rf: int = 1,
           configs: dict[str, str] | None = None) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, rf, configs)])


def python_source(spark, cluster, topic: str, **options: str):
    reader = (spark.read.format("deltabus")
              .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
              .option("subscribe", topic))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def by_offset(df) -> list[Any]:
    """Every row of `df`, in (topic, partition, offset) order."""
    return sorted(df.collect(), key=lambda r: (r.topic, r.partition, r.offset))


def columns(df) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in df.schema.fields]


def test_the_parquet_path_gives_the_python_source_rows_of_every_range(
        spark, cluster, topic_name) -> None:
    create(cluster, topic_name, 3, 3)
    with Producer(cluster.bootstrap_servers) as producer:
        for r in range(4):  # a commit, and so a file, per round and partition
            for i in range(30):  # keyless records to a partition of the test's choosing:
                producer.send(topic_name, None if i == 7 else f"v{r}-{i}",  # counts are fixed
                              key=None if i % 5 == 0 else f"k{i % 11}",
                              headers=[("round", str(r).encode())] if i % 2 else None,
                              partition=(r + i) % 3 if i % 5 == 0 else None)
            producer.flush()
    for headers in ("true", "false"):
        want = python_source(spark, cluster, topic_name, includeHeaders=headers)
        got = read_topic(spark, cluster.bootstrap_servers, topic_name,
                         include_headers=headers == "true")
        assert columns(got) == columns(want)
        assert got.inputFiles() and not want.inputFiles()  # Parquet, and the Python source
        rows = by_offset(got)
        assert len(rows) == 120 and rows == by_offset(want)
    assert {r.partition for r in rows} == {0, 1, 2}

    start = f'{{"{topic_name}":{{"0":3,"1":-2,"2":30}}}}'
    end = f'{{"{topic_name}":{{"0":25,"1":-1,"2":30}}}}'
    ranged = by_offset(read_topic(spark, cluster.bootstrap_servers, topic_name,
                                  starting_offsets=start, ending_offsets=end))
    assert ranged == by_offset(python_source(spark, cluster, topic_name, startingOffsets=start,
                                             endingOffsets=end))
    assert [r.offset for r in ranged if r.partition == 0] == list(range(3, 25))
    assert not [r for r in ranged if r.partition == 2]
    empty = read_topic(spark, cluster.bootstrap_servers, topic_name, starting_offsets="latest")
    assert empty.count() == 0 and columns(empty) == columns(python_source(spark, cluster,
                                                                          topic_name))


def test_markers_are_never_rows_and_read_committed_leaves_aborted_and_open_out(
        spark, cluster, topic_name, monkeypatch) -> None:
    create(cluster, topic_name, 2, 3)
    tx = Producer(cluster.bootstrap_servers, transactional_id=f"{topic_name}-tx")
    try:
        tx.init_transactions()
        for outcome in ("kept", "dropped", "later", "open"):
            tx.begin_transaction()
            for i in range(10):
                tx.send(topic_name, f"{outcome}-{i}".encode(), partition=i % 2)
            if outcome == "dropped":
                tx.abort_transaction()
            elif outcome != "open":
                tx.commit_transaction()
        tx.flush()
        with Producer(cluster.bootstrap_servers) as plain:  # beside the open transaction
            for i in range(4):
                plain.send(topic_name, f"plain-{i}".encode(), partition=i % 2)
        cases = [("read_uncommitted", ("kept", "dropped", "later", "open", "plain")),
                 ("read_committed", ("kept", "later"))]
        # markers found from the footers (their offsets left out), or each row's producer_id
        # and sequence tested; past ABORTED_TXNS_MAX, read_committed is the Python source's
        for limits, parquet in (({}, True), ({"MARKER_SCAN_FILES_MAX": 0,
                                              "MARKER_OFFSETS_MAX": 0}, True),
                                ({"ABORTED_TXNS_MAX": 0}, False)):
            for name, value in limits.items():
                monkeypatch.setattr(parquet_reads, name, value)
            for level, outcomes in cases:
                df = read_topic(spark, cluster.bootstrap_servers, topic_name,
                                options={"kafka.isolation.level": level})
                assert bool(df.inputFiles()) == (parquet or level == "read_uncommitted")
                got = by_offset(df)
                assert got == by_offset(python_source(spark, cluster, topic_name, **{
                    "kafka.isolation.level": level})), (level, limits)
                assert sorted(r.value.decode() for r in got) == sorted(
                    f"{o}-{i}" for o in outcomes for i in range(4 if o == "plain" else 10))
            monkeypatch.undo()
        # the 3 markers of each partition hold offsets no row has
        offsets = [r.offset for r in read_topic(spark, cluster.bootstrap_servers, topic_name)
                   .where("partition = 0").collect()]
        assert len(offsets) == 22 and max(offsets) == 24
    finally:
        with contextlib.suppress(errors.DeltaBusError):  # none open if the test failed early
            tx.abort_transaction()
        tx.close()


def test_records_at_or_above_the_high_watermark_are_not_read(spark, cluster, topic_name) -> None:
    """Rows the leader's table holds past the high watermark (as a leader's commit that its
    followers have not fetched yet): neither reader returns them."""
    create(cluster, topic_name, 1)
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(10):
            producer.send(topic_name, f"v{i}", partition=0)
    leader = cluster.controller.image().partition(topic_name, 0).leader
    now = int(time.time() * 1_000_000)
    beyond = pa.Table.from_pylist(
        [{"offset": o, "timestamp": now, "timestamp_type": 0, "key": None, "value": b"beyond",
          "headers": None, "producer_id": -1, "producer_epoch": -1, "sequence": -1,
          "leader_epoch": 0} for o in range(10, 15)], schema=LOG_SCHEMA)
    write_deltalake(replica_path(cluster.config.root, topic_name, 0, leader), beyond,
                    mode="append")
    try:
        got = by_offset(read_topic(spark, cluster.bootstrap_servers, topic_name))
        assert [r.offset for r in got] == list(range(10))
        assert got == by_offset(python_source(spark, cluster, topic_name))
    finally:
        with AdminClient(cluster.bootstrap_servers) as admin:  # its log is not the broker's
            admin.delete_topics([topic_name])


def test_a_compacted_or_truncated_log_reads_only_its_current_files(
        spark, cluster, topic_name) -> None:
    compacted = f"{topic_name}-compacted"
    create(cluster, compacted, 1, configs={"cleanup.policy": "compact",
                                           "min.compaction.lag.ms": "0",
                                           "file.delete.delay.ms": "0"})
    with Producer(cluster.bootstrap_servers) as producer:
        for r in range(5):  # each round updates every key: a file per round
            for k in range(KEYS):
                producer.send(compacted, f"v{r}", key=f"k{k}", partition=0)
            producer.flush()
    assert cluster.log_cleaner.run([compacted])[0].error == ""
    got = by_offset(read_topic(spark, cluster.bootstrap_servers, compacted))
    assert got == by_offset(python_source(spark, cluster, compacted))
    assert KEYS <= len(got) < 5 * KEYS  # the removed files, deleted at once, are not listed
    assert {r.key: r.value for r in got} == {f"k{k}".encode(): b"v4" for k in range(KEYS)}

    create(cluster, topic_name, 1)
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(10):  # one file: it straddles the new log start
            producer.send(topic_name, f"v{i}", partition=0)
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.delete_records({(topic_name, 0): 4})
    offsets = [r.offset for r in by_offset(read_topic(spark, cluster.bootstrap_servers,
                                                      topic_name))]
    assert offsets == list(range(4, 10))
    from_zero = f'{{"{topic_name}":{{"0":0}}}}'
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        read_topic(spark, cluster.bootstrap_servers, topic_name, starting_offsets=from_zero)
    lenient = read_topic(spark, cluster.bootstrap_servers, topic_name,
                         starting_offsets=from_zero, options={"failOnDataLoss": "false"})
    assert [r.offset for r in by_offset(lenient)] == list(range(4, 10))


def test_snapshot_views_are_fixed_until_registered_again(spark, cluster, topic_name) -> None:
    create(cluster, topic_name, 2)
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(40):
            producer.send(topic_name, f"s{i}", key=f"k{i % 7}")
    view = register_topic_views(spark, cluster.bootstrap_servers, [topic_name],
                                snapshot=True)[topic_name]
    count = f"SELECT count(*) AS n FROM {view}"
    assert spark.sql(count).first().n == 40
    assert columns(spark.table(view)) == columns(python_source(spark, cluster, topic_name,
                                                               includeHeaders="true"))
    with Producer(cluster.bootstrap_servers) as producer:
        producer.send(topic_name, "late", key="k0").get(30)
    assert spark.sql(count).first().n == 40  # a snapshot: its files and high watermark
    register_topic_views(spark, cluster.bootstrap_servers, [topic_name], snapshot=True)
    assert spark.sql(count).first().n == 41


def test_only_stores_spark_has_a_filesystem_for_take_the_parquet_path(spark, tmp_path) -> None:
    assert spark_reads(spark, str(tmp_path))
    assert spark_reads(spark, f"file://{tmp_path}")
    # pip's PySpark bundles no S3 or Azure filesystem: those reads stay on the Python source
    assert not spark_reads(spark, "s3://bucket/deltabus/topics/t/0/replica-0")
    assert not spark_reads(spark, "abfss://data@account.dfs.core.windows.net/deltabus")
