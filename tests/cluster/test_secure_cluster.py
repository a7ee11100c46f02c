"""A whole cluster as a shared network needs it: clients on SASL_SSL with an authorizer, brokers
on listeners of their own (Kafka's named listeners). Brokers register on a controller listener and
replicate on an inter-broker listener, both SSL on addresses of their own, which no client is
told of; users made from the driver authenticate on both doors (deltabus's clients over gRPC,
kafka-python and librdkafka over the Kafka door), which tell them the advertised addresses; a
super user may do anything, and a user without ACLs is refused with nothing written."""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import confluent_kafka
import grpc
import kafka
import pytest
import trustme

from deltabus import AdminClient, Cluster, NewTopic, Producer, errors
from deltabus import config as cfg
from deltabus.listeners import ListenerConfig
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.security.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from tests.conftest import read_records

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret"}
# Clients bind loopback and are told "localhost"; brokers replicate on 127.0.0.2 and register
# with the controller on 127.0.0.3, over SSL with the broker credential.
LISTENERS = ListenerConfig.parse(
    listeners="CLIENT://127.0.0.1:0", advertised_listeners="CLIENT://localhost:0",
    grpc_listeners="CLIENT://127.0.0.1:0,REPLICATION://127.0.0.2:0,CONTROLLER://127.0.0.3:0",
    grpc_advertised_listeners="CLIENT://localhost:0",
    listener_security_protocol_map="CLIENT:SASL_SSL,REPLICATION:SSL,CONTROLLER:SSL",
    inter_broker_listener_name="REPLICATION", controller_listener_names="CONTROLLER")


@pytest.fixture(scope="module")
def secure(spark, tmp_path_factory) -> Iterator[tuple[Cluster, str]]:
    folder = tmp_path_factory.mktemp("secure")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "127.0.0.2", "127.0.0.3", "localhost")
    ca_file = str(folder / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    security = cfg.ListenerSecurity(
        ssl_key=server.private_key_pem.bytes(),
        ssl_certificate=b"".join(p.bytes() for p in server.cert_chain_pems),
        ssl_ca=ca.cert_pem.bytes())
    cluster = Cluster(spark, root=str(folder / "data"), brokers=2, security=security,
                      listeners=LISTENERS, authorizer=True, super_users=("User:admin",)).start()
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


def test_acls_govern_a_diskless_topic_as_any_other(secure) -> None:
    """A diskless topic (one table, its leader commits) is authorized as a replicated one:
    alice without ACLs may neither produce nor read; granted WRITE and READ on it (and READ on
    her group), she produces over the Kafka door and consumes over gRPC."""
    cluster, ca_file = secure
    with AdminClient(cluster.bootstrap_servers, **_grpc("admin", ca_file)) as admin:
        admin.create_topics([NewTopic("orders", 1, 1, {"diskless.enable": "true"})])
    with Producer(cluster.bootstrap_servers, **_grpc("alice", ca_file)) as producer:
        with pytest.raises(errors.TopicAuthorizationFailedError):
            producer.send("orders", b"refused").get(60)
    with pytest.raises(errors.TopicAuthorizationFailedError):
        read_records(cluster.bootstrap_servers, "orders", 1, 1, **_grpc("alice", ca_file))
    with AdminClient(cluster.bootstrap_servers, **_grpc("admin", ca_file)) as admin:
        admin.create_acls([AclBinding(ResourceType.TOPIC, "orders", PatternType.LITERAL,
                                      "User:alice", "*", op, Permission.ALLOW)
                           for op in (Operation.WRITE, Operation.READ)])
    delivered: list = []
    librdkafka = confluent_kafka.Producer({
        "bootstrap.servers": cluster.kafka_bootstrap_servers, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
        "sasl.password": PASSWORDS["alice"], "ssl.ca.location": ca_file, "acks": "all"})
    for i in range(3):
        librdkafka.produce("orders", f"o{i}".encode(), on_delivery=lambda e, m: delivered.append(e))
    assert librdkafka.flush(60) == 0 and delivered == [None] * 3
    records = read_records(cluster.bootstrap_servers, "orders", 1, 3, **_grpc("alice", ca_file))
    assert [r.value for r in records] == [b"o0", b"o1", b"o2"]


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
    image = cluster.controller.image()
    leader = image.on_listener("CLIENT").broker(image.partition("shared", 0).leader).address

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


def _stub(address: str, ca_file: str) -> pb_grpc.DeltaBusStub:
    tls = grpc.ssl_channel_credentials(root_certificates=open(ca_file, "rb").read())
    return pb_grpc.DeltaBusStub(grpc.secure_channel(address, tls))


def _basic(user: str) -> tuple[tuple[str, str], ...]:
    token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    return (("authorization", f"Basic {token}"),)


def test_clients_are_told_only_their_listeners_advertised_addresses(secure) -> None:
    cluster, ca_file = secure
    assert cluster.bootstrap_servers.startswith("localhost:")
    assert cluster.kafka_bootstrap_servers.startswith("localhost:")
    image = cluster.controller.image()
    # Brokers replicate on their REPLICATION listeners (127.0.0.2), SSL, with the credential.
    assert {b.host for b in image.brokers} == {"127.0.0.2"}
    metadata = _stub(cluster.bootstrap_servers, ca_file).Metadata(
        pb.MetadataRequest(), timeout=60, metadata=_basic("admin"))
    told = {(b.host, b.port, b.kafka_port) for b in metadata.brokers}
    assert told == {(b.listener("grpc", "CLIENT").host, b.listener("grpc", "CLIENT").port,
                     b.listener("kafka", "CLIENT").port) for b in image.brokers}
    assert {host for host, _, _ in told} == {"localhost"}
    assert all(not b.listeners for b in metadata.brokers)  # no internal address leaks
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=cluster.kafka_bootstrap_servers, security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="admin",
        sasl_plain_password=PASSWORDS["admin"], ssl_cafile=ca_file)
    try:
        brokers = admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    assert {(b["host"], b["port"]) for b in brokers} == {
        (b.listener("kafka", "CLIENT").host, b.listener("kafka", "CLIENT").port)
        for b in image.brokers}


def test_the_internal_listeners_serve_no_client(secure) -> None:
    """The broker lifecycle is not served where clients come in, and the controller's own
    listener answers only the cluster's brokers, whoever the caller authenticates as."""
    cluster, ca_file = secure
    client = grpc.secure_channel(cluster.bootstrap_servers, grpc.ssl_channel_credentials(
        root_certificates=open(ca_file, "rb").read()))
    register = client.unary_unary(
        "/deltabus.internal.v1.BrokerLifecycle/RegisterBroker",
        request_serializer=ipb.RegisterBrokerRequest.SerializeToString,
        response_deserializer=ipb.RegisterBrokerResponse.FromString)
    with pytest.raises(grpc.RpcError) as refused:
        register(ipb.RegisterBrokerRequest(broker_id=0, host="127.0.0.9", port=1), timeout=60,
                 metadata=_basic("admin"))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED  # not served on CLIENT
    controller = cluster.listener_address("CONTROLLER")
    assert controller.startswith("127.0.0.3:")
    with pytest.raises(grpc.RpcError) as refused:
        _stub(controller, ca_file).Metadata(pb.MetadataRequest(), timeout=60,
                                            metadata=_basic("admin"))
    assert dict(refused.value.trailing_metadata())["deltabus-error-code"] == str(
        errors.ClusterAuthorizationFailedError.code)
    # Leaders serve follower fetches on the REPLICATION listener only.
    image = cluster.controller.image()
    leader = image.on_listener("CLIENT").brokers[0].address
    fetch = grpc.secure_channel(leader, grpc.ssl_channel_credentials(
        root_certificates=open(ca_file, "rb").read())).unary_unary(
        "/deltabus.internal.v1.ReplicaFetch/Fetch",
        request_serializer=ipb.ReplicaFetchRequest.SerializeToString,
        response_deserializer=ipb.ReplicaFetchResponse.FromString)
    with pytest.raises(grpc.RpcError) as refused:
        fetch(ipb.ReplicaFetchRequest(replica_id=1), timeout=60, metadata=_basic("admin"))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert cluster.controller.wait_for_brokers(2, 60)  # the real brokers carry on


def _https(url: str, ca_file: str, user: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET over HTTPS, with HTTP Basic credentials of `user`."""
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", _basic(user)[0][1])
    try:
        with urllib.request.urlopen(request, timeout=60,
                                    context=ssl.create_default_context(cafile=ca_file)) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_metrics_need_a_user_who_may_describe_the_cluster_and_are_served_over_tls(
        secure) -> None:
    cluster, ca_file = secure
    sd = cluster.prometheus_sd_url
    assert sd.startswith("https://localhost:")
    assert _https(sd, ca_file)[0] == 401  # no credentials
    assert _https(sd, ca_file, "alice")[0] == 403  # no DESCRIBE on the cluster
    status, body = _https(sd, ca_file, "admin")
    assert status == 200
    groups = json.loads(body)
    assert sorted(g["labels"]["broker"] for g in groups) == ["-1", "0", "1"]
    assert {g["labels"]["__scheme__"] for g in groups} == {"https"}
    for g in groups:  # every node's metrics behind the same security
        url = f"https://{g['targets'][0]}{g['labels']['__metrics_path__']}"
        assert _https(url, ca_file)[0] == 401
        status, body = _https(url, ca_file, "admin")
        assert status == 200 and b"kafka_network_requestmetrics_requests_total" in body


def test_the_console_shows_a_user_only_the_topics_it_may_describe(secure) -> None:
    """In a real browser signed in as alice, who may DESCRIBE one topic of two."""
    from selenium.webdriver.common.by import By

    from tests.conftest import wait_until
    from tests.monitoring.browser import chromium, screenshot

    cluster, ca_file = secure
    with AdminClient(cluster.bootstrap_servers, **_grpc("admin", ca_file)) as admin:
        admin.create_topics([NewTopic("shown", 1, 2), NewTopic("hidden", 1, 2)])
        admin.create_acls([AclBinding(ResourceType.TOPIC, "shown", PatternType.LITERAL,
                                      "User:alice", "*", Operation.DESCRIBE, Permission.ALLOW)])
    status, body = _https(cluster.console_url + "/api/overview", ca_file, "admin")
    assert status == 200
    assert {"shown", "hidden"} <= {t["name"] for t in json.loads(body)["topics"]}
    assert _https(cluster.console_url, ca_file)[0] == 401
    with chromium(user="alice", password=PASSWORDS["alice"]) as browser:
        browser.get(cluster.console_url)
        wait_until(lambda: browser.find_elements(By.ID, "topic-shown"),
                   "the console to list the topic alice may describe")
        assert browser.find_elements(By.ID, "topic-hidden") == []
        assert len(browser.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")) == 2
        screenshot(browser, "console-as-alice")
