"""Client quotas through a real controller (a Delta metadata log under tmp_path) and its real
gRPC door, with no Spark: AdminClient sets them over the wire, a restarted controller replays
them, brokers get them in their heartbeat answer and clients never in Metadata, and with an
authorizer only a caller with ALTER_CONFIGS (DESCRIBE_CONFIGS) on the cluster may alter
(describe) them.

The same over a running cluster, through its brokers: tests/rpc/test_client_quotas.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deltabus import AdminClient, errors
from deltabus.client.admin import QuotaAlteration, QuotaEntity
from deltabus.cluster.controller import Controller
from deltabus.cluster.metadata_loader import MetadataLoader
from deltabus.metadata import BrokerEndpoint
from deltabus.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclCreation,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from tests.cluster.controller_server import ControllerServer, serve

NAME_ONLY_BROKERS_LEARN = "a-client-id-only-brokers-learn-of-this-way"
ALICE = QuotaEntity.user("alice")
APP_DEFAULT_USER = QuotaEntity.user_client(None, NAME_ONLY_BROKERS_LEARN)


@pytest.fixture
def controller_server(tmp_path: Path) -> Iterator[ControllerServer]:
    yield from serve(tmp_path)


def test_quotas_survive_a_restart(controller_server: ControllerServer) -> None:
    with AdminClient(controller_server.address) as admin:
        assert admin.alter_client_quotas([
            QuotaAlteration(ALICE, ((PRODUCER_BYTE_RATE, 1024.0), (CONSUMER_BYTE_RATE, 2048.0))),
            QuotaAlteration(APP_DEFAULT_USER, ((PRODUCER_BYTE_RATE, 4096.0),))]) == {
            ALICE: None, APP_DEFAULT_USER: None}
        admin.alter_client_quotas([QuotaAlteration(ALICE, ((CONSUMER_BYTE_RATE, None),))])
    controller_server.stop()
    restarted = Controller(controller_server.config)  # replays the metadata log
    expected = {ALICE: {PRODUCER_BYTE_RATE: 1024.0}, APP_DEFAULT_USER: {PRODUCER_BYTE_RATE: 4096.0}}
    assert restarted.describe_client_quotas([], False) == expected
    assert restarted.quota_manager.quotas == expected  # what the driver's doors throttle by


def test_brokers_get_the_quotas_in_heartbeats_and_clients_never(
        controller_server: ControllerServer) -> None:
    controller_server.controller.alter_client_quotas(
        [QuotaAlteration(APP_DEFAULT_USER, ((PRODUCER_BYTE_RATE, 10.0),))], timeout_ms=0)
    assert controller_server.controller.quota_manager.quotas == {
        APP_DEFAULT_USER: {PRODUCER_BYTE_RATE: 10.0}}
    channel = ControllerChannel(controller_server.address, 0,
                                broker_secret=controller_server.config.inter_broker_secret)
    try:
        epoch = channel.register(BrokerEndpoint(0, "127.0.0.1", 1), pid=1, incarnation_id="b0")
        answer = channel.heartbeat(0, epoch, 0, max_wait_ms=0)
    finally:
        channel.close()
    assert answer.metadata is not None
    image = MetadataLoader(controller_server.config.root).replay(answer.metadata)
    assert image is not None
    assert image.client_quotas == {APP_DEFAULT_USER: {PRODUCER_BYTE_RATE: 10.0}}
    with grpc.insecure_channel(controller_server.address) as client:
        metadata = pb_grpc.DeltaBusStub(client).Metadata(pb.MetadataRequest(), timeout=10)
    assert NAME_ONLY_BROKERS_LEARN.encode() not in metadata.SerializeToString()


def test_with_an_authorizer_quotas_need_configs_rights_on_the_cluster(tmp_path: Path) -> None:
    """On PLAINTEXT every caller is User:ANONYMOUS: refused until an ACL lets it in."""
    server = ControllerServer(tmp_path, authorizer=True)
    try:
        with AdminClient(server.address) as admin:
            wanted = QuotaAlteration(ALICE, ((PRODUCER_BYTE_RATE, 1.0),))
            assert isinstance(admin.alter_client_quotas([wanted])[ALICE],
                              errors.ClusterAuthorizationFailedError)
            with pytest.raises(errors.ClusterAuthorizationFailedError):
                admin.describe_client_quotas()
            server.controller.create_acls([AclCreation.of(AclBinding(
                ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, "User:ANONYMOUS", "*",
                Operation.ALTER_CONFIGS, Permission.ALLOW))])
            assert admin.alter_client_quotas([wanted]) == {ALICE: None}
            assert admin.describe_client_quotas() == {ALICE: {PRODUCER_BYTE_RATE: 1.0}}
    finally:
        server.stop()
