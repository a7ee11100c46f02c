"""ACLs on the gRPC door, checked as Kafka's brokers check them, against in-memory brokers behind
the real server (no Spark), with authenticated users (SASL_PLAINTEXT): each refusal is Kafka's
code, and nothing is written for a refused request."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import grpc
import pytest

from deltabus import Consumer, Producer, errors
from deltabus import config as cfg
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from deltabus.security.scram import make_credential
from tests.client.fake_cluster import FakeCluster

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
CREDENTIALS = {(u, "SCRAM-SHA-256"): make_credential("SCRAM-SHA-256", p)
               for u, p in PASSWORDS.items()}


def allow(resource: ResourceType, name: str, principal: str, *operations: Operation,
          pattern: PatternType = PatternType.LITERAL) -> list[AclBinding]:
    return [AclBinding(resource, name, pattern, principal, "*", op, Permission.ALLOW)
            for op in operations]


ACLS = [
    *allow(ResourceType.TOPIC, "orders", "User:alice", Operation.WRITE, Operation.READ),
    *allow(ResourceType.TOPIC, "public-", "User:*", Operation.DESCRIBE,
           pattern=PatternType.PREFIXED),
    *allow(ResourceType.GROUP, "billing", "User:alice", Operation.READ),
    *allow(ResourceType.TRANSACTIONAL_ID, "alice-tx", "User:alice", Operation.WRITE),
]


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster(brokers=1, security=cfg.ListenerSecurity(
        security_protocol="SASL_PLAINTEXT"),
        credentials=lambda user, mechanism: CREDENTIALS.get((user, mechanism)))
    for topic in ("orders", "secret", "public-news"):
        cluster.create_topic(topic, 1)
    cluster.authorizer = Authorizer(ACLS, super_users=["User:admin"])
    yield cluster
    cluster.close()


def _as(user: str) -> tuple[tuple[str, str], ...]:
    token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    return (("authorization", f"Basic {token}"),)


def _client(user: str) -> dict:
    return dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                sasl_username=user, sasl_password=PASSWORDS[user])


def _produce(stub, user: str, topic: str) -> pb.PartitionProduceResponse:
    return stub.Produce(pb.ProduceRequest(acks=pb.ACKS_LEADER, partitions=[
        pb.PartitionProduceData(topic=topic, partition=0, records=[pb.Record(value=b"v")])]),
        timeout=30, metadata=_as(user)).partitions[0]


def test_produce_needs_write_on_the_topic_and_nothing_is_written_without_it(fake) -> None:
    with grpc.insecure_channel(fake.bootstrap_servers) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        assert _produce(stub, "alice", "orders").error_code == 0
        for user, topic in (("bob", "orders"), ("alice", "secret")):
            refused = _produce(stub, user, topic)
            assert refused.error_code == errors.TopicAuthorizationFailedError.code
            assert topic in refused.error_message
        assert _produce(stub, "admin", "secret").error_code == 0  # a super user
    assert fake.values("orders", 0) == [b"v"] and fake.values("secret", 0) == [b"v"]
    with Producer(fake.bootstrap_servers, **_client("bob")) as producer:
        with pytest.raises(errors.TopicAuthorizationFailedError):
            producer.send("orders", b"from bob").get(30)
    assert fake.values("orders", 0) == [b"v"]


def test_fetch_needs_read_and_metadata_hides_what_the_caller_may_not_describe(fake) -> None:
    with grpc.insecure_channel(fake.bootstrap_servers) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        _produce(stub, "alice", "orders")
        request = pb.FetchRequest(max_wait_ms=0, partitions=[
            pb.FetchPartition(topic="orders", partition=0, fetch_offset=0)])
        mine = stub.Fetch(request, timeout=30, metadata=_as("alice")).partitions[0]
        assert mine.error_code == 0 and [r.value for r in mine.records] == [b"v"]
        theirs = stub.Fetch(request, timeout=30, metadata=_as("bob")).partitions[0]
        assert theirs.error_code == errors.TopicAuthorizationFailedError.code
        assert not theirs.records
        listed = stub.Metadata(pb.MetadataRequest(), timeout=30, metadata=_as("bob"))
        assert [t.name for t in listed.topics] == ["public-news"]  # DESCRIBE by prefix only
        named = stub.Metadata(pb.MetadataRequest(topics=["secret", "public-news"]),
                              timeout=30, metadata=_as("bob"))
        assert [(t.name, t.error_code) for t in named.topics] == [
            ("secret", errors.TopicAuthorizationFailedError.code), ("public-news", 0)]
    with Consumer(fake.bootstrap_servers, **_client("alice")) as consumer:
        consumer.assign([("orders", 0)])
        consumer.seek(("orders", 0), 0)
        assert [r.value for r in consumer.poll(10_000)] == [b"v"]


def test_groups_need_read_on_the_group_and_admin_calls_their_operation(fake) -> None:
    with grpc.insecure_channel(fake.bootstrap_servers) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        join = pb.JoinGroupRequest(group_id="billing", protocol_type="consumer",
                                   session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                                   protocols=[pb.JoinGroupProtocol(name="range", metadata=b"")])
        refused = stub.JoinGroup(join, timeout=30, metadata=_as("bob"))
        assert refused.error_code == errors.GroupAuthorizationFailedError.code
        created = stub.CreateTopics(pb.CreateTopicsRequest(topics=[
            pb.CreatableTopic(name="bobs", num_partitions=1, replication_factor=1)]),
            timeout=30, metadata=_as("bob"))
        assert created.topics[0].error_code == errors.TopicAuthorizationFailedError.code
        deleted = stub.DeleteTopics(pb.DeleteTopicsRequest(topics=["orders"]), timeout=30,
                                    metadata=_as("alice"))
        assert deleted.topics[0].error_code == errors.TopicAuthorizationFailedError.code
        with pytest.raises(grpc.RpcError) as info:
            stub.ElectLeaders(pb.ElectLeadersRequest(), timeout=30, metadata=_as("alice"))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "bobs" not in fake.image().topics and "orders" in fake.image().topics
    fake.authorizer = Authorizer([*ACLS, *allow(ResourceType.CLUSTER, CLUSTER_NAME, "User:bob",
                                                Operation.CREATE)])
    with grpc.insecure_channel(fake.bootstrap_servers) as channel:
        created = pb_grpc.DeltaBusStub(channel).CreateTopics(pb.CreateTopicsRequest(topics=[
            pb.CreatableTopic(name="bobs", num_partitions=1, replication_factor=1)]),
            timeout=30, metadata=_as("bob"))
    assert created.topics[0].error_code == 0 and "bobs" in fake.image().topics


def test_transaction_calls_need_write_on_the_transactional_id(fake) -> None:
    """As the Kafka door: WRITE on the transactional id for a transactional producer's calls
    and its produce requests, WRITE on each topic added, READ on the group of its offsets. The
    fake's servers have no transaction coordinator: NOT_COORDINATOR means the ACLs let it by."""
    ids = dict(transactional_id="alice-tx", producer_id=7, producer_epoch=0)
    with grpc.insecure_channel(fake.bootstrap_servers) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        init = pb.InitProducerIdRequest(transactional_id="alice-tx",
                                        transaction_timeout_ms=60_000)
        assert stub.InitProducerId(init, timeout=30, metadata=_as("bob")).error_code == \
            errors.TransactionalIdAuthorizationFailedError.code
        assert stub.InitProducerId(init, timeout=30, metadata=_as("alice")).error_code == \
            errors.NotCoordinatorError.code
        end = pb.EndTxnRequest(committed=True, **ids)
        assert stub.EndTxn(end, timeout=30, metadata=_as("bob")).error_code == \
            errors.TransactionalIdAuthorizationFailedError.code
        added = stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(topic_partitions=[
            pb.TopicPartitions(topic="orders", partitions=[0]),
            pb.TopicPartitions(topic="secret", partitions=[0])], **ids),
            timeout=30, metadata=_as("alice"))
        assert {(r.topic, r.error_code) for r in added.results} == {
            ("orders", errors.OperationNotAttemptedError.code),
            ("secret", errors.TopicAuthorizationFailedError.code)}
        offsets = stub.AddOffsetsToTxn(pb.AddOffsetsToTxnRequest(group_id="payroll", **ids),
                                       timeout=30, metadata=_as("alice"))
        assert offsets.error_code == errors.GroupAuthorizationFailedError.code
        produced = stub.Produce(pb.ProduceRequest(
            acks=pb.ACKS_LEADER, transactional_id="bobs-tx", partitions=[
                pb.PartitionProduceData(topic="orders", partition=0, producer_id=7,
                                        records=[pb.Record(value=b"t")])]),
            timeout=30, metadata=_as("alice")).partitions[0]
        assert produced.error_code == errors.TransactionalIdAuthorizationFailedError.code
    assert fake.values("orders", 0) == []
