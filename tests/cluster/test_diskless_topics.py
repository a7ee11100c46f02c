"""Diskless topics (diskless.enable, KIP-1150) on the shared cluster: one Delta table per
partition, no replica tables, produced and read through both doors; a leader killed with
SIGKILL is replaced in metadata only (the new leader opens the same table, nothing is copied);
a reassignment moves a partition without a byte copied; diskless.enable cannot be altered;
transactions, retention, compaction and the Spark source work on the one table as on others."""

from __future__ import annotations

import json
import os
import threading
import time

import pyarrow as pa
import pytest
from confluent_kafka import Producer as KafkaProducer
from deltalake import DeltaTable

from deltabus import AdminClient, NewTopic, Producer, errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.cluster.log_cleaner import run_cleaner
from deltabus.config import SET, AlterConfigOp
from deltabus.log_tables.appender import LEADER_EPOCH_TXN_APP_ID
from deltabus.log_tables.layout import partition_path, topic_path
from deltabus.records import produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from tests.cluster.test_compaction import COMPACTED, KEYS, latest, produce_rounds, read_all
from tests.cluster.test_replication import state
from tests.cluster.test_retention import (
    HOUR_MS,
    earliest,
    first_offset_polled,
    produce_batches,
)
from tests.conftest import read_records, wait_until
from tests.faults.pause import Pause


def create_diskless(cluster, topic: str, partitions: int, rf: int = 3) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, rf, {"diskless.enable": "true"})])


def produce(cluster, topic: str, prefix: str, count: int, partition: int = 0) -> list[int]:
    """acks=all, idempotent: the offsets the leader acknowledged."""
    with Producer(cluster.bootstrap_servers, acks="all", enable_idempotence=True) as producer:
        futures = [producer.send(topic, f"{prefix}-{i}".encode(), partition=partition)
                   for i in range(count)]
        return [f.get(60).offset for f in futures]


def test_one_table_per_partition_through_both_doors(cluster, topic_name) -> None:
    create_diskless(cluster, topic_name, 2)
    for p in range(2):
        s = state(cluster, topic_name, p)
        assert s.replicas == (s.leader,) and s.isr == (s.leader,)
        folder = partition_path(cluster.config.root, topic_name, p)
        assert os.path.isdir(os.path.join(folder, "_delta_log"))
        assert not [d for d in os.listdir(folder) if d.startswith("replica-")]
    assert produce(cluster, topic_name, "grpc", 5) == [0, 1, 2, 3, 4]
    kafka = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "acks": "all",
                           "enable.idempotence": True})
    for i in range(5):
        kafka.produce(topic_name, f"kafka-{i}".encode(), partition=1)
    assert kafka.flush(60) == 0
    records = read_records(cluster.bootstrap_servers, topic_name, 2, 10)
    assert sorted(r.value for r in records) == sorted(
        [f"grpc-{i}".encode() for i in range(5)] + [f"kafka-{i}".encode() for i in range(5)])
    with AdminClient(cluster.bootstrap_servers) as admin:
        with pytest.raises(errors.InvalidConfigError, match="cannot be altered"):
            admin.incremental_alter_configs(
                {topic_name: [AlterConfigOp("diskless.enable", "DELETE")]})


def test_a_killed_leader_is_replaced_in_metadata_only(cluster, topic_name,
                                                      all_brokers_back) -> None:
    create_diskless(cluster, topic_name, 1)
    acked = produce(cluster, topic_name, "before", 20)
    before = state(cluster, topic_name)
    cluster.kill_broker(before.leader)
    wait_until(lambda: state(cluster, topic_name).leader not in (before.leader, -1),
               what="another broker leading the diskless partition")
    after = state(cluster, topic_name)
    assert after.leader_epoch > before.leader_epoch
    assert after.replicas == (after.leader,)
    acked += produce(cluster, topic_name, "after", 20)
    assert acked == list(range(40))  # in order, nothing lost, nothing twice
    values = [r.value for r in read_records(cluster.bootstrap_servers, topic_name, 1, 40)]
    assert values == ([f"before-{i}".encode() for i in range(20)]
                      + [f"after-{i}".encode() for i in range(20)])
    folder = os.path.join(topic_path(cluster.config.root, topic_name), "0")
    assert not [d for d in os.listdir(folder) if d.startswith("replica-")]


def test_a_reassignment_moves_a_partition_without_copying(cluster, topic_name) -> None:
    create_diskless(cluster, topic_name, 1)
    produce(cluster, topic_name, "a", 10)
    s = state(cluster, topic_name)
    target = next(b for b in range(cluster.config.brokers) if b != s.leader)
    with AdminClient(cluster.bootstrap_servers) as admin:
        results = admin.alter_partition_reassignments({(topic_name, 0): [target]})
        assert all(e is None for e in results.values()), results
        refused = admin.alter_partition_reassignments({(topic_name, 0): [0, 1]})
        assert isinstance(refused[(topic_name, 0)], errors.InvalidReplicaAssignmentError)
        assert "diskless" in str(refused[(topic_name, 0)])
    moved = state(cluster, topic_name)
    assert (moved.leader, moved.replicas) == (target, (target,))
    assert not moved.adding_replicas and not moved.removing_replicas  # done: nothing copies
    assert moved.leader_epoch == s.leader_epoch + 1
    assert produce(cluster, topic_name, "b", 10) == list(range(10, 20))
    assert len(read_records(cluster.bootstrap_servers, topic_name, 1, 20)) == 20


def test_a_paused_leader_wakes_fenced_by_the_new_leaders_claim(cluster, topic_name,
                                                               all_brokers_back) -> None:
    """SIGSTOP a diskless leader past its session, with produce requests (acks=all) queued at
    its door; SIGCONT it once the new leader has claimed the table. Woken, the zombie commits
    nothing: its first commit loses its version to the claim, and it answers every queued
    request with an error; the log holds no commit of its epoch after the claim."""
    create_diskless(cluster, topic_name, 1)
    acked = produce(cluster, topic_name, "before", 10)
    old = state(cluster, topic_name)
    address = cluster.controller.image().broker(old.leader).address
    client = ClusterClient(address)  # its connection is open before the pause
    answers: list[pb.PartitionProduceResponse | Exception] = []

    def send(value: bytes) -> None:
        request = pb.ProduceRequest(acks=-1, timeout_ms=30_000, partitions=[
            pb.PartitionProduceData(topic=topic_name, partition=0,
                                    arrow_records=to_ipc(produce_batch([value])))])
        try:
            answers.append(client.call(address, "Produce", request,
                                       timeout_ms=120_000).partitions[0])
        except Exception as e:  # the zombie killed or its connection gone: no success either
            answers.append(e)

    send(b"warm-up")
    table = partition_path(cluster.config.root, topic_name, 0)
    try:
        with Pause(cluster) as nemesis:
            nemesis.pause(old.leader)
            queued = [threading.Thread(target=send, args=(f"zombie-{i}".encode(),))
                      for i in range(5)]
            for t in queued:
                t.start()
            wait_until(lambda: state(cluster, topic_name).leader not in (old.leader, -1),
                       what="another broker leading the diskless partition", timeout_s=120)
            epoch = state(cluster, topic_name).leader_epoch
            wait_until(lambda: DeltaTable(table).transaction_version(
                LEADER_EPOCH_TXN_APP_ID) == epoch, what="the new leader's claim")
            claimed_at = DeltaTable(table).version()
            nemesis.resume()
            for t in queued:
                t.join(150)
    finally:
        client.close()
    assert len(answers) == 6
    zombie = answers[1:]
    assert not [a for a in zombie if not isinstance(a, Exception) and a.error_code == 0], zombie
    acked += produce(cluster, topic_name, "after", 10)
    values = [r.value for r in read_records(cluster.bootstrap_servers, topic_name, 1, 21)]
    assert not [v for v in values if v.startswith(b"zombie-")]
    assert [v for v in values if v != b"warm-up"] == (
        [f"before-{i}".encode() for i in range(10)] + [f"after-{i}".encode() for i in range(10)])
    assert _epochs_committed_after(table, claimed_at) >= {epoch}
    assert min(_epochs_committed_after(table, claimed_at)) >= epoch


def _epochs_committed_after(table: str, version: int) -> set[int]:
    """The leader epochs stamped on the table's commits after `version` (read from its log)."""
    epochs = set()
    log_dir = os.path.join(table, "_delta_log")
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".json") and int(name[:-5]) > version:
            with open(os.path.join(log_dir, name), encoding="utf-8") as f:
                epochs |= {a["txn"]["version"] for a in map(json.loads, f)
                           if a.get("txn", {}).get("appId") == LEADER_EPOCH_TXN_APP_ID}
    return epochs


def test_transactions_and_the_spark_source_on_a_diskless_topic(spark, cluster,
                                                                topic_name) -> None:
    """A transactional producer (confluent-kafka, Kafka door) commits one transaction and
    aborts another on a diskless partition; read_committed consumers and the Spark source see
    the committed records only, read from the partition's one table."""
    create_diskless(cluster, topic_name, 1)
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "transactional.id": f"{topic_name}-txn"})
    producer.init_transactions(60)
    for outcome, values in (("commit", [b"c0", b"c1"]), ("abort", [b"a0"])):
        producer.begin_transaction()
        for v in values:
            producer.produce(topic_name, v, partition=0)
        producer.flush(60)
        if outcome == "commit":
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)
    committed = read_records(cluster.bootstrap_servers, topic_name, 1, 2,
                             isolation_level="read_committed")
    assert [r.value for r in committed] == [b"c0", b"c1"]
    df = (spark.read.format("deltabus")
          .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
          .option("subscribe", topic_name).option("kafka.isolation.level", "read_committed")
          .load())
    assert sorted(r.value for r in df.collect()) == [b"c0", b"c1"]


def partition_offsets(cluster, topic: str) -> tuple[int, int, int]:
    """(first offset, last offset, records) of a diskless partition's one table, from its file
    statistics."""
    actions = pa.table(DeltaTable(partition_path(cluster.config.root, topic, 0))
                       .get_add_actions(flatten=True)).to_pydict()
    return (min(actions["min.offset"]), max(actions["max.offset"]), sum(actions["num_records"]))


def test_retention_removes_expired_batches_from_the_partitions_one_table(
        cluster, topic_name) -> None:
    """retention.ms on a diskless topic: the expired files leave its one table (and the disk,
    file.delete.delay.ms=0), the log start moves, and earliest consumers start there."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {"diskless.enable": "true",
                                                         "file.delete.delay.ms": "0"})])
    produce_batches(cluster, topic_name, 3, int(time.time() * 1000) - 2 * HOUR_MS)
    produce_batches(cluster, topic_name, 2, None)
    table = partition_path(cluster.config.root, topic_name, 0)
    files_before = set(DeltaTable(table).file_uris())
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.incremental_alter_configs(
            {topic_name: [AlterConfigOp("retention.ms", SET, str(HOUR_MS))]})
    result = cluster.log_cleaner.run([topic_name])[0]
    assert result.error == "" and result.log_start_offset == 150, result
    assert [r.records for r in result.removed.values()] == [150]
    assert partition_offsets(cluster, topic_name) == (150, 249, 100)
    gone = files_before - set(DeltaTable(table).file_uris())
    assert gone and not any(os.path.exists(uri.removeprefix("file://")) for uri in gone)
    wait_until(lambda: earliest(cluster, topic_name) == 150, "the leader to see the log start")
    assert first_offset_polled(cluster, topic_name, f"{topic_name}-g", "earliest") == 150
    assert produce(cluster, topic_name, "new", 3) == [250, 251, 252]


def test_a_leader_elected_during_a_cleaner_run_takes_in_what_the_run_removed(
        cluster, topic_name) -> None:
    """The cleaner's task is made for the partition's leader of the time; the partition moves
    (metadata only) and its new leader opens the table before the run's commits. The
    controller tells the partition's leader of now as well: its log start moves up, as the
    old leader's would have, without waiting for a read to miss a deleted file."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {"diskless.enable": "true",
                                                         "file.delete.delay.ms": "0",
                                                         "retention.ms": str(HOUR_MS)})])
    produce_batches(cluster, topic_name, 3, int(time.time() * 1000) - 2 * HOUR_MS)
    produce_batches(cluster, topic_name, 2, None)
    [task] = cluster.controller.cleaner_tasks([topic_name])
    target = next(b for b in range(cluster.config.brokers) if b != task.leader)
    with AdminClient(cluster.bootstrap_servers) as admin:
        results = admin.alter_partition_reassignments({(topic_name, 0): [target]})
        assert all(e is None for e in results.values()), results
    assert produce(cluster, topic_name, "moved", 1) == [250]  # the new leader opened the table
    # and read its files (the log's committed version), before the run's commits
    assert len(read_records(cluster.bootstrap_servers, topic_name, 1, 251)) == 251
    result = run_cleaner(task)
    assert result.error == "" and result.log_start_offset == 150, result
    cluster.controller.tables_changed([(topic_name, 0, task.replicas)])
    wait_until(lambda: earliest(cluster, topic_name) == 150,
               "the new leader to take in the cleaner's removal")


def test_compaction_keeps_the_latest_value_per_key_in_the_partitions_one_table(
        spark, cluster, topic_name) -> None:
    """cleanup.policy=compact on a diskless topic: the leader's table keeps the latest value
    of each key (a tombstone for a deleted one) at its original offset, for consumers and for
    the Spark source alike."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {**COMPACTED, "diskless.enable": "true"})])
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        produce_rounds(producer, topic_name, 0, 5)
        producer.send(topic_name, None, key=b"k0", partition=0).get(30)  # delete k0
        producer.send(topic_name, b"newest", key=b"k1", partition=0).get(30)
    before = read_all(cluster, topic_name)
    assert len(before) == 5 * KEYS + 2
    want = latest(before)
    result = cluster.log_cleaner.run([topic_name])[0]
    assert result.error == "" and [c.removed for c in result.compacted.values()][0] > 0, result
    wait_until(lambda: len(read_all(cluster, topic_name)) < len(before),
               "the leader to read the compacted table")
    after = read_all(cluster, topic_name)
    assert latest(after) == want and set(after) <= set(before)
    rows = (spark.read.format("deltabus")
            .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
            .option("subscribe", topic_name).load().select("offset", "key", "value").collect())
    assert sorted((r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
                  for r in rows) == after
