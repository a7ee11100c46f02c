"""KIP-848's consumer group protocol with an unmodified client: confluent-kafka (librdkafka)
consumers with group.protocol=consumer, whose partitions the group coordinator assigns
(ConsumerGroupHeartbeat), against the real cluster."""

from __future__ import annotations

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, ConsumerGroupType, TopicPartition
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient as KafkaAdminClient

from deltabus import AdminClient, NewTopic
from tests.conftest import wait_until

PARTITIONS = 6


def consumer(cluster, group: str) -> KafkaConsumer:
    return KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                          "group.id": group, "group.protocol": "consumer",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})


def poll_all(consumers: list[KafkaConsumer], read: list[tuple[int, int, int]]) -> None:
    """One short poll of each consumer; (consumer, partition, offset) of what it read."""
    for i, c in enumerate(consumers):
        message = c.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            read.append((i, message.partition(), message.offset()))


def partitions_of(c: KafkaConsumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def test_two_librdkafka_consumers_share_a_topic_the_coordinator_assigns(
        cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 3)])
    group = f"{topic_name}-g"
    consumers = [consumer(cluster, group), consumer(cluster, group)]
    read: list[tuple[int, int, int]] = []
    try:
        for c in consumers:
            c.subscribe([topic_name])

        def shared() -> bool:
            poll_all(consumers, read)
            a, b = (partitions_of(c) for c in consumers)
            return len(a) == len(b) == 3 and a | b == set(range(PARTITIONS))

        wait_until(shared, what="the coordinator to give each consumer 3 partitions")
        p = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
        for i in range(60):
            p.produce(topic_name, value=b"%d" % i, partition=i % PARTITIONS)
        assert p.flush(60) == 0

        def all_read() -> bool:
            poll_all(consumers, read)
            return len(read) >= 60

        wait_until(all_read, what="60 records read")
        assert len(read) == 60  # each record once, across both consumers
        assert len({(p_, o) for _, p_, o in read}) == 60
        assert {i for i, _, _ in read} == {0, 1}
        for c in consumers:
            c.commit(asynchronous=False)
        classic = KafkaAdminClient({"bootstrap.servers": cluster.kafka_bootstrap_servers})
        listed = classic.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic_name, p_) for p_ in range(PARTITIONS)])])
        offsets = listed[group].result(30).topic_partitions
        assert {tp.partition: tp.offset for tp in offsets} == dict.fromkeys(range(PARTITIONS), 10)

        described = classic.describe_consumer_groups([group])[group].result(30)
        assert described.type == ConsumerGroupType.CONSUMER  # ConsumerGroupDescribe's answer
        assert len(described.members) == 2
        assert sorted(tp.partition for m in described.members
                      for tp in m.assignment.topic_partitions) == list(range(PARTITIONS))

        consumers.pop().close()  # leaves the group (epoch -1): its partitions move

        def took_over() -> bool:
            poll_all(consumers, read)
            return partitions_of(consumers[0]) == set(range(PARTITIONS))

        wait_until(took_over, what="the other consumer to get every partition")
    finally:
        for c in consumers:
            c.close()
