"""deltabus's own clients on the wire to a secured broker: SASL clients send
`authorization: Basic base64(user:password)` on every call of every kind (metadata, produce,
fetch, group, admin), SSL clients connect over TLS with the CA they are given and present their
certificate for mTLS, and a client whose security.protocol does not match the listener fails at
once with an error that says so, never hangs.

The FakeCluster's brokers run the real servicer behind a server that records each call's
metadata and TLS peer (tests/client/secure_server.py); checking the password is the broker's
part and is tested with it.
"""

from __future__ import annotations

import base64
import pathlib
import time
from collections.abc import Iterator

import pytest
import trustme

from deltabus import errors
from deltabus.client import AdminClient, Consumer, ExactlyOncePipeline, Producer
from deltabus.client.security import AUTHORIZATION_KEY
from deltabus.metadata import NewTopic
from deltabus.records import ConsumerRecord
from tests.client.fake_cluster import FakeCluster
from tests.client.secure_server import CallRecorder, SeenCall, TlsServers

SECRET = "alice-secret"
ALICE = {"sasl_username": "alice", "sasl_password": SECRET}
BASIC = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
FAIL_WITHIN_S = 10  # a mismatch fails at once; well under the 30 s request timeout


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pems(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The CA's certificate, another CA's, and alice's client certificate and key."""
    folder = tmp_path_factory.mktemp("pems")
    alice = ca.issue_cert("alice.example", common_name="alice")
    files = {"ca": ca.cert_pem, "other_ca": trustme.CA().cert_pem,
             "cert": alice.cert_chain_pems[0], "key": alice.private_key_pem}
    for name, blob in files.items():
        blob.write_to_path(str(folder / f"{name}.pem"))
    return {name: str(folder / f"{name}.pem") for name in files}


def served(servers: TlsServers) -> Iterator[FakeCluster]:
    fake = FakeCluster(brokers=2, serve=servers.serve)
    yield fake
    fake.close()


@pytest.fixture
def plain(ca: trustme.CA) -> Iterator[tuple[FakeCluster, CallRecorder]]:
    """A fake cluster on plaintext listeners, recording every call."""
    recorder = CallRecorder()
    for fake in served(TlsServers(ca, recorder, tls=False)):
        yield fake, recorder


@pytest.fixture
def tls(ca: trustme.CA) -> Iterator[tuple[FakeCluster, CallRecorder]]:
    """A fake cluster on TLS listeners (server certificates for 127.0.0.1 from `ca`)."""
    recorder = CallRecorder()
    for fake in served(TlsServers(ca, recorder)):
        yield fake, recorder


@pytest.fixture
def mtls(ca: trustme.CA) -> Iterator[tuple[FakeCluster, CallRecorder]]:
    """TLS listeners that require a client certificate signed by `ca`."""
    recorder = CallRecorder()
    for fake in served(TlsServers(ca, recorder, require_client_auth=True)):
        yield fake, recorder


def round_trip(fake: FakeCluster, settings: dict) -> None:
    """Admin calls, an idempotent produce, and a group consumer reading it back and committing:
    every kind of call a client makes."""
    with AdminClient(fake.bootstrap_servers, **settings) as admin:
        admin.create_topics([NewTopic("payments", 2, 1)])
        admin.describe_configs(["payments"])
    with Producer(fake.bootstrap_servers, **settings) as producer:
        producer.send("payments", b"v1", key=b"k").get(10)
        producer.send("payments", b"v2", partition=1).get(10)
    with Consumer(fake.bootstrap_servers, group_id="readers", auto_offset_reset="earliest",
                  heartbeat_interval_ms=50, session_timeout_ms=1000, **settings) as consumer:
        consumer.subscribe(["payments"])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while len(values) < 2:
            assert time.monotonic() < deadline, f"read only {values}"
            values += [r.value for r in consumer.poll(100)]
        consumer.commit()
        assert sorted(v or b"" for v in values) == [b"v1", b"v2"]
    with AdminClient(fake.bootstrap_servers, **settings) as admin:
        assert admin.list_consumer_group_offsets("readers")


def methods(calls: list[SeenCall]) -> set[str]:
    return {c.method for c in calls}


EVERY_KIND = {"CreateTopics", "DescribeConfigs", "Metadata", "InitProducerId", "Produce",
              "FindCoordinator", "JoinGroup", "SyncGroup", "OffsetFetch", "Fetch",
              "OffsetCommit"}


def test_sasl_plaintext_sends_basic_authorization_on_every_call(plain) -> None:
    fake, recorder = plain
    round_trip(fake, {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                      **ALICE})
    calls = recorder.seen()
    assert methods(calls) >= EVERY_KIND
    assert [c.method for c in calls if c.header(AUTHORIZATION_KEY) != [BASIC]] == []
    assert {c.transport for c in calls} == {b"insecure"}


def test_a_plaintext_client_sends_no_authorization(plain) -> None:
    fake, recorder = plain
    round_trip(fake, {})
    assert methods(recorder.seen()) >= EVERY_KIND
    assert [c for c in recorder.seen() if c.header(AUTHORIZATION_KEY)] == []


def test_ssl_client_talks_tls_with_the_ca_it_is_given(tls, pems) -> None:
    fake, recorder = tls
    round_trip(fake, {"security_protocol": "SSL", "ssl_ca_location": pems["ca"]})
    calls = recorder.seen()
    assert methods(calls) >= EVERY_KIND
    assert {c.transport for c in calls} == {b"ssl"}
    assert [c for c in calls if c.header(AUTHORIZATION_KEY)] == []


def test_sasl_ssl_client_sends_authorization_inside_tls(tls, pems) -> None:
    fake, recorder = tls
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="alice" password="{SECRET}";')
    round_trip(fake, {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                      "sasl_jaas_config": jaas, "ssl_ca_location": pems["ca"]})
    calls = recorder.seen()
    assert methods(calls) >= EVERY_KIND
    assert {c.transport for c in calls} == {b"ssl"}
    assert [c.method for c in calls if c.header(AUTHORIZATION_KEY) != [BASIC]] == []


def test_an_mtls_client_presents_its_certificate(mtls, pems) -> None:
    fake, recorder = mtls
    with AdminClient(fake.bootstrap_servers, security_protocol="SSL",
                     ssl_ca_location=pems["ca"], ssl_certificate_location=pems["cert"],
                     ssl_key_location=pems["key"]) as admin:
        admin.create_topics([NewTopic("audit", 1, 1)])
        assert admin.list_topics() == ["audit"]
    assert {c.peer_common_names for c in recorder.seen()} == {(b"alice",)}


def test_without_a_certificate_an_mtls_listener_refuses_at_once(mtls, pems) -> None:
    fake, _ = mtls
    started = time.monotonic()
    with pytest.raises(errors.NetworkError), \
            AdminClient(fake.bootstrap_servers, security_protocol="SSL",
                        ssl_ca_location=pems["ca"]) as admin:
        admin.list_topics()
    assert time.monotonic() - started < FAIL_WITHIN_S


def test_exactly_once_pipeline_producers_carry_the_authorization_too(plain) -> None:
    fake, recorder = plain
    fake.create_topic("in", 1)
    fake.create_topic("out", 1)
    fake.write("in", 0, [b"a", b"b"])

    def upper(record: ConsumerRecord) -> list[tuple[bytes | None, bytes]]:
        return [(None, (record.value or b"").upper())]

    pipeline = ExactlyOncePipeline(
        fake.bootstrap_servers, "pipe", "in", "out", upper, auto_offset_reset="earliest",
        session_timeout_ms=1000, heartbeat_interval_ms=50,
        security_protocol="SASL_PLAINTEXT", **ALICE)
    try:
        deadline = time.monotonic() + 20
        while fake.values("out", 0) != [b"A", b"B"]:
            assert time.monotonic() < deadline, f"output so far {fake.values('out', 0)}"
            pipeline.run_once(100)
    finally:
        pipeline.close()
    calls = recorder.seen()
    assert {"InitProducerId", "Produce", "OffsetCommit"} <= methods(calls)
    assert [c.method for c in calls if c.header(AUTHORIZATION_KEY) != [BASIC]] == []


# ---- mismatches fail at once, saying so -------------------------------------------------------

@pytest.mark.parametrize("settings", [{}, {"security_protocol": "SASL_PLAINTEXT", **ALICE}])
def test_a_plaintext_client_against_tls_fails_at_once_naming_the_protocol(tls, settings) -> None:
    fake, _ = tls
    started = time.monotonic()
    with pytest.raises(errors.NetworkError, match="set security.protocol"):
        with AdminClient(fake.bootstrap_servers, **settings) as admin:
            admin.list_topics()
    with pytest.raises(errors.NetworkError, match="set security.protocol"):
        with Producer(fake.bootstrap_servers, **settings) as producer:
            producer.send("payments", b"v").get(FAIL_WITHIN_S)
    assert time.monotonic() - started < FAIL_WITHIN_S


def test_an_ssl_client_against_plaintext_fails_at_once_naming_the_protocol(plain, pems) -> None:
    fake, _ = plain
    started = time.monotonic()
    with pytest.raises(errors.NetworkError, match="does not answer in TLS"), \
            AdminClient(fake.bootstrap_servers, security_protocol="SSL",
                        ssl_ca_location=pems["ca"]) as admin:
        admin.list_topics()
    assert time.monotonic() - started < FAIL_WITHIN_S


def test_a_server_certificate_from_another_ca_is_refused(tls, pems: dict[str, str]) -> None:
    fake, recorder = tls
    with pytest.raises(errors.NetworkError, match="ssl.ca.location"), \
            AdminClient(fake.bootstrap_servers, security_protocol="SASL_SSL",
                        ssl_ca_location=pems["other_ca"], **ALICE) as admin:
        admin.list_topics()
    assert recorder.seen() == [], "nothing, the password least of all, reached the server"


def test_certificate_files_are_not_needed_after_the_client_is_made(
        tls, pems: dict[str, str], tmp_path: pathlib.Path) -> None:
    fake, _ = tls
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pathlib.Path(pems["ca"]).read_bytes())
    with AdminClient(fake.bootstrap_servers, security_protocol="SSL",
                     ssl_ca_location=str(ca)) as admin:
        ca.unlink()
        assert admin.list_topics() == []
