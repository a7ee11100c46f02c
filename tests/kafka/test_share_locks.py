"""Acquisition locks that time out, with confluent-kafka's ShareConsumer, unmodified: a record a
member holds past group.share.record.lock.duration.ms goes to another member with its delivery
count raised; once delivered group.share.delivery.count.limit times it is archived, never
delivered again; and the late member's acknowledgement is refused (INVALID_RECORD_STATE). One
1-broker cluster of its own, with Kafka's shortest lock (1 s) and delivery count limit (2),
set as Kafka's server.properties would: broker configs, given in the Spark conf."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, KafkaError, ShareConsumer
from confluent_kafka import Producer as KafkaProducer

from deltabus import AdminClient, Cluster, NewTopic
from tests.conftest import wait_until

TOPIC = "work"


@pytest.fixture(scope="module")
def short_locks(spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    for key, value in (("group.share.record.lock.duration.ms", "1000"),
                       ("group.share.delivery.count.limit", "2")):
        spark.conf.set(f"spark.deltabus.{key}", value)
    try:
        cluster = Cluster(spark, root=str(Path(tmp_path_factory.mktemp("locks")) / "data"),
                          brokers=1, port=0).start()
    finally:
        for key in ("group.share.record.lock.duration.ms", "group.share.delivery.count.limit"):
            spark.conf.unset(f"spark.deltabus.{key}")
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
    yield cluster
    cluster.stop()


def consumer(cluster: Cluster) -> ShareConsumer:
    return ShareConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                          "group.id": "workers", "share.acknowledgement.mode": "explicit"})


def test_a_record_whose_lock_times_out_goes_to_another_member_then_is_archived(
        short_locks: Cluster) -> None:
    cluster = short_locks
    slow, other = consumer(cluster), consumer(cluster)
    try:
        slow.subscribe([TOPIC])
        wait_until(lambda: not slow.poll(0.2)
                   and cluster.coordinator.share_state.read("workers", TOPIC, 0) is not None,
                   what="the group to start on the partition")
        producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
        producer.produce(TOPIC, value=b"slow work", partition=0)
        assert producer.flush(30) == 0
        held: list = []
        wait_until(lambda: held.extend(slow.poll(0.2)) or held, what="the record, once")
        assert [(m.offset(), m.delivery_count()) for m in held] == [(0, 1)]

        other.subscribe([TOPIC])  # the slow member holds the record past its lock (1 s)
        again: list = []
        wait_until(lambda: again.extend(other.poll(0.2)) or again,
                   what="the record, delivered again to the other member")
        assert [(m.offset(), m.delivery_count()) for m in again] == [(0, 2)]
        taken_at = time.monotonic()

        # The slow member's acknowledgement comes too late: its lock timed out.
        slow.acknowledge(held[0], AcknowledgeType.ACCEPT)
        results = slow.commit_sync(30)
        errors = [e for e in results.values() if e is not None]
        assert errors and errors[0].args[0].code() == KafkaError.INVALID_RECORD_STATE, results

        # The other member does not acknowledge either: delivered twice, the limit, so
        # archived when this lock times out too; nobody gets it again.
        wait_until(lambda: cluster.coordinator.share_state.read("workers", TOPIC, 0)
                   .start_offset == 1, what="the record archived at the delivery count limit")
        assert time.monotonic() - taken_at >= 0.9  # not before its lock timed out
        newcomer = ShareConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                                  "group.id": "workers"})
        newcomer.subscribe([TOPIC])
        wait_until(lambda: not newcomer.poll(0.2) and len(
            cluster.coordinator.describe_share_group("workers").members) == 3,
                   what="a third member to join")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert not newcomer.poll(0.2)
        newcomer.close()
    finally:
        slow.close()
        other.close()
