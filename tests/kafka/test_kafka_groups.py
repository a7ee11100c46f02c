"""Consumer groups through Kafka's protocol are the groups deltabus has: kafka-python, unmodified,
shares a group with deltabus's consumer, commits to __consumer_offsets, and a restarted member
resumes where the group committed."""

from __future__ import annotations

import threading
import time

from kafka import KafkaConsumer

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.conftest import wait_for_kafka_assignment, wait_until

PARTITIONS = 4


def produce(cluster, topic: str, count: int, start: int = 0) -> None:
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(start, start + count):
            producer.send(topic, f"v{i}".encode(), partition=i % PARTITIONS)
        producer.flush()


def kafka_consumer(cluster, group: str) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers, group_id=group,
                         auto_offset_reset="earliest", enable_auto_commit=False,
                         partition_assignment_strategy=_range(), session_timeout_ms=6000,
                         heartbeat_interval_ms=500, max_poll_interval_ms=30_000)


def _range() -> list:
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    return [RangePartitionAssignor]


def test_kafka_python_commits_and_resumes_in_a_deltabus_group(cluster, topic_name) -> None:
    group = f"{topic_name}-g"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    produce(cluster, topic_name, 40)
    consumer = kafka_consumer(cluster, group)
    seen: list[str] = []
    try:
        consumer.subscribe([topic_name])
        deadline = time.monotonic() + 60
        while len(seen) < 40 and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                seen += [r.value.decode() for r in records]
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"v{i}" for i in range(40))
    with AdminClient(cluster.bootstrap_servers) as admin:  # in __consumer_offsets, per partition
        assert admin.list_consumer_group_offsets(group) == {
            (topic_name, p): 10 for p in range(PARTITIONS)}

    produce(cluster, topic_name, 8, start=40)
    again = kafka_consumer(cluster, group)  # a restarted member resumes at the commits
    resumed: list[str] = []
    try:
        again.subscribe([topic_name])
        deadline = time.monotonic() + 60
        while len(resumed) < 8 and time.monotonic() < deadline:
            for records in again.poll(500).values():
                resumed += [r.value.decode() for r in records]
    finally:
        again.close()
    assert sorted(resumed) == sorted(f"v{i}" for i in range(40, 48))


def test_a_kafka_python_and_a_deltabus_consumer_share_one_group(cluster, topic_name) -> None:
    group = f"{topic_name}-g"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    ours = Consumer(cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                    enable_auto_commit=False, client_id="deltabus-member")
    theirs = kafka_consumer(cluster, group)
    got: dict[str, list[str]] = {"ours": [], "theirs": []}
    stop = threading.Event()

    def poll_ours() -> None:
        ours.subscribe([topic_name])
        while not stop.is_set():
            got["ours"] += [r.value.decode() for r in ours.poll(200)]

    def poll_theirs() -> None:
        for records in theirs.poll(200).values():
            got["theirs"] += [r.value.decode() for r in records]

    thread = threading.Thread(target=poll_ours)
    thread.start()
    try:
        theirs.subscribe([topic_name])

        def both_assigned() -> bool:
            poll_theirs()
            return len(theirs.assignment()) == 2 and len(ours.assignment()) == 2
        wait_until(both_assigned, "the two members to share the partitions")
        produce(cluster, topic_name, 40)

        def all_read() -> bool:
            poll_theirs()
            return len(got["ours"]) + len(got["theirs"]) >= 40
        wait_until(all_read, "the group to read every record")
        assigned = {p.partition for p in theirs.assignment()}
        with AdminClient(cluster.bootstrap_servers) as admin:
            (described,) = admin.describe_consumer_groups([group])
    finally:
        stop.set()
        thread.join(30)
        theirs.close()
        ours.close()
    # range: partitions 0-1 to one member, 2-3 to the other; each reads only its own
    assert assigned in ({0, 1}, {2, 3})
    assert sorted(int(v[1:]) % PARTITIONS for v in got["theirs"]) == sorted(
        i % PARTITIONS for i in range(40) if i % PARTITIONS in assigned)
    assert sorted(got["ours"] + got["theirs"]) == sorted(f"v{i}" for i in range(40))
    assert described.state == "Stable" and len(described.members) == 2
    assert "deltabus-member" in {m.client_id for m in described.members}


def test_kafka_admin_clients_delete_empty_groups_and_their_offsets(cluster, topic_name) -> None:
    """DeleteGroups, as kafka-consumer-groups.sh --delete sends it: an empty group and its
    committed offsets go; a group with a member stays (NON_EMPTY_GROUP); an unknown one is
    GROUP_ID_NOT_FOUND. Through kafka-python's admin client and librdkafka's."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient as ConfluentAdmin
    from kafka.admin import KafkaAdminClient

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    tp = TopicPartition(topic_name, 0)
    idle, busy, gone = (f"{topic_name}-{n}" for n in ("idle", "busy", "gone"))
    for group in (idle, gone):
        with Consumer(cluster.bootstrap_servers, group_id=group,
                      enable_auto_commit=False) as consumer:
            consumer.commit({tp: 7})
    member = kafka_consumer(cluster, busy)
    try:
        member.subscribe([topic_name])
        wait_for_kafka_assignment(member, cluster, busy)
        theirs = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
        try:
            answered = dict(theirs.delete_groups([idle, busy, f"{topic_name}-none"]))
        finally:
            theirs.close()
        assert [answered[g] for g in (idle, busy, f"{topic_name}-none")] == [
            "OK", "NonEmptyGroupError", "GroupIdNotFoundError"]
        librdkafka = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap_servers})
        futures = librdkafka.delete_consumer_groups([gone, busy], request_timeout=30)
        futures[gone].result(30)
        try:
            futures[busy].result(30)
            raise AssertionError("a group with a member was deleted")
        except KafkaException as e:
            assert e.args[0].name() == "NON_EMPTY_GROUP"
    finally:
        member.close()
    with AdminClient(cluster.bootstrap_servers) as admin:
        listed = {group_id for group_id, _ in admin.list_consumer_groups()}
    assert idle not in listed and gone not in listed
    for group in (idle, gone):  # a group made again under the name starts with no offsets
        with Consumer(cluster.bootstrap_servers, group_id=group) as consumer:
            assert consumer.committed(tp) is None
