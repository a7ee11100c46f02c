"""kcat (librdkafka 2.0, Debian's) and KafkaJS, unmodified, over SASL_SSL with SCRAM against the
real Kafka door in front of in-memory brokers (no Spark), certificates made by trustme: each
produces and consumes with the right password, and a wrong one ends it at once with an
authentication error and nothing written.

kcat found two things a newer librdkafka hides: it uses SASL only where ApiVersions advertises
SaslHandshake from v0, and it repeats its own nonce in SCRAM's client-final message (which
Kafka's broker accepts)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import trustme

from deltabus import config as cfg
from deltabus.security.scram import ScramCredential, make_credential
from tests.client.fake_cluster import FakeCluster
from tests.kafka.test_kafkajs import json_lines, run_node_at
from tests.kafka.test_kcat import run_kcat

PARTITIONS = 3
USER, PASSWORD = "alice", "alice-secret"
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
FAILED_FAST_S = 15  # a refused client must give up well within this (no retry loops)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeCluster, str, str]]:
    """A one-broker fake cluster behind a SASL_SSL Kafka door: (fake, address, CA file)."""
    ca = trustme.CA()
    ca_file = str(tmp_path_factory.mktemp("tls") / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    server = ca.issue_cert("127.0.0.1", "localhost")
    security = cfg.ListenerSecurity(
        security_protocol="SASL_SSL", ssl_key=server.private_key_pem.bytes(),
        ssl_certificate=b"".join(p.bytes() for p in server.cert_chain_pems))
    credentials: dict[tuple[str, str], ScramCredential] = {
        (USER, m): make_credential(m, PASSWORD) for m in MECHANISMS}
    fake = FakeCluster(brokers=1)
    try:
        address = fake.serve_kafka(0, security=security,
                                   credentials=lambda user, m: credentials.get((user, m)))
        yield fake, address, ca_file
    finally:
        fake.close()


def topic(fake: FakeCluster, name: str) -> str:
    fake.create_topic(name, PARTITIONS)
    return name


def stored(fake: FakeCluster, name: str) -> list[bytes | None]:
    return sorted((v for p in range(PARTITIONS) for v in fake.values(name, p)),
                  key=lambda v: v or b"")


# ---- kcat ---------------------------------------------------------------------------------------

def kcat_security(ca_file: str, mechanism: str, password: str = PASSWORD) -> list[str]:
    settings = {"security.protocol": "SASL_SSL", "sasl.mechanisms": mechanism,
                "sasl.username": USER, "sasl.password": password, "ssl.ca.location": ca_file}
    return [arg for key, value in settings.items() for arg in ("-X", f"{key}={value}")]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_produces_and_consumes_over_sasl_ssl_with_scram(door, mechanism: str) -> None:
    fake, address, ca_file = door
    name = topic(fake, f"kcat-{mechanism.lower()}")
    lines = [(f"user{i % 4}", f"paid {i}") for i in range(12)]
    cmd, rc, _, err = run_kcat(address, *kcat_security(ca_file, mechanism), "-P", "-t", name,
                               "-K:", stdin="".join(f"{k}:{v}\n" for k, v in lines))
    assert rc == 0, f"{cmd} exited {rc}: {err[:3000]}"
    assert stored(fake, name) == sorted(v.encode() for _, v in lines)

    cmd, rc, out, err = run_kcat(address, *kcat_security(ca_file, mechanism), "-C", "-t", name,
                                 "-e", "-o", "beginning", "-f", "%k:%s\\n")
    assert rc == 0, f"{cmd} exited {rc}: {err[:3000]}"
    assert sorted(out.splitlines()) == sorted(f"{k}:{v}" for k, v in lines)


def test_kcat_with_a_wrong_password_fails_at_once_and_writes_nothing(door) -> None:
    fake, address, ca_file = door
    name = topic(fake, "kcat-refused")
    started = time.monotonic()
    _, rc, out, err = run_kcat(address, *kcat_security(ca_file, "SCRAM-SHA-256", "not-it"),
                               "-P", "-t", name, "-m", "5", stdin="should not land\n",
                               timeout_s=FAILED_FAST_S)
    assert rc != 0 and out == ""
    assert "Authentication failure" in err
    assert "invalid credentials" in err  # Kafka's words, not which part was wrong
    assert time.monotonic() - started < FAILED_FAST_S
    assert stored(fake, name) == []


# ---- KafkaJS ------------------------------------------------------------------------------------

def kafkajs_security(ca_file: str, mechanism: str, password: str = PASSWORD) -> dict[str, str]:
    """What tests/kafka/node/security.js reads: Kafka's client configs as variables."""
    return {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SSL_CA_LOCATION": ca_file,
            "KAFKA_SASL_MECHANISM": mechanism, "KAFKA_SASL_USERNAME": USER,
            "KAFKA_SASL_PASSWORD": password}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafkajs_produces_and_its_group_consumes_over_sasl_ssl_with_scram(
        door, mechanism: str) -> None:
    fake, address, ca_file = door
    name = topic(fake, f"kafkajs-{mechanism.lower()}")
    env = kafkajs_security(ca_file, mechanism)
    messages = [(f"user{i % 5}", f"hi there {i}") for i in range(10)]
    done = run_node_at(address, "producer.js", name, *(f"{k}:{v}" for k, v in messages),
                       env=env)
    assert done.returncode == 0, done.stderr
    assert {m["errorCode"] for m in json_lines(done.stdout)} == {0}
    assert stored(fake, name) == sorted(v.encode() for _, v in messages)

    # The group's coordinator is another door of the same cluster: KafkaJS authenticates there
    # too before it joins.
    done = run_node_at(address, "consumer.js", name, f"{name}-readers", str(len(messages)),
                       env=env)
    assert done.returncode == 0, done.stderr
    assert sorted((m["key"], m["value"]) for m in json_lines(done.stdout)) == sorted(messages)


def test_kafkajs_with_a_wrong_password_fails_at_once_and_writes_nothing(door) -> None:
    fake, address, ca_file = door
    name = topic(fake, "kafkajs-refused")
    started = time.monotonic()
    done = run_node_at(address, "producer.js", name, "k:should not land",
                       env=kafkajs_security(ca_file, "SCRAM-SHA-512", "not-it"),
                       timeout_s=FAILED_FAST_S)
    assert done.returncode == 1
    assert json_lines(done.stdout) == []
    assert "KafkaJSSASLAuthenticationError" in done.stderr
    assert "invalid credentials" in done.stderr
    assert time.monotonic() - started < FAILED_FAST_S
    assert stored(fake, name) == []
