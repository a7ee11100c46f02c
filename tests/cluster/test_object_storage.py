"""A cluster whose root is on S3 (moto's server on loopback) or ADLS (Azurite), reached with
the options given to `Cluster(...)` only (tests/object_stores.py): no AWS variable in any
process's environment, as a notebook user passes them (issue 18). Before, brokers failed with
"failed to load IMDS session token" and producers got NOT_LEADER_OR_FOLLOWER unless every
process had the options in its environment, since deltabus's own file operations ignored
them."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from deltalake import DeltaTable

from deltabus import (
    AdminClient,
    AlterConfigOp,
    Cluster,
    Consumer,
    NewTopic,
    Producer,
    TopicPartition,
)
from deltabus.config import SET
from deltabus.log_tables.layout import replica_path
from deltabus.spark import register
from deltabus.storage import Storage
from tests.cluster.test_compaction import COMPACTED, KEYS, produce_rounds, read_all
from tests.cluster.test_retention import HOUR_MS, earliest, produce_batches
from tests.conftest import read_records, wait_until
from tests.soak.fault_injection import FaultPlan, run

RECORDS = 300
# What would let a process reach the emulator without the options (a CA bundle would not).
REACH_S3 = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
            "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP"}


@pytest.fixture(autouse=True)
def no_aws_environment(spark: Any) -> Iterator[None]:
    """The options reach every broker with its config, or not at all: the driver and the
    Spark workers (started from the driver's environment) hold no AWS setting. Afterwards the
    session's `format("deltabus")` goes back to reading without this cluster's options."""
    assert not [key for key in os.environ if key in REACH_S3 or key.startswith(
        "AWS_ENDPOINT_URL")]
    yield
    register(spark)


def _start(spark: Any, root: str, options: dict[str, str]) -> Cluster:
    return Cluster(spark, root=root, brokers=3, port=0, storage_options=options).start()


@pytest.fixture(params=["s3", "azurite"])
def store(request: pytest.FixtureRequest) -> Any:
    """An object-store emulator: moto's S3 server or Azurite (ADLS, abfss:// roots)."""
    return request.getfixturevalue(request.param)


def test_topics_records_groups_and_spark_reads_survive_a_restart(spark, store, caplog) -> None:
    caplog.set_level(logging.INFO)
    bucket = store.create_bucket(f"cluster-{uuid.uuid4().hex[:8]}")
    root = f"{bucket}/deltabus"
    storage = Storage(root, store.options())
    cluster = _start(spark, root, store.options())
    try:
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("orders", 2, 3, {"min.insync.replicas": "2"})])
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            for i in range(RECORDS):
                producer.send("orders", f"o{i}".encode(), key=f"k{i}".encode())
            producer.flush(60)
        records = read_records(cluster.bootstrap_servers, "orders", 2, RECORDS)
        assert sorted(r.value for r in records) == sorted(f"o{i}".encode()
                                                          for i in range(RECORDS))
        for broker in range(3):  # every replica's table is in the bucket
            assert storage.exists(f"{replica_path(root, 'orders', 0, broker)}/_delta_log")
        with Consumer(cluster.bootstrap_servers, group_id="billing",
                      enable_auto_commit=False) as consumer:
            consumer.commit({TopicPartition("orders", 0): 17})
        count = (spark.read.format("deltabus")
                 .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
                 .option("subscribe", "orders").load().count())
        assert count == RECORDS
    finally:
        cluster.stop()
    again = _start(spark, root, store.options())
    try:
        records = read_records(again.bootstrap_servers, "orders", 2, RECORDS)
        assert len(records) == RECORDS
        with Consumer(again.bootstrap_servers, group_id="billing") as consumer:
            tp = TopicPartition("orders", 0)
            assert consumer.committed(tp).offset == 17  # the group resumes where it was
        with Producer(again.bootstrap_servers, acks="all") as producer:
            assert producer.send("orders", b"more", partition=1).get(60).offset == sum(
                1 for r in records if r.partition == 1)
    finally:
        again.stop()
    # The secret is in no log line of the driver (controller, coordinator, cluster), and in no
    # file of the root: metadata log, offsets, tables.
    assert "broker 2 registered" in caplog.text  # the controller's log lines are there
    assert store.secret_key not in caplog.text
    written = list(storage._keys(root))
    assert len(written) > 20 and not any(
        store.secret_key.encode() in storage.read_bytes(f"{bucket}/{key}") for key in written)


def test_retention_compaction_and_small_file_merges_on_object_storage(spark, store) -> None:
    """The log cleaner's Spark job on the store: retention removes the expired files (and
    vacuum deletes them from the bucket), merges rewrite the small files, and consumers read
    what is left from the new log start; key compaction leaves the latest value of each key,
    at its offset, and its rewritten files are vacuumed too."""
    root = f"{store.create_bucket(f'cleaner-{uuid.uuid4().hex[:8]}')}/deltabus"
    storage = Storage(root, store.options())
    cluster = Cluster(spark, root=root, brokers=1, port=0,
                      storage_options=store.options()).start()
    try:
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("events", 1, 1, {"file.delete.delay.ms": "0"}),
                                 NewTopic("accounts", 1, 1, COMPACTED)])
        produce_batches(cluster, "events", 3, int(time.time() * 1000) - 2 * HOUR_MS)
        produce_batches(cluster, "events", 4, None, size=10)
        path = replica_path(root, "events", 0, 0)
        before = set(DeltaTable(path, storage_options=store.options()).file_uris())
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.incremental_alter_configs(
                {"events": [AlterConfigOp("retention.ms", SET, str(HOUR_MS))]})
        retained = cluster.log_cleaner.run(["events"])[0]
        assert (retained.error, retained.log_start_offset) == ("", 150)
        merged = cluster.log_cleaner.run(["events"], merge_min_age_ms=0)[0]
        # the three older small files become one; the newest, Kafka's active segment, stays
        assert merged.error == "" and merged.merged[0].merged_files == 3, merged.merged
        after = set(DeltaTable(path, storage_options=store.options()).file_uris())
        assert len(after) == 2
        assert not any(storage.exists(uri) for uri in before - after)  # vacuumed away
        wait_until(lambda: earliest(cluster, "events") == 150, "the broker to see the start")
        records = read_records(cluster.bootstrap_servers, "events", 1, 40)
        assert [r.offset for r in records] == list(range(150, 190))

        with Producer(cluster.bootstrap_servers) as producer:
            produce_rounds(producer, "accounts", 0, 3)  # a file per round
        path = replica_path(root, "accounts", 0, 0)
        before = set(DeltaTable(path, storage_options=store.options()).file_uris())
        compacted = cluster.log_cleaner.run(["accounts"])[0]
        # The newest file (the active segment) is left as it is, as Kafka leaves its own.
        assert compacted.error == "" and compacted.compacted[0].removed == KEYS
        assert not any(storage.exists(uri) for uri in before - set(
            DeltaTable(path, storage_options=store.options()).file_uris()))
        kept = [(r * KEYS + k, f"k{k}".encode(), f"v{r}".encode())
                for r in (1, 2) for k in range(KEYS)]
        wait_until(lambda: read_all(cluster, "accounts") == kept,
                   "the broker to read the compacted log")
    finally:
        cluster.stop()


@pytest.mark.timeout(900)
def test_leader_kills_under_acks_all_on_adls_lose_nothing_acknowledged(spark, azurite) -> None:
    """On S3, test_standalone_cluster.py kills a whole machine under acks=all load."""
    root = f"{azurite.create_bucket(f'kills-{uuid.uuid4().hex[:8]}')}/deltabus"
    cluster = _start(spark, root, azurite.options())
    try:
        report = run(cluster, FaultPlan("payments", nemesis_s=20, fault_every_s=8,
                                        fault_jitter_s=2, kafka_producer=False,
                                        records_per_s=50, acked_before_nemesis=100))
        print(report.summary())
        report.assert_nothing_lost_or_reset()
        wait_until(lambda: len(cluster.controller.live_brokers()) == 3, "every broker back", 120)
    finally:
        cluster.stop()
