"""Kafka clients see the cluster's brokers and nothing else (issue 36, item 1): Metadata lists the
brokers alone, not the driver's bootstrap listener; FindCoordinator names a broker for each group
and transactional id, and that broker passes the coordinators' requests on to the driver; the
controller is a broker. So what a Kafka admin builds from the broker list (an explicit replica
assignment, a replication factor of every broker) is what the cluster has, and groups listed
from every broker are listed once."""

from __future__ import annotations

import re
import time

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient as KafkaAdminClient
from confluent_kafka.admin import NewTopic as KafkaNewTopic
from kafka.admin import KafkaAdminClient as PythonAdminClient

from deltabus import AdminClient
from deltabus.metadata import coordinator_node
from deltabus.rpc.kafka.frames import make
from tests.kafka import raw_frames
from tests.kafka.test_kcat import kcat

FIND_COORDINATOR, FIND_COORDINATOR_VERSION = 10, 3
GROUP, TRANSACTION = 0, 1


def find_coordinator(cluster, key: str, key_type: int) -> tuple[int, str, int]:
    """FindCoordinator's (node id, host, port) for `key`, asked of the bootstrap listener."""
    from kio.index import load_request_schema

    body = make(load_request_schema(FIND_COORDINATOR, FIND_COORDINATOR_VERSION), key=key,
                key_type=key_type)
    answer = raw_frames.call(cluster.kafka_bootstrap_servers, FIND_COORDINATOR,
                             FIND_COORDINATOR_VERSION, body)
    assert answer.error_code == 0, answer
    return answer.node_id, answer.host, answer.port


def test_kcat_lists_the_brokers_and_no_bootstrap_node(cluster) -> None:
    listing = kcat(cluster, "-L")
    assert re.search(rf"^ {cluster.config.brokers} brokers:$", listing, re.M), listing
    listed = sorted(int(b) for b in re.findall(r"^  broker (\d+) at ", listing, re.M))
    assert listed == list(range(cluster.config.brokers))
    controller = re.findall(r"^  broker (\d+) at \S+ \(controller\)$", listing, re.M)
    assert [int(c) for c in controller] in ([b] for b in listed)


def test_an_admin_creates_topics_from_the_broker_list_metadata_gives(cluster, topic_name) -> None:
    """Replicas assigned from Metadata's broker list, and a replication factor of all of them,
    as Kafka's admin tools build them: both created as asked."""
    admin = KafkaAdminClient({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    metadata = admin.list_topics(timeout=30)
    brokers = sorted(metadata.brokers)
    assert brokers == list(range(cluster.config.brokers))
    assert metadata.controller_id in brokers
    assigned, everywhere = f"{topic_name}-assigned", f"{topic_name}-all"
    assignment = [[b, brokers[(i + 1) % len(brokers)]] for i, b in enumerate(brokers)]
    created = admin.create_topics([
        KafkaNewTopic(assigned, num_partitions=len(assignment), replica_assignment=assignment),
        KafkaNewTopic(everywhere, num_partitions=1, replication_factor=len(brokers))])
    for future in created.values():
        future.result(60)  # raises the broker's error, if any
    with AdminClient(cluster.bootstrap_servers) as ours:
        got = {t.name: t for t in ours.describe_topics([assigned, everywhere])}
    assert [list(p.replicas) for p in got[assigned].partitions] == assignment
    assert sorted(got[everywhere].partitions[0].replicas) == brokers


def test_coordinators_are_brokers_that_serve_groups_and_transactions(cluster, topic_name) -> None:
    """FindCoordinator names the broker the key hashes to, at its Kafka listener; a group
    consumes and commits through it, a transaction commits through it, and groups listed
    from every broker (as kafka-python's admin lists them) come once each."""
    with AdminClient(cluster.bootstrap_servers) as ours:
        endpoints = {b.broker_id: f"{b.host}:{b.kafka_port}"
                     for b in ours.describe_cluster()["brokers"]}
    group, txn = f"{topic_name}-g", f"{topic_name}-txn"
    for key, key_type in ((group, GROUP), (txn, TRANSACTION)):
        node, host, port = find_coordinator(cluster, key, key_type)
        assert node == coordinator_node(key, endpoints)
        assert f"{host}:{port}" == endpoints[node]

    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "transactional.id": txn})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic_name, key=f"k{i}".encode(), value=f"v{i}".encode())
    producer.commit_transaction(30)

    consumer = KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": group, "auto.offset.reset": "earliest",
                              "isolation.level": "read_committed",
                              "enable.auto.commit": False})
    got: list[bytes] = []
    try:
        consumer.subscribe([topic_name])
        deadline = time.monotonic() + 60
        while len(got) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        consumer.commit(asynchronous=False)
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(10))

        admin = PythonAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
        try:
            listed = [g["group_id"] for g in admin.list_groups()]
            offsets = admin.list_group_offsets(group)[group]
        finally:
            admin.close()
        assert listed.count(group) == 1
        assert sum(o.offset for o in offsets.values()) == 10  # past the last record read
    finally:
        consumer.close()
