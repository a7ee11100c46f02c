"""A whole cluster on SASL_SSL with an authorizer, as a shared network needs it: brokers register
and replicate over TLS, users made from the driver authenticate on both doors (deltabus's clients
over gRPC, kafka-python and librdkafka over the Kafka door), a super user may do anything, and a
user without ACLs is refused with nothing written."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import confluent_kafka
import grpc
import kafka
import pytest
import trustme

from deltabus import AdminClient, Cluster, NewTopic, Producer, errors
from deltabus import config as cfg
from deltabus.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.conftest import read_records

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret"}


@pytest.fixture(scope="module")
def secure(spark, tmp_path_factory) -> Iterator[tuple[Cluster, str]]:
    folder = tmp_path_factory.mktemp("secure")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca_file = str(folder / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    security = cfg.ListenerSecurity(
        security_protocol="SASL_SSL", ssl_key=server.private_key_pem.bytes(),
        ssl_certificate=b"".join(p.bytes() for p in server.cert_chain_pems),
        ssl_ca=ca.cert_pem.bytes())
    cluster = Cluster(spark, root=str(folder / "data"), brokers=2, port=0, kafka_port=0,
                      security=security, authorizer=True, super_users=("User:admin",)).start()
    try:
        for user, password in PASSWORDS.items():
            cluster.add_scram_user(user, password)
        yield cluster, ca_file
    finally:
        cluster.stop()


def _grpc(user: str, ca_file: str, password: str | None = None) -> dict:
    return dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                sasl_username=user, sasl_password=password or PASSWORDS[user],
                ssl_ca_location=ca_file)


def test_a_super_user_works_on_both_doors_and_replication_runs_over_tls(secure) -> None:
    cluster, ca_file = secure
    with AdminClient(cluster.bootstrap_servers, **_grpc("admin", ca_file)) as admin:
        admin.create_topics([NewTopic("payments", 1, 2)])
    with Producer(cluster.bootstrap_servers, acks="all", **_grpc("admin", ca_file)) as producer:
        for i in range(20):  # acks=all: the follower copied them, over the TLS inter-broker door
            producer.send("payments", f"p{i}".encode()).get(60)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap_servers, security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="admin",
        sasl_plain_password=PASSWORDS["admin"], ssl_cafile=ca_file,
        auto_offset_reset="earliest", consumer_timeout_ms=20_000)
    consumer.assign([kafka.TopicPartition("payments", 0)])
    values = [m.value for _, m in zip(range(20), consumer, strict=False)]
    consumer.close()
    assert values == [f"p{i}".encode() for i in range(20)]
    # An idempotent librdkafka producer: a broker forwards its InitProducerId to the
    # controller on its behalf (the broker credential vouches for the user it names).
    delivered: list = []
    idempotent = confluent_kafka.Producer({
        "bootstrap.servers": cluster.kafka_bootstrap_servers, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "admin",
        "sasl.password": PASSWORDS["admin"], "ssl.ca.location": ca_file,
        "enable.idempotence": True})
    idempotent.produce("payments", b"exactly-once", on_delivery=lambda e, m: delivered.append(e))
    assert idempotent.flush(60) == 0 and delivered == [None]


def test_a_user_without_acls_or_with_a_wrong_password_gets_nothing_in(secure) -> None:
    cluster, ca_file = secure
    with AdminClient(cluster.bootstrap_servers, **_grpc("admin", ca_file)) as admin:
        admin.create_topics([NewTopic("ledger", 1, 1)])
    with Producer(cluster.bootstrap_servers, **_grpc("alice", ca_file)) as producer:
        with pytest.raises(errors.TopicAuthorizationFailedError):
            producer.send("ledger", b"alice was here").get(60)
    with pytest.raises(errors.SaslAuthenticationFailedError):
        with AdminClient(cluster.bootstrap_servers,
                         **_grpc("alice", ca_file, password="guess")) as admin:
            admin.list_topics()
    seen: list[confluent_kafka.KafkaError] = []
    librdkafka = confluent_kafka.Producer({
        "bootstrap.servers": cluster.kafka_bootstrap_servers, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "guess",
        "ssl.ca.location": ca_file, "error_cb": seen.append})
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        librdkafka.poll(0.1)
    assert seen and seen[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
    with Producer(cluster.bootstrap_servers, **_grpc("admin", ca_file)) as producer:
        producer.send("ledger", b"admin was here").get(60)
    records = read_records(cluster.bootstrap_servers, "ledger", 1, 1, **_grpc("admin", ca_file))
    assert [r.value for r in records] == [b"admin was here"]  # nothing of alice's


def test_nobody_produces_under_another_users_producer_id(secure) -> None:
    """A producer id is bound to the user it was issued to: another user with WRITE on the
    topic who sends under it is refused, nothing is written, and its owner carries on."""
    cluster, ca_file = secure
    cluster.add_scram_user("mallory", "mallory-secret")
    PASSWORDS["mallory"] = "mallory-secret"
    with AdminClient(cluster.bootstrap_servers, **_grpc("admin", ca_file)) as admin:
        admin.create_topics([NewTopic("shared", 1, 1)])
        admin.create_acls([AclBinding(ResourceType.TOPIC, "shared", PatternType.LITERAL,
                                      f"User:{u}", "*", Operation.WRITE, Permission.ALLOW)
                           for u in ("alice", "mallory")])
    tls = grpc.ssl_channel_credentials(root_certificates=open(ca_file, "rb").read())
    leader = cluster.controller.image().broker(
        cluster.controller.image().partition("shared", 0).leader).address

    def as_user(user: str) -> tuple[tuple[str, str], ...]:
        token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
        return (("authorization", f"Basic {token}"),)

    def produce(stub, user: str, producer_id: int, sequence: int, value: bytes) -> int:
        return stub.Produce(pb.ProduceRequest(acks=pb.ACKS_ALL, partitions=[
            pb.PartitionProduceData(topic="shared", partition=0, producer_id=producer_id,
                                    producer_epoch=0, base_sequence=sequence,
                                    records=[pb.Record(value=value)])]),
            timeout=60, metadata=as_user(user)).partitions[0].error_code

    with grpc.secure_channel(cluster.bootstrap_servers, tls) as channel:
        alices = pb_grpc.DeltaBusStub(channel).InitProducerId(
            pb.InitProducerIdRequest(), timeout=60, metadata=as_user("alice")).producer_id
    with grpc.secure_channel(leader, tls) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        assert produce(stub, "alice", alices, 0, b"alice-0") == 0
        # Mallory sends alice's next sequence first: refused, not taken as alice's batch.
        assert produce(stub, "mallory", alices, 1, b"mallory") == \
            errors.ClusterAuthorizationFailedError.code
        assert produce(stub, "alice", alices, 1, b"alice-1") == 0
    records = read_records(cluster.bootstrap_servers, "shared", 1, 2, **_grpc("admin", ca_file))
    assert [r.value for r in records] == [b"alice-0", b"alice-1"]
