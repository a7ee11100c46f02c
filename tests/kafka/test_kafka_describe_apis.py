"""Issue 19's describe APIs through Kafka's own admin clients, unmodified: OffsetDelete
(kafka-consumer-groups.sh --delete-offsets), DescribeLogDirs, DescribeProducers and
DescribeTopicPartitions (KIP-966), each checked by its effect on the cluster."""

from __future__ import annotations

import time

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from deltabus.log_tables.layout import consumer_offsets_path
from deltabus.offsets.offset_store import OffsetStore
from tests.conftest import wait_for_kafka_assignment, wait_until


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
        wait_for_kafka_assignment(member, cluster, group)
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


def partition_sizes(described: list[dict], topic: str) -> dict[tuple[int, int], int]:
    """(broker, partition) -> size, from kafka-python's describe_log_dirs."""
    sizes = {}
    for broker in described:
        for log_dir in broker["log_dirs"]:
            assert log_dir["error_code"] == 0
            for t in log_dir["topics"]:
                if t["name"] != topic:
                    continue
                for p in t["partitions"]:
                    assert p["offset_lag"] == 0 and p["is_future_key"] is False
                    sizes[(broker["broker"], p["partition_index"])] = p["partition_size"]
    return sizes


def test_describe_log_dirs_gives_each_replica_size_on_each_broker(cluster, topic_name):
    """DescribeLogDirs: every broker answers for its own replicas in its log dir (the cluster
    root's topics folder); a replica's size is its table's data files, and grows on every
    broker holding it once records are produced."""
    create(cluster, NewTopic(topic_name, 2, 3))
    admin = kafka_admin(cluster)
    try:
        before = admin.describe_log_dirs({topic_name: [0, 1]})
        brokers = {b["broker"]: b["log_dirs"] for b in before}
        assert set(brokers) == {0, 1, 2}  # the brokers, and nothing but
        for broker_id in range(3):
            (log_dir,) = brokers[broker_id]
            assert log_dir["log_dir"] == f"{cluster.config.root}/topics"
            assert log_dir["total_bytes"] > 0 and 0 <= log_dir["usable_bytes"] <= \
                log_dir["total_bytes"]
        sizes = partition_sizes(before, topic_name)
        assert set(sizes) == {(b, p) for b in range(3) for p in range(2)}
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            for i in range(200):
                producer.send(topic_name, b"x" * 1000 + str(i).encode(), partition=0)
            producer.flush()

        def grown() -> bool:
            now = partition_sizes(admin.describe_log_dirs({topic_name: [0, 1]}), topic_name)
            return all(now[(b, 0)] >= sizes[(b, 0)] + 10_000 for b in range(3)) and all(
                now[(b, 1)] == sizes[(b, 1)] for b in range(3))

        wait_until(grown, "partition 0 to grow on every replica, and partition 1 not")
        everything = admin.describe_log_dirs(brokers=[0])  # null: every hosted replica
        assert (0, 0) in partition_sizes(everything, topic_name)
    finally:
        admin.close()


def test_describe_producers_shows_an_idempotent_producers_last_sequence(cluster, topic_name):
    """DescribeProducers: the idempotent producer that wrote to a partition, with its epoch,
    last sequence and last timestamp, from the leader or a follower; a broker holding no
    replica answers NOT_LEADER_OR_FOLLOWER."""
    from kafka.errors import NotLeaderForPartitionError

    create(cluster, NewTopic(topic_name, 1, 3), NewTopic(f"{topic_name}-one", 1, 1))
    started_ms = int(time.time() * 1000)
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers,
                             enable_idempotence=True, acks="all", linger_ms=0)
    try:
        for i in range(5):
            producer.send(topic_name, f"v{i}".encode(), partition=0).get(30)
        for i in range(3):
            producer.send(topic_name, f"w{i}".encode(), partition=0).get(30)
    finally:
        producer.close()
    tp = KafkaTopicPartition(topic_name, 0)
    admin = kafka_admin(cluster)
    try:
        (state,) = admin.describe_producers([tp])[tp].active_producers
        assert state.producer_id >= 0 and state.producer_epoch == 0
        assert state.last_sequence == 7  # eight records, sequences 0 to 7
        assert started_ms - 1000 <= state.last_timestamp <= int(time.time() * 1000) + 1000
        assert (state.coordinator_epoch, state.current_transaction_start_offset) == (-1, -1)
        with AdminClient(cluster.bootstrap_servers) as ours:
            leaders = {t.name: t.partitions[0] for t in ours.describe_topics(
                [topic_name, f"{topic_name}-one"])}
        follower = next(r for r in leaders[topic_name].replicas
                        if r != leaders[topic_name].leader)
        wait_until(lambda: admin.describe_producers([tp], broker_id=follower)[tp]
                   .active_producers == [state], "the follower to know the producer")
        other = next(b for b in range(3) if b not in leaders[f"{topic_name}-one"].replicas)
        one = KafkaTopicPartition(f"{topic_name}-one", 0)
        try:
            admin.describe_producers([one], broker_id=other)
            raise AssertionError("a broker without a replica described its producers")
        except NotLeaderForPartitionError:
            pass
        assert admin.describe_producers([one])[one].active_producers == []
    finally:
        admin.close()


def test_describe_topic_partitions_pages_by_cursor(cluster, topic_name):
    """DescribeTopicPartitions (KIP-966): a topic's partitions as Metadata has them, at most
    response_partition_limit an answer and a cursor to the rest; an unknown topic is
    UNKNOWN_TOPIC_OR_PARTITION. kafka-python's describe_topics and librdkafka's describe_topics
    (Metadata) still answer after it is advertised."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient as ConfluentAdmin

    create(cluster, NewTopic(topic_name, 5, 2))
    admin = kafka_admin(cluster)
    try:
        (metadata,) = admin.describe_topics([topic_name])
        pages, cursor = [], None
        while True:
            page = admin.describe_topic_partitions([topic_name], response_partition_limit=2,
                                                   cursor=cursor)
            pages.append(page)
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert [p["next_cursor"] for p in pages] == [
            {"topic_name": topic_name, "partition_index": 2},
            {"topic_name": topic_name, "partition_index": 4}, None]
        described = [p for page in pages for t in page["topics"] for p in t["partitions"]]
        (first,) = pages[0]["topics"]
        assert first["error_code"] == 0 and str(first["topic_id"]) == str(metadata["topic_id"])
        assert first["is_internal"] is False and first["topic_authorized_operations"] > 0
        assert [(p["partition_index"], p["leader_id"], p["replica_nodes"], p["isr_nodes"])
                for p in described] == [
            (p["partition_index"], p["leader_id"], p["replica_nodes"], p["isr_nodes"])
            for p in sorted(metadata["partitions"], key=lambda p: p["partition_index"])]
        unknown = admin.describe_topic_partitions([f"{topic_name}-none"])
        assert unknown["topics"][0]["error_code"] == 3  # UNKNOWN_TOPIC_OR_PARTITION
        every = admin.describe_topic_partitions([])
        assert topic_name in {t["name"] for t in every["topics"]} or every["next_cursor"]
    finally:
        admin.close()
    librdkafka = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    futures = librdkafka.describe_topics(TopicCollection([topic_name]),
                                         include_authorized_operations=True, request_timeout=30)
    theirs = futures[topic_name].result(30)
    assert len(theirs.partitions) == 5 and theirs.authorized_operations


def test_each_api_is_checked_against_the_acls_kafka_checks():
    """As Kafka's KafkaApis: OffsetDelete needs DELETE on the group and READ on each topic,
    DescribeLogDirs DESCRIBE on the cluster, DescribeProducers READ on the topic, and
    DescribeTopicPartitions refuses a named topic the caller may not DESCRIBE (listed last) and
    tells the operations the caller may do on the others. Real door, SASL users, fake brokers."""
    from kafka.errors import (
        GroupAuthorizationFailedError,
        NoError,
        TopicAuthorizationFailedError,
    )

    from deltabus import config as cfg
    from deltabus.offsets.offset_store import OffsetAndMetadata
    from deltabus.security.acls import AclBinding, Authorizer, Operation, PatternType, Permission
    from deltabus.security.acls import ResourceType as R
    from deltabus.security.scram import make_credential
    from tests.client.fake_cluster import FakeCluster

    passwords = {"alice": "alice-secret", "bob": "bob-secret"}
    credentials = {(u, "SCRAM-SHA-256"): make_credential("SCRAM-SHA-256", p)
                   for u, p in passwords.items()}
    fake = FakeCluster(brokers=1)
    for topic in ("orders", "secret"):
        fake.create_topic(topic, 1)
    fake.authorizer = Authorizer([AclBinding(r, n, PatternType.LITERAL, f"User:{u}", "*", o,
                                             Permission.ALLOW) for r, n, u, o in [
        (R.TOPIC, "orders", "alice", Operation.READ), (R.GROUP, "billing", "alice",
                                                       Operation.DELETE),
        (R.CLUSTER, "kafka-cluster", "alice", Operation.DESCRIBE),
        (R.TOPIC, "orders", "bob", Operation.DESCRIBE)]])
    fake.coordinator.commit_offsets("billing", -1, "", {
        ("orders", 0): OffsetAndMetadata(3), ("secret", 0): OffsetAndMetadata(4)}).result(10)
    address = fake.serve_kafka(0, security=cfg.ListenerSecurity(
        security_protocol="SASL_PLAINTEXT"),
        credentials=lambda user, mechanism: credentials.get((user, mechanism)))
    admins = {u: KafkaAdminClient(
        bootstrap_servers=address, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=u, sasl_plain_password=p)
        for u, p in passwords.items()}
    orders, secret = KafkaTopicPartition("orders", 0), KafkaTopicPartition("secret", 0)
    try:
        alice, bob = admins["alice"], admins["bob"]
        try:
            bob.delete_group_offsets("billing", [orders])
            raise AssertionError("bob deleted offsets of a group he may not DELETE")
        except GroupAuthorizationFailedError:
            pass
        assert alice.delete_group_offsets("billing", [orders, secret]) == {
            orders: NoError, secret: TopicAuthorizationFailedError}
        assert set(fake.coordinator.fetch_offsets("billing")) == {("secret", 0)}
        assert alice.describe_log_dirs({"orders": [0]}, brokers=[0])[0]["log_dirs"]
        assert bob.describe_log_dirs({"orders": [0]}, brokers=[0])[0]["log_dirs"] == []
        assert alice.describe_producers([orders])[orders].active_producers == []
        try:
            bob.describe_producers([orders])
            raise AssertionError("bob described producers of a topic he may not READ")
        except TopicAuthorizationFailedError:
            pass
        shown = bob.describe_topic_partitions(["secret", "orders"])["topics"]
        assert [(t["name"], t["error_code"]) for t in shown] == [("orders", 0), ("secret", 29)]
        assert shown[0]["topic_authorized_operations"] == 1 << Operation.DESCRIBE
        (theirs,) = alice.describe_topic_partitions(["orders"])["topics"]
        assert theirs["topic_authorized_operations"] == (
            1 << Operation.READ | 1 << Operation.DESCRIBE)  # READ implies DESCRIBE
    finally:
        for admin in admins.values():
            admin.close()
        fake.close()
