"""A broker forwards its clients' admin calls to the controller on their behalf (Kafka's
envelope, KIP-590): the broker credential vouches for the principal it names, so the controller
authorizes the client, not the broker; a client cannot name a principal itself. A real
controller, metadata log and gRPC server on SASL_PLAINTEXT with an authorizer (no Spark)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import grpc
import pytest

from deltabus import config as cfg
from deltabus import errors
from deltabus.metadata import NewTopic, ScramCredentialUpsertion
from deltabus.rpc.access import Access, acting_as
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.inter_broker import FORWARDED_PRINCIPAL_KEY
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.principal import user
from deltabus.security.scram import salted_password
from tests.cluster.controller_server import ControllerServer


@pytest.fixture
def controller(tmp_path) -> Iterator[ControllerServer]:
    server = ControllerServer(
        tmp_path, security=cfg.ListenerSecurity(security_protocol="SASL_PLAINTEXT"),
        authorizer=True, super_users=("User:admin",))
    salt = secrets.token_bytes(16)
    server.controller.alter_user_scram_credentials([], [ScramCredentialUpsertion(
        "admin", "SCRAM-SHA-256", 4096, salt,
        salted_password("SCRAM-SHA-256", "admin-secret", salt, 4096))], timeout_ms=0)
    yield server
    server.stop()


def test_a_forwarded_call_acts_as_the_client_the_broker_names(controller) -> None:
    channel = ControllerChannel(controller.address, 0,
                                broker_secret=controller.config.inter_broker_secret)
    try:
        salt = secrets.token_bytes(16)
        bob = ScramCredentialUpsertion("bob", "SCRAM-SHA-256", 4096, salt, salted_password(
            "SCRAM-SHA-256", "bob-secret", salt, 4096))
        with acting_as(Access(None, user("admin"))):  # ALTER on the cluster: a super user
            assert channel.alter_user_scram_credentials([], [bob]) == {"bob": None}
        with acting_as(Access(None, user("mallory"))):
            with pytest.raises(errors.ClusterAuthorizationFailedError):
                channel.alter_user_scram_credentials([], [bob])
            (refused,) = channel.create_topics([NewTopic("mallorys", 1, 1)], timeout_ms=0,
                                               validate_only=False)
        assert isinstance(refused.error, errors.TopicAuthorizationFailedError)
    finally:
        channel.close()
    assert controller.controller.scram_credential("bob", "SCRAM-SHA-256") is not None
    assert "mallorys" not in controller.controller.image().topics


def test_a_client_cannot_name_a_principal_without_the_broker_credential(controller) -> None:
    forged = ((FORWARDED_PRINCIPAL_KEY, "User:admin"),
              ("deltabus-broker-credential", "guessed"))
    with grpc.insecure_channel(controller.address) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                pb.CreatableTopic(name="forged", num_partitions=1, replication_factor=1)]),
                timeout=30, metadata=forged)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "forged" not in controller.controller.image().topics
