"""ACLs on the Kafka door, with librdkafka (confluent-kafka) unmodified, as authenticated users
(SASL_PLAINTEXT, SCRAM-SHA-256) against the real listener in front of in-memory brokers (no
Spark): Kafka's refusals, and nothing written or read without the right ACL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from deltabus import config as cfg
from deltabus.security.acls import (
    AclBinding,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from deltabus.security.scram import make_credential
from tests.client.fake_cluster import FakeCluster

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
CREDENTIALS = {(u, "SCRAM-SHA-256"): make_credential("SCRAM-SHA-256", p)
               for u, p in PASSWORDS.items()}
KafkaError = confluent_kafka.KafkaError


def _allow(resource: ResourceType, name: str, principal: str, operation: Operation,
           pattern: PatternType = PatternType.LITERAL) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, "*", operation, Permission.ALLOW)


DOOR_ACLS = [
    _allow(ResourceType.TOPIC, "orders", "User:alice", Operation.WRITE),
    _allow(ResourceType.TOPIC, "orders", "User:alice", Operation.READ),
    _allow(ResourceType.GROUP, "billing", "User:alice", Operation.READ),
    _allow(ResourceType.TOPIC, "public-", "User:*", Operation.DESCRIBE, PatternType.PREFIXED),
]


@pytest.fixture
def door() -> Iterator[tuple[FakeCluster, str]]:
    fake = FakeCluster(brokers=1)
    for topic in ("orders", "secret", "public-news"):
        fake.create_topic(topic, 1)
    fake.authorizer = Authorizer(DOOR_ACLS)
    address = fake.serve_kafka(0, security=cfg.ListenerSecurity(
        security_protocol="SASL_PLAINTEXT"),
        credentials=lambda user, mechanism: CREDENTIALS.get((user, mechanism)))
    yield fake, address
    fake.close()


def _as(user: str, address: str) -> dict:
    return {"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": PASSWORDS[user]}


def _produce(settings: dict, topic: str) -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    producer = confluent_kafka.Producer({**settings, "message.timeout.ms": 10_000})
    producer.produce(topic, b"v", partition=0, on_delivery=lambda e, m: outcome.append(e))
    producer.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def test_produce_needs_write_and_a_refused_record_is_not_written(door) -> None:
    fake, address = door
    assert _produce(_as("alice", address), "orders") is None
    refused = _produce(_as("bob", address), "orders")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert fake.values("orders", 0) == [b"v"]


def test_metadata_shows_bob_only_what_he_may_describe(door) -> None:
    fake, address = door
    listed = AdminClient(_as("bob", address)).list_topics(timeout=30)
    assert set(listed.topics) == {"public-news"}
    assert set(AdminClient(_as("alice", address)).list_topics(timeout=30).topics) == {
        "orders", "public-news"}  # WRITE and READ imply DESCRIBE; public- is for everyone


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_consumer_needs_read_on_its_group_and_topic(door, protocol: str) -> None:
    """Both group protocols: JoinGroup, and KIP-848's ConsumerGroupHeartbeat. Bob may find
    the group's coordinator and the topic (DESCRIBE), not join the group (READ)."""
    fake, address = door
    fake.authorizer = Authorizer(DOOR_ACLS + [
        _allow(ResourceType.GROUP, "billing", "User:bob", Operation.DESCRIBE),
        _allow(ResourceType.TOPIC, "orders", "User:bob", Operation.DESCRIBE)])
    assert _produce(_as("alice", address), "orders") is None
    for user, expected in (("bob", KafkaError.GROUP_AUTHORIZATION_FAILED), ("alice", None)):
        consumer = confluent_kafka.Consumer({**_as(user, address), "group.id": "billing",
                                             "group.protocol": protocol,
                                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["orders"])
        deadline, got = time.monotonic() + 60, None
        while got is None and time.monotonic() < deadline:
            got = consumer.poll(0.5)
        consumer.close()
        assert got is not None, f"{user}'s consumer got nothing"
        if expected is None:
            assert got.error() is None and got.value() == b"v"
        else:
            error = got.error()
            assert error is not None
            if protocol == "consumer":  # librdkafka makes a refused heartbeat fatal
                assert error.code() == KafkaError._FATAL, error
                assert "Group authorization failed" in error.str(), error
            else:
                assert error.code() == expected


def test_create_and_delete_topics_need_their_operations(door) -> None:
    fake, address = door
    admin = AdminClient(_as("bob", address))
    refused = admin.create_topics([NewTopic("bobs", 1, 1)])["bobs"]
    with pytest.raises(confluent_kafka.KafkaException) as info:
        refused.result(30)
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(confluent_kafka.KafkaException) as info:
        admin.delete_topics(["orders"])["orders"].result(30)
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "bobs" not in fake.image().topics and "orders" in fake.image().topics


def test_altering_configs_needs_alter_configs_and_moving_partitions_alter_on_the_cluster(
        door) -> None:
    """IncrementalAlterConfigs and AlterConfigs check ALTER_CONFIGS on the topic;
    ElectLeaders and AlterPartitionReassignments ALTER on the cluster, and
    ListPartitionReassignments DESCRIBE on it, as Kafka does. A refused change changes nothing."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import ClusterAuthorizationFailedError

    fake, address = door
    fake.authorizer = Authorizer([
        *DOOR_ACLS, _allow(ResourceType.TOPIC, "orders", "User:alice", Operation.ALTER_CONFIGS)])

    def retention(user: str) -> KafkaError | None:
        change = ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource("topic", "orders", incremental_configs=[change])
        admin = AdminClient(_as(user, address))  # kept: a dropped client fails its futures
        try:
            admin.incremental_alter_configs([resource])[resource].result(30)
            return None
        except confluent_kafka.KafkaException as e:
            return e.args[0]

    refused = retention("bob")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "retention.ms" not in fake.image().topics["orders"].configs
    assert retention("alice") is None
    assert fake.image().topics["orders"].configs["retention.ms"] == "60000"

    admin = AdminClient(_as("alice", address))
    with pytest.raises(confluent_kafka.KafkaException) as info:
        admin.elect_leaders(confluent_kafka.ElectionType.PREFERRED, None).result(30)
    assert info.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    theirs = KafkaAdminClient(bootstrap_servers=address, security_protocol="SASL_PLAINTEXT",
                              sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                              sasl_plain_password=PASSWORDS["alice"])
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            theirs.alter_partition_reassignments({TopicPartition("orders", 0): [0]})
        with pytest.raises(ClusterAuthorizationFailedError):
            theirs.list_partition_reassignments()
    finally:
        theirs.close()


def test_delete_records_needs_delete_on_the_topic(door) -> None:
    """DeleteRecords is checked against DELETE on the topic, as Kafka checks it: alice may read
    and write "orders" but not delete from it, and nothing is deleted."""
    from confluent_kafka import KafkaException, TopicPartition

    fake, address = door
    assert _produce(_as("alice", address), "orders") is None
    admin = AdminClient(_as("alice", address))  # kept: its futures die with it
    futures = admin.delete_records([TopicPartition("orders", 0, 1)], request_timeout=30)
    with pytest.raises(KafkaException) as refused:
        next(iter(futures.values())).result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert fake.values("orders", 0) == [b"v"]
