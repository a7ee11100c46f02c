"""TLS and SASL on the Kafka door, with Kafka's own clients unmodified (kafka-python, librdkafka
through confluent-kafka) against the real Kafka listener in front of in-memory brokers (no
Spark): the right password gets in over SASL_SSL with SCRAM-SHA-256/512 and SASL_PLAINTEXT with
PLAIN; a wrong one, a request before authentication, or garbage closes only that connection."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import kafka
import pytest
import trustme

from deltabus import config as cfg
from deltabus.security.scram import ScramCredential, make_credential
from tests.client.fake_cluster import FakeCluster

TOPIC = "secured"
USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def credentials() -> dict[tuple[str, str], ScramCredential]:
    return {(name, mechanism): make_credential(mechanism, password)
            for name, password in USERS.items()
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")}


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def _tls(ca: trustme.CA, protocol: str, **settings) -> cfg.ListenerSecurity:
    server = ca.issue_cert("127.0.0.1", "localhost")
    return cfg.ListenerSecurity(
        security_protocol=protocol, ssl_key=server.private_key_pem.bytes(),
        ssl_certificate=b"".join(p.bytes() for p in server.cert_chain_pems), **settings)


def _door(security: cfg.ListenerSecurity, credentials) -> Iterator[tuple[FakeCluster, str]]:
    fake = FakeCluster(brokers=1)
    try:
        fake.create_topic(TOPIC, 1)
        address = fake.serve_kafka(0, security=security,
                                   credentials=lambda user, mech: credentials.get((user, mech)))
        yield fake, address
    finally:
        fake.close()


@pytest.fixture(scope="module")
def sasl_ssl(ca, credentials) -> Iterator[tuple[FakeCluster, str]]:
    yield from _door(_tls(ca, "SASL_SSL"), credentials)


@pytest.fixture(scope="module")
def sasl_plaintext(credentials) -> Iterator[tuple[FakeCluster, str]]:
    yield from _door(cfg.ListenerSecurity(security_protocol="SASL_PLAINTEXT"), credentials)


def _kafka_python(address: str, mechanism: str, user: str, password: str,
                  protocol: str = "SASL_SSL", ca_file: str | None = None) -> dict:
    return dict(bootstrap_servers=address, security_protocol=protocol, sasl_mechanism=mechanism,
                sasl_plain_username=user, sasl_plain_password=password, ssl_cafile=ca_file,
                request_timeout_ms=10_000)


def _first_error(settings: dict) -> confluent_kafka.KafkaError:
    """The first error librdkafka reports connecting with `settings` (it retries for ever)."""
    seen: list[confluent_kafka.KafkaError] = []
    producer = confluent_kafka.Producer({**settings, "error_cb": seen.append})
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        producer.poll(0.05)
    assert seen, "librdkafka reported no error"
    return seen[0]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_produces_and_consumes_over_sasl_ssl_with_scram(
        sasl_ssl, ca_file: str, mechanism: str) -> None:
    fake, address = sasl_ssl
    settings = _kafka_python(address, mechanism, "alice", USERS["alice"], ca_file=ca_file)
    producer = kafka.KafkaProducer(**settings)
    sent = producer.send(TOPIC, f"over {mechanism}".encode()).get(30)
    producer.close()
    consumer = kafka.KafkaConsumer(**settings, auto_offset_reset="earliest",
                                   consumer_timeout_ms=5_000)
    consumer.assign([kafka.TopicPartition(TOPIC, 0)])
    consumer.seek(kafka.TopicPartition(TOPIC, 0), sent.offset)
    assert next(iter(consumer)).value == f"over {mechanism}".encode()
    consumer.close()
    assert fake.values(TOPIC, 0)[sent.offset] == f"over {mechanism}".encode()


def test_confluent_kafka_produces_over_sasl_ssl_with_scram_sha_512(sasl_ssl, ca_file) -> None:
    fake, address = sasl_ssl
    producer = confluent_kafka.Producer({
        "bootstrap.servers": address, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bob",
        "sasl.password": USERS["bob"], "ssl.ca.location": ca_file})
    delivered: list = []
    producer.produce(TOPIC, b"from librdkafka", on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(30) == 0 and delivered == [None]
    assert b"from librdkafka" in fake.values(TOPIC, 0)


def test_a_wrong_password_is_refused_and_nothing_is_written(sasl_ssl, ca_file) -> None:
    fake, address = sasl_ssl
    before = list(fake.values(TOPIC, 0))
    for mechanism, user in (("SCRAM-SHA-256", "alice"), ("SCRAM-SHA-512", "nobody")):
        error = _first_error({
            "bootstrap.servers": address, "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": "not-it",
            "ssl.ca.location": ca_file})
        assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION
        assert "invalid credentials" in error.str()  # Kafka's words, not which part was wrong
    assert fake.values(TOPIC, 0) == before


def test_plain_over_sasl_plaintext_checks_the_same_users(sasl_plaintext) -> None:
    fake, address = sasl_plaintext
    producer = kafka.KafkaProducer(**_kafka_python(address, "PLAIN", "bob", USERS["bob"],
                                                   protocol="SASL_PLAINTEXT"))
    assert producer.send(TOPIC, b"plain").get(30).offset == 0
    producer.close()
    error = _first_error({"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT",
                          "sasl.mechanism": "PLAIN", "sasl.username": "bob",
                          "sasl.password": "wrong"})
    assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION
    assert fake.values(TOPIC, 0) == [b"plain"]


def _frame(api_key: int, version: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, 7, len(b"raw")) + b"raw"
    return struct.pack(">i", len(header) + len(body)) + header + body


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        while chunk := sock.recv(4096):
            del chunk  # an answer may come first; the connection must then end
        return True
    except ConnectionResetError:
        return True


def test_requests_before_authentication_and_garbage_close_only_their_connection(
        sasl_plaintext) -> None:
    fake, address = sasl_plaintext
    host, port = address.rsplit(":", 1)
    metadata_v1_all_topics = struct.pack(">i", -1)
    cases = [
        _frame(3, 1, metadata_v1_all_topics),  # Metadata before any SASL
        _frame(17, 1, struct.pack(">h", 6) + b"GSSAPI"),  # an unknown mechanism
        _frame(17, 0, struct.pack(">h", 5) + b"PLAIN"),  # v0: raw tokens would follow
        _frame(36, 0, struct.pack(">i", 5) + b"\x00\x01\x02\x03\x04"),  # no handshake first
        struct.pack(">i", 12) + b"\xff" * 12,  # not a request at all
        struct.pack(">i", 1 << 30),  # a frame far over socket.request.max.bytes
    ]
    for frame in cases:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(frame)
            assert _closed(sock)
    # A SCRAM exchange cut short, then garbage in place of the client-final message.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(_frame(17, 1, struct.pack(">h", 13) + b"SCRAM-SHA-256"))
        sock.sendall(_frame(36, 0, struct.pack(">i", 9) + b"n,,n=alice"[:9]))
        sock.sendall(_frame(36, 0, struct.pack(">i", 4) + b"\x00\xff\x00\xff"))
        assert _closed(sock)
    # The listener still serves everyone else.
    producer = kafka.KafkaProducer(**_kafka_python(address, "PLAIN", "alice", USERS["alice"],
                                                   protocol="SASL_PLAINTEXT"))
    producer.send(TOPIC, b"still-serving").get(30)
    producer.close()
    assert b"still-serving" in fake.values(TOPIC, 0)


def test_an_ssl_listener_requiring_client_certificates_refuses_a_client_without_one(
        ca: trustme.CA, ca_file: str, tmp_path: Path) -> None:
    security = _tls(ca, "SSL", ssl_client_auth="required", ssl_ca=ca.cert_pem.bytes())
    client = ca.issue_cert("alice.example", common_name="alice")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    client.cert_chain_pems[0].write_to_path(str(cert))
    client.private_key_pem.write_to_path(str(key))
    for fake, address in _door(security, {}):
        base = dict(bootstrap_servers=address, security_protocol="SSL", ssl_cafile=ca_file,
                    request_timeout_ms=10_000)
        producer = kafka.KafkaProducer(**base, ssl_certfile=str(cert), ssl_keyfile=str(key))
        assert producer.send(TOPIC, b"with a certificate").get(30).offset == 0
        producer.close()
        error = _first_error({"bootstrap.servers": address, "security.protocol": "SSL",
                              "ssl.ca.location": ca_file})
        assert error.code() in (confluent_kafka.KafkaError._SSL,
                                confluent_kafka.KafkaError._TRANSPORT,
                                confluent_kafka.KafkaError._ALL_BROKERS_DOWN)
        assert fake.values(TOPIC, 0) == [b"with a certificate"]
