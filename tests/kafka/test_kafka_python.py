"""kafka-python, unmodified, against the shared cluster's Kafka listeners: what it produces is
what deltabus's own clients read (offsets, keys, values, headers, timestamps), whatever the
compression codec, and the other way round."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition


def deltabus_records(cluster, topic: str, partition: int, count: int) -> list[tuple]:
    tp = TopicPartition(topic, partition)
    out: list[tuple] = []
    with Consumer(cluster.bootstrap_servers) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        while len(out) < count:
            out += [(r.offset, r.key, r.value, sorted(r.headers or []), r.timestamp)
                    for r in consumer.poll(500)]
    return out


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_what_kafka_python_produces_deltabus_reads(cluster, topic_name, codec) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 3)])
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks="all",
                             compression_type=codec, linger_ms=5)
    sent = []
    try:
        for i in range(50):
            future = producer.send(topic_name, key=f"user-{i % 5}".encode(),
                                   value=f"payment {i}".encode(),
                                   headers=[("source", b"kafka-python")],
                                   timestamp_ms=1_700_000_000_000 + i)
            sent.append((future, i))
        producer.flush(30)
        by_partition: dict[int, list[tuple]] = {}
        for future, i in sent:
            meta = future.get(30)
            by_partition.setdefault(meta.partition, []).append(
                (meta.offset, f"user-{i % 5}".encode(), f"payment {i}".encode(),
                 [("source", b"kafka-python")], 1_700_000_000_000 + i))
    finally:
        producer.close(10)
    for partition, expected in by_partition.items():
        expected.sort()
        assert [e[0] for e in expected] == list(range(len(expected)))  # offsets from 0, dense
        assert deltabus_records(cluster, topic_name, partition, len(expected)) == expected


def test_what_deltabus_produces_kafka_python_reads(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(30):
            producer.send(topic_name, f"v{i}".encode(), key=f"k{i}".encode(), partition=0,
                          headers=[("n", str(i).encode())], timestamp_ms=1_700_000_000_000 + i)
        producer.flush()
    expected = deltabus_records(cluster, topic_name, 0, 30)
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers,
                             enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        tp = KafkaTopicPartition(topic_name, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = []
        for record in consumer:
            got.append((record.offset, record.key, record.value,
                        sorted((k, v) for k, v in record.headers), record.timestamp))
            if len(got) == 30:
                break
        assert consumer.end_offsets([tp])[tp] == 30
        assert consumer.offsets_for_times({tp: 1_700_000_000_010})[tp].offset == 10
    finally:
        consumer.close()
    assert got == expected


def test_kafka_pythons_admin_client_manages_topics(cluster, topic_name) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions
    from kafka.admin import NewTopic as KafkaNewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        admin.create_topics([KafkaNewTopic(topic_name, 2, 3,
                                           topic_configs={"retention.ms": "3600000"})])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([KafkaNewTopic(topic_name, 2, 3)])
        assert topic_name in admin.list_topics()
        (described,) = admin.describe_topics([topic_name])
        assert len(described["partitions"]) == 2
        assert all(len(p["replica_nodes"]) == 3 for p in described["partitions"])
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)],
                                         config_filter="all")
        (entries,) = configs.values()
        entries = entries[topic_name]
        assert entries["retention.ms"]["value"] == "3600000"
        assert entries["cleanup.policy"]["value"] == "delete"
        admin.create_partitions({topic_name: NewPartitions(total_count=3)})
        cluster_info = admin.describe_cluster()
        assert {b["broker_id"] for b in cluster_info["brokers"]} == {0, 1, 2}
        assert cluster_info["controller_id"] in {0, 1, 2}
        admin.delete_topics([topic_name])
    finally:
        admin.close()
    with AdminClient(cluster.bootstrap_servers) as ours:  # the same cluster state
        assert topic_name not in ours.list_topics()


def test_acks_0_gets_no_answer_and_the_records_still_land(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks=0)
    try:
        futures = [producer.send(topic_name, f"fire {i}".encode(), partition=0)
                   for i in range(20)]
        producer.flush(30)
        for future in futures:
            future.get(10)  # done without an answer from the broker, and without an error
    finally:
        producer.close(10)
    stored = deltabus_records(cluster, topic_name, 0, 20)
    assert [value for _, _, value, _, _ in stored] == [f"fire {i}".encode() for i in range(20)]
