"""deltabus's own ShareConsumer (gRPC door) in a share group with confluent-kafka's (Kafka door):
one group, one state, whichever door a member comes through. Records are shared between the
members; released ones come back with their delivery count raised; a record released as often
as group.share.delivery.count.limit allows is archived; rejected ones never come back."""

from __future__ import annotations

from confluent_kafka import ShareConsumer as KafkaShareConsumer

from deltabus import AcknowledgeType, AdminClient, NewTopic, Producer, ShareConsumer, errors
from tests.conftest import wait_until


def produce(cluster, topic: str, count: int) -> None:
    with Producer(cluster.bootstrap_servers, acks=-1) as producer:
        for i in range(count):
            producer.send(topic, value=b"%d" % i, partition=0)
        producer.flush()


def test_grpc_and_kafka_members_share_a_partition(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    group = f"{topic_name}-share"
    ours = ShareConsumer(cluster.bootstrap_servers, group_id=group, max_poll_records=10)
    theirs = KafkaShareConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                                 "group.id": group, "max.poll.records": 10})
    try:
        ours.subscribe([topic_name])
        theirs.subscribe([topic_name])
        wait_until(lambda: ours.poll(100) == [] and ours.assignment() == {topic_name: (0,)}
                   and cluster.coordinator.share_state.read(group, topic_name, 0) is not None,
                   what="the group to start on the partition")
        produce(cluster, topic_name, 100)
        read_ours: list[int] = []
        read_theirs: list[int] = []

        def all_read() -> bool:
            for r in ours.poll(100):
                assert r.delivery_count == 1
                read_ours.append(r.offset)
            read_theirs.extend(m.offset() for m in theirs.poll(0.1))
            return len(read_ours) + len(read_theirs) >= 100

        wait_until(all_read, what="100 records read by the two members", timeout_s=120)
        assert sorted(read_ours + read_theirs) == list(range(100))
        assert read_ours and read_theirs  # shared between the doors
        assert all(e is None for e in ours.commit().values())
        theirs.commit_sync(30)
        wait_until(lambda: cluster.coordinator.share_state.read(group, topic_name, 0)
                   .start_offset == 100, what="every record accepted")
    finally:
        ours.close()
        theirs.close()


def test_explicit_acknowledgements_and_the_delivery_limit(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    group = f"{topic_name}-share"
    limit = cluster.config.group.group_share_delivery_count_limit
    with ShareConsumer(cluster.bootstrap_servers, group_id=group,
                       acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic_name])
        wait_until(lambda: consumer.poll(100) == [] and
                   cluster.coordinator.share_state.read(group, topic_name, 0) is not None,
                   what="the group to start on the partition")
        produce(cluster, topic_name, 3)
        deliveries: dict[int, list[int]] = {0: [], 1: [], 2: []}
        got: list = []
        wait_until(lambda: got.extend(consumer.poll(200)) or len(got) >= 3,
                   what="the 3 records")
        for r in got:
            deliveries[r.offset].append(r.delivery_count)
            consumer.acknowledge(r, {0: AcknowledgeType.ACCEPT, 1: AcknowledgeType.REJECT,
                                     2: AcknowledgeType.RELEASE}[r.offset])
        with_error = consumer.poll(100)  # everything acknowledged: polling goes on
        for r in with_error:
            deliveries[r.offset].append(r.delivery_count)
            consumer.acknowledge(r, AcknowledgeType.RELEASE)

        def released_to_the_limit() -> bool:
            for r in consumer.poll(200):
                deliveries[r.offset].append(r.delivery_count)
                consumer.acknowledge(r, AcknowledgeType.RELEASE)
            return len(deliveries[2]) >= limit

        wait_until(released_to_the_limit, what=f"offset 2 released {limit} times")
        assert consumer.commit() == {(topic_name, 0): None}
        assert deliveries[0] == [1] and deliveries[1] == [1]  # accepted, rejected: once
        assert deliveries[2] == list(range(1, limit + 1))  # released: again, counted
        assert consumer.poll(500) == []  # archived at the limit: never delivered again
        wait_until(lambda: cluster.coordinator.share_state.read(group, topic_name, 0)
                   .start_offset == 3, what="the archived record to move the start offset")

        produce(cluster, topic_name, 1)
        got = []
        wait_until(lambda: got.extend(consumer.poll(200)) or len(got) >= 1,
                   what="a new record")
        try:
            consumer.poll(100)  # explicit mode: the record is not acknowledged yet
            raise AssertionError("poll went on past an unacknowledged record")
        except errors.ClientError:
            pass
        consumer.acknowledge(got[0], AcknowledgeType.ACCEPT)
