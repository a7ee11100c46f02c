"""TLS and authentication on the gRPC door, with a plain gRPC client built from the .proto (as a
user in any language would write one) against the real server in front of in-memory brokers (no
Spark): SASL_SSL wants `authorization: Basic` with a user's password on every call, SSL with
ssl.client.auth=required wants a client certificate, and neither lets anything through without."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import grpc
import pytest
import trustme

from deltabus import AdminClient, Producer, errors
from deltabus import config as cfg
from deltabus.rpc.status import ERROR_CODE_KEY
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.scram import make_credential
from tests.client.fake_cluster import FakeCluster

TOPIC = "secured"
SASL_AUTHENTICATION_FAILED = "58"
CREDENTIALS = {("alice", "SCRAM-SHA-256"): make_credential("SCRAM-SHA-256", "alice-secret")}


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _security(ca: trustme.CA, protocol: str, **settings) -> cfg.ListenerSecurity:
    server = ca.issue_cert("127.0.0.1")
    return cfg.ListenerSecurity(
        security_protocol=protocol, ssl_key=server.private_key_pem.bytes(),
        ssl_certificate=b"".join(p.bytes() for p in server.cert_chain_pems), **settings)


def _fake(security: cfg.ListenerSecurity) -> Iterator[FakeCluster]:
    fake = FakeCluster(brokers=1, security=security,
                       credentials=lambda user, mech: CREDENTIALS.get((user, mech)))
    fake.create_topic(TOPIC, 1)
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def sasl_ssl(ca) -> Iterator[FakeCluster]:
    yield from _fake(_security(ca, "SASL_SSL"))


def _basic(user: str, password: str) -> tuple[tuple[str, str], ...]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (("authorization", f"Basic {token}"),)


def _produce(stub: pb_grpc.DeltaBusStub, value: bytes, metadata=()) -> pb.ProduceResponse:
    return stub.Produce(pb.ProduceRequest(acks=pb.ACKS_LEADER, partitions=[
        pb.PartitionProduceData(topic=TOPIC, partition=0, records=[pb.Record(value=value)])]),
        timeout=30, metadata=metadata)


def test_sasl_ssl_takes_a_users_password_on_every_call_and_nothing_else(
        sasl_ssl: FakeCluster, ca: trustme.CA) -> None:
    tls = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    with grpc.secure_channel(sasl_ssl.bootstrap_servers, tls) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        response = _produce(stub, b"authenticated", _basic("alice", "alice-secret"))
        assert response.partitions[0].error_code == 0
        for metadata in ((), _basic("alice", "wrong"), _basic("mallory", "alice-secret"),
                         (("authorization", "Bearer abc"),),
                         (("authorization", "Basic !!notbase64"),)):
            with pytest.raises(grpc.RpcError) as info:
                _produce(stub, b"intruder", metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert dict(info.value.trailing_metadata())[ERROR_CODE_KEY] == \
                SASL_AUTHENTICATION_FAILED
            assert "alice-secret" not in info.value.details()
        with pytest.raises(grpc.RpcError):
            stub.Metadata(pb.MetadataRequest(), timeout=30)  # metadata needs a user too
    assert sasl_ssl.values(TOPIC, 0) == [b"authenticated"]


def test_a_plaintext_client_gets_an_error_from_a_tls_port_not_a_hang(
        sasl_ssl: FakeCluster) -> None:
    with grpc.insecure_channel(sasl_ssl.bootstrap_servers) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _produce(pb_grpc.DeltaBusStub(channel), b"x", _basic("alice", "alice-secret"))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_ssl_with_required_client_certificates(ca: trustme.CA) -> None:
    security = _security(ca, "SSL", ssl_client_auth="required", ssl_ca=ca.cert_pem.bytes())
    client = ca.issue_cert("alice.example", common_name="alice")
    for fake in _fake(security):
        with_certificate = grpc.ssl_channel_credentials(
            root_certificates=ca.cert_pem.bytes(), private_key=client.private_key_pem.bytes(),
            certificate_chain=client.cert_chain_pems[0].bytes())
        with grpc.secure_channel(fake.bootstrap_servers, with_certificate) as channel:
            assert _produce(pb_grpc.DeltaBusStub(channel), b"mtls").partitions[0].error_code == 0
        without = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
        with grpc.secure_channel(fake.bootstrap_servers, without) as channel:
            with pytest.raises(grpc.RpcError) as info:
                _produce(pb_grpc.DeltaBusStub(channel), b"anonymous")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert fake.values(TOPIC, 0) == [b"mtls"]


def test_deltabus_clients_work_over_sasl_ssl_and_a_wrong_password_is_refused(
        sasl_ssl: FakeCluster, ca: trustme.CA, tmp_path) -> None:
    """The clients' side (deltabus.client.security) against the servers' side, both real."""
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    secured = dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                   sasl_username="alice", ssl_ca_location=str(ca_file))
    with Producer(sasl_ssl.bootstrap_servers, sasl_password="alice-secret", **secured) as p:
        offset = p.send(TOPIC, b"from a deltabus producer").get(30).offset
    with AdminClient(sasl_ssl.bootstrap_servers, sasl_password="alice-secret",
                     **secured) as admin:
        assert TOPIC in admin.list_topics()
    with pytest.raises(errors.SaslAuthenticationFailedError):
        with AdminClient(sasl_ssl.bootstrap_servers, sasl_password="guess", **secured) as admin:
            admin.list_topics()
    assert sasl_ssl.values(TOPIC, 0)[offset] == b"from a deltabus producer"
