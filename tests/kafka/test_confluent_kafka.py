"""confluent-kafka (librdkafka), unmodified, against the Kafka listeners: an idempotent acks=all
producer with compression, a consumer group that commits, restarts and resumes, and a partition
leader killed under the producer without losing an acknowledged record."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from deltabus import AdminClient, NewTopic
from tests.cluster.test_replication import state
from tests.conftest import read_records, wait_until

PARTITIONS = 3


def producer(cluster, **extra: object) -> KafkaProducer:
    return KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "acks": "all",
                          "enable.idempotence": True, "compression.type": "lz4",
                          "linger.ms": 5, "message.timeout.ms": 60_000, **extra})


def consume(cluster, topic: str, group: str, count: int) -> list[tuple[int, int, bytes, bytes]]:
    """(partition, offset, key, value) of `count` records read in group `group`, committed."""
    consumer = KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": group, "auto.offset.reset": "earliest",
                              "enable.auto.commit": False, "session.timeout.ms": 6000})
    got: list[tuple[int, int, bytes, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.partition(), message.offset(), message.key(), message.value()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def test_librdkafka_produces_and_consumes_in_a_group_that_resumes(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 3)])
    acked: list[tuple[int, int, bytes, bytes]] = []

    def delivered(error, message) -> None:
        assert error is None, error
        acked.append((message.partition(), message.offset(), message.key(), message.value()))

    p = producer(cluster)
    for i in range(60):
        p.produce(topic_name, key=f"user-{i % 6}".encode(), value=f"paid {i}".encode(),
                  on_delivery=delivered)
    assert p.flush(60) == 0
    assert len(acked) == 60
    ours = sorted((r.partition, r.offset, r.key, r.value)
                  for r in read_records(cluster.bootstrap_servers, topic_name, PARTITIONS, 60))
    assert ours == sorted(acked)  # what deltabus reads is what librdkafka was told it wrote

    group = f"{topic_name}-g"
    assert sorted(consume(cluster, topic_name, group, 60)) == sorted(acked)
    for i in range(60, 66):
        p.produce(topic_name, key=f"user-{i % 6}".encode(), value=f"paid {i}".encode())
    assert p.flush(60) == 0
    resumed = consume(cluster, topic_name, group, 6)  # only what came after the commits
    assert sorted(v for *_, v in resumed) == sorted(f"paid {i}".encode() for i in range(60, 66))


def test_a_leader_killed_under_an_acks_all_producer_loses_nothing_acknowledged(
        cluster, topic_name, all_brokers_back) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"min.insync.replicas": "2"})])
    acked: list[bytes] = []
    failed: list[str] = []
    stop = threading.Event()

    def delivered(error, message) -> None:
        if error is None:
            acked.append(message.value())
        else:
            failed.append(str(error))

    def keep_producing() -> None:
        p = producer(cluster, **{"linger.ms": 2})
        i = 0
        while not stop.is_set():
            p.produce(topic_name, key=b"k", value=f"v{i}".encode(), partition=0,
                      on_delivery=delivered)
            p.poll(0)
            i += 1
            time.sleep(0.002)
        p.flush(60)

    thread = threading.Thread(target=keep_producing)
    thread.start()
    try:
        wait_until(lambda: len(acked) > 200, "acknowledged records before the kill")
        leader = state(cluster, topic_name).leader
        cluster.kill_broker(leader)
        wait_until(lambda: state(cluster, topic_name).leader not in (leader, -1),
                   "a new leader")
        count = len(acked)
        wait_until(lambda: len(acked) > count + 200, "acknowledged records after the kill")
    finally:
        stop.set()
        thread.join(90)
    assert not failed, failed[:3]
    stored = [r.value for r in read_records(cluster.bootstrap_servers, topic_name, 1, len(acked))]
    assert set(acked) <= set(stored)  # every acknowledged record is there
    assert len(stored) == len(set(stored))  # idempotence: no duplicates from the retries
