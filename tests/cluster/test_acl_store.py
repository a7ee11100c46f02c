"""ACLs through a real controller (a Delta metadata log under tmp_path) and its real doors, with no
Spark: AdminClient creates, describes and deletes them over gRPC, librdkafka and kafka-python
over the Kafka door, a restarted controller replays them, brokers get them in their heartbeat
answer and clients never in Metadata, and with an authorizer the stored ACLs decide who may
manage them.

The same over a running cluster, through its brokers: tests/cluster/test_acls.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka.admin as ck
import grpc
import kafka.admin as kp
import pytest

from deltabus import AdminClient, errors
from deltabus.cluster.controller import Controller
from deltabus.cluster.controller_apis import ControllerHandler
from deltabus.cluster.metadata_loader import MetadataLoader
from deltabus.metadata import BrokerEndpoint
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.kafka.listener import KafkaListener
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclCreation,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from tests.cluster.controller_server import ControllerServer, serve
from tests.conftest import wait_until

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(resource: ResourceType = T, name: str = "orders", pattern: PatternType = LIT,
        principal: str = "User:alice", host: str = "*", operation: Operation = Operation.READ,
        permission: Permission = ALLOW) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, operation, permission)


@pytest.fixture
def controller_server(tmp_path: Path) -> Iterator[ControllerServer]:
    yield from serve(tmp_path)


def _log_rows(server: ControllerServer) -> int:
    return len(server.controller._log.read_all())


def test_create_describe_and_delete_over_grpc(controller_server: ControllerServer) -> None:
    acls = [acl(), acl(operation=Operation.WRITE, permission=DENY, host="10.0.0.9"),
            acl(G, "billing", principal="User:bob"),
            acl(C, CLUSTER_NAME, operation=Operation.IDEMPOTENT_WRITE, principal="User:*"),
            acl(ResourceType.TRANSACTIONAL_ID, "tx-", PRE, operation=Operation.WRITE)]
    with AdminClient(controller_server.address) as admin:
        assert admin.create_acls(acls) == {a: None for a in acls}
        rows = _log_rows(controller_server)
        assert admin.create_acls([acls[0]]) == {acls[0]: None}  # there already: nothing written
        assert _log_rows(controller_server) == rows
        assert admin.describe_acls() == sorted(acls)
        assert admin.describe_acls(AclBindingFilter(resource_type=T)) == sorted(acls[:2])
        assert admin.describe_acls(AclBindingFilter(principal="User:bob")) == [acls[2]]
        with pytest.raises(errors.InvalidRequestError, match="Unknown entryFilter"):
            admin.describe_acls(AclBindingFilter(operation=Operation.UNKNOWN))

        everything, bobs, nothing = (AclBindingFilter(), AclBindingFilter(principal="User:bob"),
                                     AclBindingFilter(host="10.9.9.9"))
        deleted = admin.delete_acls([bobs, nothing])
        assert deleted == {bobs: [acls[2]], nothing: []}
        assert admin.delete_acls([everything]) == {everything: sorted(a for a in acls
                                                                      if a != acls[2])}
        assert admin.describe_acls() == []
    assert controller_server.controller.image().acls == ()


def test_each_creation_gets_its_own_answer_on_the_wire(controller_server: ControllerServer
                                                      ) -> None:
    """What a client written from the .proto alone sends: codes, some of them refused."""
    good = pb.AclBinding(resource_type=pb.RESOURCE_TYPE_TOPIC, resource_name="orders",
                         pattern_type=pb.PATTERN_TYPE_LITERAL, principal="User:alice", host="*",
                         operation=pb.OPERATION_READ, permission_type=pb.PERMISSION_TYPE_ALLOW)
    bad = [pb.AclBinding(), _with(good, pattern_type=pb.PATTERN_TYPE_MATCH),
           _with(good, principal="Group:admins"), _with(good, resource_name=""),
           _with(good, resource_type=pb.RESOURCE_TYPE_CLUSTER), _with(good, operation=99)]
    with grpc.insecure_channel(controller_server.address) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        response = stub.CreateAcls(pb.CreateAclsRequest(creations=[*bad, good]), timeout=30)
        assert [r.error_code for r in response.results] == [42] * len(bad) + [0]
        assert "kafka-cluster" in response.results[4].error_message
        described = stub.DescribeAcls(pb.DescribeAclsRequest(filter=pb.AclBindingFilter(
            resource_type=pb.RESOURCE_TYPE_ANY, pattern_type=pb.PATTERN_TYPE_ANY,
            operation=pb.OPERATION_ANY, permission_type=pb.PERMISSION_TYPE_ANY)), timeout=30)
        assert described.error_code == 0
        assert [(r.resource_name, [a.principal for a in r.acls])
                for r in described.resources] == [("orders", ["User:alice"])]
        # An empty filter message holds UNKNOWN codes: Kafka's INVALID_REQUEST.
        refused = stub.DescribeAcls(pb.DescribeAclsRequest(), timeout=30)
        assert refused.error_code == 42 and not refused.resources


def _with(message: pb.AclBinding, **changes: object) -> pb.AclBinding:
    out = pb.AclBinding()
    out.CopyFrom(message)
    for key, value in changes.items():
        setattr(out, key, value)
    return out


def test_acls_survive_a_restart_with_their_ids(controller_server: ControllerServer) -> None:
    acls = [acl(), acl(name="pay", pattern=PRE, principal="User:*"),
            acl(G, "billing", operation=Operation.DELETE)]
    with AdminClient(controller_server.address) as admin:
        admin.create_acls(acls)
        admin.delete_acls([AclBindingFilter(resource_type=G)])
    before = dict(controller_server.controller._state.acls)
    controller_server.stop()
    restarted = Controller(controller_server.config)  # replays the metadata log
    assert restarted._state.acls == before and len(before) == 2
    assert restarted.image().acls == tuple(sorted(acls[:2]))
    assert restarted.describe_acls(AclBindingFilter(principal="User:*")) == [acls[1]]


def test_brokers_get_the_acls_in_heartbeats_and_clients_never(
        controller_server: ControllerServer) -> None:
    secret_acl = acl(name="a-topic-name-only-brokers-learn-of-this-way")
    controller_server.controller.create_acls([AclCreation.of(secret_acl)], timeout_ms=0)
    channel = ControllerChannel(controller_server.address, 0,
                                broker_secret=controller_server.config.inter_broker_secret)
    try:
        epoch = channel.register(BrokerEndpoint(0, "127.0.0.1", 1), pid=1, incarnation_id="b0")
        answer = channel.heartbeat(0, epoch, 0, max_wait_ms=0)
    finally:
        channel.close()
    assert answer.metadata is not None  # a snapshot: the broker is new
    image = MetadataLoader(controller_server.config.root).replay(answer.metadata)
    assert image is not None and image.acls == (secret_acl,)

    with grpc.insecure_channel(controller_server.address) as client:
        metadata = pb_grpc.DeltaBusStub(client).Metadata(pb.MetadataRequest(), timeout=10)
    assert metadata.cluster_id
    assert secret_acl.resource_name.encode() not in metadata.SerializeToString()


def test_with_an_authorizer_the_stored_acls_decide_who_manages_acls(tmp_path: Path) -> None:
    """On PLAINTEXT every caller is User:ANONYMOUS: refused until an ACL lets it in."""
    server = ControllerServer(tmp_path, authorizer=True)
    try:
        with AdminClient(server.address) as admin:
            wanted = acl()
            assert isinstance(admin.create_acls([wanted])[wanted],
                              errors.ClusterAuthorizationFailedError)
            with pytest.raises(errors.ClusterAuthorizationFailedError):
                admin.describe_acls()
            (refused,) = admin.delete_acls([AclBindingFilter()]).values()
            assert isinstance(refused, errors.ClusterAuthorizationFailedError)
            assert server.controller.image().acls == ()

            server.controller.create_acls([AclCreation.of(acl(
                C, CLUSTER_NAME, principal="User:ANONYMOUS", operation=Operation.DESCRIBE))])
            assert admin.describe_acls() == [acl(C, CLUSTER_NAME, principal="User:ANONYMOUS",
                                                 operation=Operation.DESCRIBE)]
            assert isinstance(admin.create_acls([wanted])[wanted],
                              errors.ClusterAuthorizationFailedError)
            server.controller.create_acls([AclCreation.of(acl(
                C, CLUSTER_NAME, principal="User:ANONYMOUS", operation=Operation.ALTER))])
            assert admin.create_acls([wanted]) == {wanted: None}
    finally:
        server.stop()


def test_a_forwarded_call_is_decided_by_the_controller(controller_server: ControllerServer
                                                       ) -> None:
    """What a broker sends for its client: the creations as they came, unchecked."""
    channel = ControllerChannel(controller_server.address, 0,
                                broker_secret=controller_server.config.inter_broker_secret)
    try:
        results = channel.create_acls([AclCreation.of(acl()), AclCreation(
            T, "orders", PatternType.ANY, "User:alice", "*", Operation.READ, ALLOW)])
        assert results[0] is None and isinstance(results[1], errors.InvalidRequestError)
        assert channel.delete_acls([AclBindingFilter(resource_type=T)]) == [[acl()]]
    finally:
        channel.close()


# ---- the Kafka door ----------------------------------------------------------------------------

@pytest.fixture
def kafka_door(controller_server: ControllerServer) -> Iterator[str]:
    """The controller's Kafka listener, listed in Metadata as broker 0: a broker registered
    with that listener's port, heartbeating as a broker does (so changes, which wait for the
    live brokers to apply them, return at once). Kafka's admin clients send their requests to
    it."""
    listener = KafkaListener("127.0.0.1", 0, ControllerHandler(controller_server.controller))
    listener.start()
    channel = ControllerChannel(controller_server.address, 0,
                                broker_secret=controller_server.config.inter_broker_secret)
    stop = threading.Event()

    def heartbeats(epoch: int) -> None:
        loader = MetadataLoader(controller_server.config.root)
        while not stop.is_set():
            answer = channel.heartbeat(0, epoch, loader.applied_version, max_wait_ms=200,
                                       position=loader.position)
            if answer.metadata is not None:
                loader.replay(answer.metadata)

    try:
        epoch = channel.register(BrokerEndpoint(0, "127.0.0.1", 1, kafka_port=listener.port),
                                 pid=1, incarnation_id="b0")
        thread = threading.Thread(target=heartbeats, args=(epoch,), daemon=True)
        thread.start()
        wait_until(lambda: controller_server.controller.live_brokers() == [0],
                   "the broker to be unfenced")
        yield f"127.0.0.1:{listener.port}"
        stop.set()
        thread.join(10)
    finally:
        stop.set()
        channel.close()
        listener.stop()


def test_librdkafka_creates_describes_and_deletes_acls(controller_server: ControllerServer,
                                                       kafka_door: str) -> None:
    admin = ck.AdminClient({"bootstrap.servers": kafka_door})
    wanted = [
        ck.AclBinding(ck.ResourceType.TOPIC, "orders", ck.ResourcePatternType.LITERAL,
                      "User:alice", "*", ck.AclOperation.READ, ck.AclPermissionType.ALLOW),
        ck.AclBinding(ck.ResourceType.GROUP, "bill", ck.ResourcePatternType.PREFIXED,
                      "User:bob", "10.0.0.1", ck.AclOperation.DESCRIBE, ck.AclPermissionType.DENY),
        ck.AclBinding(ck.ResourceType.BROKER, "my-cluster", ck.ResourcePatternType.LITERAL,
                      "User:alice", "*", ck.AclOperation.ALTER, ck.AclPermissionType.ALLOW)]
    futures = admin.create_acls(wanted)
    assert futures[wanted[0]].result(30) is None and futures[wanted[1]].result(30) is None
    with pytest.raises(ck.KafkaException, match="kafka-cluster"):
        futures[wanted[2]].result(30)
    assert sorted(controller_server.controller.image().acls) == [
        acl(), acl(G, "bill", PRE, "User:bob", "10.0.0.1", Operation.DESCRIBE, DENY)]

    any_filter = ck.AclBindingFilter(
        ck.ResourceType.ANY, None, ck.ResourcePatternType.ANY, None, None,
        ck.AclOperation.ANY, ck.AclPermissionType.ANY)
    described = admin.describe_acls(any_filter).result(30)
    assert sorted((b.restype, b.name, b.principal, b.operation) for b in described) == sorted([
        (ck.ResourceType.TOPIC, "orders", "User:alice", ck.AclOperation.READ),
        (ck.ResourceType.GROUP, "bill", "User:bob", ck.AclOperation.DESCRIBE)])

    topics = ck.AclBindingFilter(
        ck.ResourceType.TOPIC, None, ck.ResourcePatternType.MATCH, None, None,
        ck.AclOperation.ANY, ck.AclPermissionType.ANY)
    deleted = admin.delete_acls([topics])[topics].result(30)
    assert [(b.name, b.principal, b.host) for b in deleted] == [("orders", "User:alice", "*")]
    assert controller_server.controller.image().acls == (
        acl(G, "bill", PRE, "User:bob", "10.0.0.1", Operation.DESCRIBE, DENY),)


def test_kafka_python_creates_describes_and_deletes_acls(controller_server: ControllerServer,
                                                         kafka_door: str) -> None:
    admin = kp.KafkaAdminClient(bootstrap_servers=kafka_door)
    try:
        wanted = kp.ACL("User:carol", "*", kp.ACLOperation.WRITE, kp.ACLPermissionType.ALLOW,
                        kp.ResourcePattern(kp.ResourceType.TOPIC, "logs-",
                                           kp.ACLResourcePatternType.PREFIXED))
        created = admin.create_acls([wanted])
        assert created["failed"] == [] and len(created["succeeded"]) == 1
        assert controller_server.controller.image().acls == (
            acl(name="logs-", pattern=PRE, principal="User:carol", operation=Operation.WRITE),)
        everything = kp.ACLFilter(None, None, kp.ACLOperation.ANY, kp.ACLPermissionType.ANY,
                                  kp.ResourcePatternFilter(kp.ResourceType.ANY, None,
                                                           kp.ACLResourcePatternType.ANY))
        found, error = admin.describe_acls(everything)
        assert error is kafka_no_error() and [a.principal for a in found] == ["User:carol"]
        ((_, matched, error),) = admin.delete_acls([everything])
        assert [a.principal for a in matched] == ["User:carol"]
    finally:
        admin.close()
    assert controller_server.controller.image().acls == ()


def kafka_no_error() -> object:
    from kafka.errors import NoError

    return NoError
