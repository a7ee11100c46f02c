"""The log cleaner on the shared 3-broker cluster. Retention: expired batches leave every
replica, the log start offset moves, consumers below it follow auto_offset_reset, a follower that
was down past the new log start starts again there, and the periodic cleaner does it by itself.
Small-file compaction: merges while producers and consumers run lose, duplicate and reorder
nothing."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import (
    AdminClient,
    AlterConfigOp,
    Consumer,
    NewTopic,
    Producer,
    TopicPartition,
    errors,
)
from deltabus.config import SET
from deltabus.log_tables.layout import replica_path
from tests.cluster.test_replication import kill_and_hold, wait_for_identical_replicas
from tests.conftest import wait_until

HOUR_MS = 3_600_000


def produce_batches(cluster, topic: str, batches: int, timestamp_ms: int | None,
                    size: int = 50) -> None:
    """`batches` commits of `size` records each (a flush per batch: a file per commit)."""
    with Producer(cluster.bootstrap_servers) as producer:
        for b in range(batches):
            for i in range(size):
                producer.send(topic, f"{b}-{i}".encode(), partition=0, timestamp_ms=timestamp_ms)
            producer.flush()


def table_offsets(cluster, topic: str, broker: int) -> tuple[int, int, int]:
    """(first offset, last offset, records) of one replica's table, from its file statistics."""
    actions = pa.table(DeltaTable(replica_path(cluster.config.root, topic, 0, broker))
                       .get_add_actions(flatten=True)).to_pydict()
    return (min(actions["min.offset"]), max(actions["max.offset"]), sum(actions["num_records"]))


def earliest(cluster, topic: str) -> int:
    with Consumer(cluster.bootstrap_servers) as consumer:
        tp = TopicPartition(topic, 0)
        return consumer.beginning_offsets([tp])[tp]


def first_offset_polled(cluster, topic: str, group: str, reset: str) -> int:
    consumer = Consumer(cluster.bootstrap_servers, group_id=group, auto_offset_reset=reset,
                        enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            records = consumer.poll(500)
            if records:
                return records[0].offset
        raise AssertionError("nothing polled")
    finally:
        consumer.close()


def test_retention_removes_expired_batches_from_every_replica_and_moves_the_log_start(
        cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"file.delete.delay.ms": "0"})])
    produce_batches(cluster, topic_name, 3, int(time.time() * 1000) - 2 * HOUR_MS)
    produce_batches(cluster, topic_name, 2, None)
    wait_for_identical_replicas(cluster, topic_name, 1)
    with Consumer(cluster.bootstrap_servers, group_id=f"{topic_name}-g") as consumer:
        consumer.commit({TopicPartition(topic_name, 0): 10})  # a group that stopped long ago
    files_before = {b: set(DeltaTable(replica_path(cluster.config.root, topic_name, 0, b))
                           .file_uris()) for b in range(3)}

    # nothing is due under the 7-day default
    result = [r for r in cluster.log_cleaner.run([topic_name])][0]
    assert (result.log_start_offset, result.error) == (-1, "")
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.incremental_alter_configs(
            {topic_name: [AlterConfigOp("retention.ms", SET, str(HOUR_MS))]})
    result = [r for r in cluster.log_cleaner.run([topic_name])][0]
    assert result.error == "" and result.log_start_offset == 150
    assert {b: r.records for b, r in result.removed.items()} == {0: 150, 1: 150, 2: 150}
    for broker in range(3):  # every replica keeps exactly the recent batches
        assert table_offsets(cluster, topic_name, broker) == (150, 249, 100)
    # file.delete.delay.ms=0: the removed files are off the disk too
    for broker, before in files_before.items():
        after = set(DeltaTable(replica_path(cluster.config.root, topic_name, 0, broker))
                    .file_uris())
        gone = before - after
        assert gone and not any(os.path.exists(uri.removeprefix("file://")) for uri in gone)

    wait_until(lambda: earliest(cluster, topic_name) == 150, "brokers to see the log start")
    # the group's committed offset 10 is gone: each policy as Kafka's consumer has it
    assert first_offset_polled(cluster, topic_name, f"{topic_name}-g", "earliest") == 150
    with pytest.raises(errors.OffsetOutOfRangeError, match="out of range"):
        first_offset_polled(cluster, topic_name, f"{topic_name}-g", "none")
    latest = Consumer(cluster.bootstrap_servers, group_id=f"{topic_name}-g",
                      auto_offset_reset="latest", enable_auto_commit=False)
    try:
        latest.assign([TopicPartition(topic_name, 0)])
        assert latest.poll(500) == []  # reset to the end: nothing yet
        produce_batches(cluster, topic_name, 1, None, size=5)
        records: list = []
        wait_until(lambda: records.extend(latest.poll(200)) or bool(records), "new records")
        assert records[0].offset == 250
    finally:
        latest.close()


def test_a_follower_down_past_the_new_log_start_starts_again_there(
        cluster, topic_name, all_brokers_back) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"file.delete.delay.ms": "0",
                                                         "retention.ms": str(HOUR_MS)})])
    two_hours_ago = int(time.time() * 1000) - 2 * HOUR_MS
    produce_batches(cluster, topic_name, 1, two_hours_ago)
    wait_for_identical_replicas(cluster, topic_name, 1)
    s = cluster.controller.image().partition(topic_name, 0)
    follower = next(r for r in s.replicas if r != s.leader)
    kill_and_hold(cluster, follower)
    # while it is down: batches that are already expired, then a recent one
    produce_batches(cluster, topic_name, 3, two_hours_ago)
    produce_batches(cluster, topic_name, 1, None)
    result = [r for r in cluster.log_cleaner.run([topic_name])][0]
    assert result.log_start_offset == 200, result
    assert table_offsets(cluster, topic_name, follower)[1] == 49  # it ends below 200
    cluster.start_broker(follower)
    wait_for_identical_replicas(cluster, topic_name, 1)
    assert table_offsets(cluster, topic_name, follower) == (200, 249, 50)


def test_the_periodic_cleaner_applies_retention_by_itself(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {"retention.bytes": "0"})])
    produce_batches(cluster, topic_name, 3, None)
    interval = cluster.log_cleaner.interval_s
    cluster.log_cleaner.interval_s = 0.5
    try:
        wait_until(lambda: earliest(cluster, topic_name) == 100,
                   "the periodic cleaner to apply retention.bytes=0 (all but the newest file)")
    finally:
        cluster.log_cleaner.interval_s = interval


def test_small_files_are_merged_while_producers_and_consumers_run(cluster, topic_name) -> None:
    """Many small commits on a replicated topic; the cleaner merges them twice while a producer
    keeps sending and a consumer keeps reading: every acknowledged record is read exactly once,
    in order, and every replica ends up with the same records in fewer files."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    stop, produced = threading.Event(), threading.Event()
    acked: list[int] = []
    read: list[tuple[int, bytes]] = []

    def produce() -> None:
        try:
            with Producer(cluster.bootstrap_servers, linger_ms=0) as producer:
                i = 0
                while not stop.is_set():
                    futures = [producer.send(topic_name, f"{i + j:06d}".encode(), partition=0)
                               for j in range(20)]
                    producer.flush()  # a commit, and a small file, per 20 records
                    acked.extend(i + j for j, f in enumerate(futures) if f.exception() is None)
                    i += 20
        finally:
            produced.set()  # acked is final: the consumer reads until it has all of it

    def consume() -> None:
        with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition(topic_name, 0)])
            while not produced.is_set() or len(read) < len(acked):
                read.extend((r.offset, r.value) for r in consumer.poll(200))

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 2000, "100 small commits")
        first = cluster.log_cleaner.run([topic_name], merge_min_age_ms=0)[0]
        wait_until(lambda: len(acked) >= 3000, "50 more")
        second = cluster.log_cleaner.run([topic_name], merge_min_age_ms=0)[0]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert first.error == second.error == ""
    assert first.merged[first.task.leader].merged_files >= 50, first.merged
    assert [int(v) for _, v in read] == acked == list(range(len(acked)))  # once, in order
    assert [o for o, _ in read] == list(range(len(read)))
    wait_for_identical_replicas(cluster, topic_name, 1)
    for broker in range(3):
        table = DeltaTable(replica_path(cluster.config.root, topic_name, 0, broker))
        files = len(table.file_uris())
        assert files < len(acked) // 20 // 2, (broker, files)
