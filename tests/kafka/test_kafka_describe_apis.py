"""Issue 19's APIs through Kafka's own admin clients, unmodified: OffsetDelete
(kafka-consumer-groups.sh --delete-offsets), checked by its effect on the cluster."""

from __future__ import annotations

from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from deltabus.log_tables.layout import consumer_offsets_path
from deltabus.offsets.offset_store import OffsetStore
from tests.conftest import wait_until

COORDINATOR_NODE_ID = 2**31 - 1  # the bootstrap listener, which hosts no replica


def kafka_admin(cluster) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)


def create(cluster, *topics: NewTopic) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics(list(topics))


def test_delete_group_offsets_as_kafka_consumer_groups_delete_offsets(cluster, topic_name):
    """OffsetDelete: the named partitions' committed offsets go, durably (a coordinator
    replaying __consumer_offsets no longer has them), and the group's consumer starts from
    auto.offset.reset there; a topic its member subscribes to is GROUP_SUBSCRIBED_TO_TOPIC,
    a group that does not exist GROUP_ID_NOT_FOUND."""
    from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError

    read, busy = topic_name, f"{topic_name}-busy"
    create(cluster, NewTopic(read, 2, 1), NewTopic(busy, 1, 1))
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(10):
            producer.send(read, f"v{i}".encode(), partition=0)
        producer.flush()
    group = f"{topic_name}-g"
    with Consumer(cluster.bootstrap_servers, group_id=group,
                  enable_auto_commit=False) as consumer:
        consumer.commit({TopicPartition(read, 0): 5, TopicPartition(read, 1): 0,
                         TopicPartition(busy, 0): 3})
    member = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers, group_id=group,
                           enable_auto_commit=False, session_timeout_ms=6000,
                           heartbeat_interval_ms=500)
    admin = kafka_admin(cluster)
    try:
        member.subscribe([busy])
        wait_until(lambda: member.poll(200) is not None and bool(member.assignment()),
                   "the group's member to join")
        answered = admin.delete_group_offsets(
            group, [KafkaTopicPartition(read, 0), KafkaTopicPartition(busy, 0)])
        assert answered == {KafkaTopicPartition(read, 0): NoError,
                            KafkaTopicPartition(busy, 0): GroupSubscribedToTopicError}
        try:
            admin.delete_group_offsets(f"{topic_name}-none", [KafkaTopicPartition(read, 0)])
            raise AssertionError("offsets of a group that does not exist were deleted")
        except GroupIdNotFoundError:
            pass
        left = admin.list_group_offsets(group)[group]
    finally:
        member.close()
        admin.close()
    assert {(tp.topic, tp.partition): om.offset for tp, om in left.items()} == {
        (read, 1): 0, (busy, 0): 3}
    store = OffsetStore(consumer_offsets_path(cluster.config.root))  # a restarted coordinator
    try:
        assert set(store.offsets(group)) == {(read, 1), (busy, 0)}
    finally:
        store.close()
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        consumer.assign([KafkaTopicPartition(read, 0)])
        records: list = []
        wait_until(lambda: records.extend(
            r for rs in consumer.poll(200).values() for r in rs) or bool(records),
            "the group's consumer to read the partition whose offset was deleted")
        assert records[0].offset == 0  # auto.offset.reset, not the deleted offset 5
    finally:
        consumer.close()

