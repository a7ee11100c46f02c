"""Users' SCRAM credentials through a real controller (a Delta metadata log under tmp_path) and
its real gRPC doors, with no Spark: AdminClient sets them over the wire, a restarted controller
replays them, brokers get them in their heartbeat answer, and neither the password nor the salted
password (which would let anyone authenticate) is ever written or logged, nor are the keys shown
to clients.

The same over a running cluster, with its brokers and both doors: tests/cluster/
test_scram_credentials.py.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deltabus import (
    AdminClient,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
    errors,
)
from deltabus.cluster.controller import Controller
from deltabus.cluster.metadata_loader import MetadataLoader
from deltabus.log_tables.layout import metadata_path
from deltabus.metadata import BrokerEndpoint
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.scram import salted_password, verify_password
from tests.cluster.controller_server import ControllerServer, serve

SHA256, SHA512 = "SCRAM-SHA-256", "SCRAM-SHA-512"
PASSWORD = "alice-Pa55word-that-must-never-be-stored"
SALT = b"a-salt-chosen-by-the-test"


@pytest.fixture
def controller_server(tmp_path: Path) -> Iterator[ControllerServer]:
    yield from serve(tmp_path)


def _upsert(user: str, password: str | bytes, mechanism: str = SHA256, iterations: int = 4096,
            salt: bytes | None = None) -> UserScramCredentialUpsertion:
    return UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, iterations),
                                        password, salt)


def _files_under(path: str) -> bytes:
    return b"".join(p.read_bytes() for p in Path(path).rglob("*") if p.is_file())


def test_alter_and_describe_over_grpc(controller_server: ControllerServer) -> None:
    with AdminClient(controller_server.address) as admin:
        assert admin.alter_user_scram_credentials([
            _upsert("alice", PASSWORD, SHA256, 8192), _upsert("alice", "x", SHA512),
            _upsert("bob", "bob-é".encode())]) == {"alice": None, "bob": None}
        assert admin.describe_user_scram_credentials() == {
            "alice": UserScramCredentialsDescription("alice", (
                ScramCredentialInfo(SHA256, 8192), ScramCredentialInfo(SHA512, 4096))),
            "bob": UserScramCredentialsDescription("bob", (ScramCredentialInfo(SHA256, 4096),))}
        assert admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("alice", SHA512)]) == {"alice": None}
        described = admin.describe_user_scram_credentials(["alice", "carol"])
    assert described["alice"] == UserScramCredentialsDescription(
        "alice", (ScramCredentialInfo(SHA256, 8192),))
    assert isinstance(described["carol"], errors.ResourceNotFoundError)
    assert verify_password(controller_server.controller.scram_credential("alice", SHA256),
                           PASSWORD)
    assert controller_server.controller.scram_credential("alice", SHA512) is None
    assert verify_password(controller_server.controller.scram_credential("bob", SHA256), "bob-é")


def test_each_user_gets_kafkas_error(controller_server: ControllerServer) -> None:
    with AdminClient(controller_server.address) as admin:
        results = admin.alter_user_scram_credentials([
            _upsert("few", "p", iterations=4095), _upsert("many", "p", iterations=1 << 30),
            _upsert("md5", "p", mechanism="SCRAM-MD5"), _upsert("", "p"),
            UserScramCredentialDeletion("nobody", SHA256),
            _upsert("twice", "p"), _upsert("twice", "q"), _upsert("fine", "p")])
        assert {user: type(e) for user, e in results.items()} == {
            "nobody": errors.ResourceNotFoundError,
            "few": errors.UnacceptableCredentialError,
            "many": errors.UnacceptableCredentialError,
            "md5": errors.UnsupportedSaslMechanismError,
            "": errors.UnacceptableCredentialError,
            "twice": errors.DuplicateResourceError,
            "fine": type(None)}
        assert "Too many iterations" in results["many"].message
        assert list(admin.describe_user_scram_credentials()) == ["fine"]


def test_credentials_survive_a_restart_and_neither_password_is_written_or_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = ControllerServer(tmp_path)
    try:
        with AdminClient(server.address) as admin:
            assert admin.alter_user_scram_credentials(
                [_upsert("alice", PASSWORD, salt=SALT)]) == {"alice": None}
    finally:
        server.stop()
    restarted = Controller(server.config)  # replays the metadata log
    credential = restarted.scram_credential("alice", SHA256)
    assert credential is not None and credential.iterations == 4096
    assert verify_password(credential, PASSWORD) and not verify_password(credential, "guess")

    salted = salted_password(SHA256, PASSWORD, SALT, 4096)
    stored = _files_under(metadata_path(str(tmp_path)))
    assert base64.b64encode(credential.stored_key) in stored  # the keys are there...
    for secret in (PASSWORD.encode(), salted, base64.b64encode(salted)):
        assert secret not in stored  # ...and neither password
    assert "alice" in caplog.text  # the controller logged the change
    assert PASSWORD not in caplog.text and base64.b64encode(salted).decode() not in caplog.text
    assert repr(salted) not in caplog.text


def test_brokers_get_the_credentials_in_heartbeats_and_clients_never(
        controller_server: ControllerServer) -> None:
    with AdminClient(controller_server.address) as admin:
        admin.alter_user_scram_credentials([_upsert("alice", PASSWORD)])
    credential = controller_server.controller.scram_credential("alice", SHA256)
    assert credential is not None

    channel = ControllerChannel(controller_server.address, 0,
                                broker_secret=controller_server.config.inter_broker_secret)
    try:
        epoch = channel.register(BrokerEndpoint(0, "127.0.0.1", 1), pid=1, incarnation_id="b0")
        answer = channel.heartbeat(0, epoch, 0, max_wait_ms=0)
    finally:
        channel.close()
    assert answer.metadata is not None  # a snapshot: the broker is new
    image = MetadataLoader(controller_server.config.root).replay(answer.metadata)
    assert image is not None
    held = image.scram_credential("alice", SHA256)
    assert held == credential and verify_password(held, PASSWORD)
    assert "stored_key" not in repr(image) and repr(credential.salt) not in repr(held)
    assert "stored_key" not in repr(answer) and repr(credential.salt) not in repr(answer)

    # A client's Metadata, from the same image, carries none of it.
    with grpc.insecure_channel(controller_server.address) as client:
        metadata = pb_grpc.DeltaBusStub(client).Metadata(pb.MetadataRequest(), timeout=10)
    wire = metadata.SerializeToString()
    assert metadata.cluster_id and credential.stored_key not in wire
    assert credential.server_key not in wire and credential.salt not in wire
