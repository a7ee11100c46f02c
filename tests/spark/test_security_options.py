"""The `deltabus` data source takes a secured cluster's settings as Spark's Kafka source does:
`kafka.`-prefixed options (kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.jaas.config,
kafka.ssl.ca.location, ...), checked on the driver with errors naming the option, and carried to
the source's and the sink's clients. No SparkSession: the options are parsed as the data source
parses them, and the reader's and writer's clients run against a FakeCluster on TLS listeners."""

from __future__ import annotations

import base64
import pathlib
import pickle
from collections.abc import Iterator

import pyarrow as pa
import pytest
import trustme

from deltabus import errors
from deltabus.client.security import AUTHORIZATION_KEY
from deltabus.spark.sink import BatchWriter, SinkOptions
from deltabus.spark.source import SourceOptions, TopicReader
from tests.client.fake_cluster import FakeCluster
from tests.client.secure_server import CallRecorder, TlsServers

SECRET = "alice-secret"
JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
        f'username="alice" password="{SECRET}";')
BASIC = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: pathlib.Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def secured_options(bootstrap: str, ca_file: str) -> dict[str, str]:
    """What a user writes: .option("kafka.security.protocol", "SASL_SSL")... (Spark keeps the
    case the user typed; the source lowers it)."""
    return {"kafka.bootstrap.servers": bootstrap, "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-256", "kafka.sasl.jaas.config": JAAS,
            "kafka.ssl.ca.location": ca_file}


def test_source_and_sink_take_kafka_prefixed_security_options(ca_file: str) -> None:
    options = {**secured_options("127.0.0.1:9192", ca_file), "subscribe": "payments",
               "topic": "payments"}
    source = SourceOptions.parse(options, streaming=True)
    sink = SinkOptions.parse(options)
    for security in (source.security, sink.security):
        assert (security.security_protocol, security.sasl_mechanism, security.sasl_username) \
            == ("SASL_SSL", "SCRAM-SHA-256", "alice")
        assert security.ssl_ca_location == ca_file
    assert SECRET not in repr(source) + repr(sink)


def test_without_security_options_the_clients_are_plaintext() -> None:
    source = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t"},
                                 streaming=False)
    assert source.security.security_protocol == "PLAINTEXT"
    assert SinkOptions.parse({"kafka.bootstrap.servers": "h:1"}).security == source.security


def test_executors_need_no_certificate_file(ca_file: str) -> None:
    """Options are checked and files read on the driver; the pickled options carry the PEM."""
    source = SourceOptions.parse({**secured_options("h:1", ca_file), "subscribe": "t"},
                                 streaming=True)
    pathlib.Path(ca_file).unlink()
    on_executor = pickle.loads(pickle.dumps(source))
    assert on_executor.security.ssl_ca_pem == source.security.ssl_ca_pem is not None


@pytest.mark.parametrize(("option", "value", "named"), [
    ("kafka.security.protocol", "TLS", "kafka.security.protocol"),
    ("kafka.sasl.mechanism", "GSSAPI", "kafka.sasl.mechanism"),
    ("kafka.sasl.jaas.config", JAAS.replace(f' password="{SECRET}"', ""),
     "kafka.sasl.jaas.config"),
    ("kafka.ssl.ca.location", "/no/such/ca.pem", "kafka.ssl.ca.location"),
    ("kafka.ssl.truststore.location", "/etc/kafka/truststore.jks", "kafka.ssl.ca.location"),
])
def test_a_bad_security_option_names_the_kafka_option(ca_file: str, option: str, value: str,
                                                      named: str) -> None:
    options = {**secured_options("h:1", ca_file), "subscribe": "t", option: value}
    for parse in (lambda: SourceOptions.parse(options, streaming=True),
                  lambda: SinkOptions.parse(options)):
        with pytest.raises(errors.InvalidConfigError) as info:
            parse()
        assert named in str(info.value) and SECRET not in str(info.value)


def test_a_plaintext_option_with_sasl_settings_is_refused() -> None:
    with pytest.raises(errors.InvalidConfigError, match="kafka.sasl.username is set but "
                                                        "kafka.security.protocol is PLAINTEXT"):
        SinkOptions.parse({"kafka.bootstrap.servers": "h:1", "kafka.sasl.username": "alice",
                           "kafka.sasl.password": SECRET})


# ---- the clients the source and the sink make ---------------------------------------------------

@pytest.fixture
def tls(ca: trustme.CA) -> Iterator[tuple[FakeCluster, CallRecorder]]:
    recorder = CallRecorder()
    fake = FakeCluster(brokers=2, serve=TlsServers(ca, recorder).serve)
    yield fake, recorder
    fake.close()


def test_the_sink_and_the_source_talk_sasl_ssl(tls, ca_file: str) -> None:
    fake, recorder = tls
    fake.create_topic("payments", 2)
    options = {**secured_options(fake.bootstrap_servers, ca_file), "topic": "payments",
               "subscribe": "payments", "startingOffsets": "earliest"}
    writer = BatchWriter(SinkOptions.parse(options))
    rows = pa.record_batch({"key": [b"a", b"b"], "value": [b"1", b"2"]})
    assert writer.write(iter([rows])).records == 2
    assert sorted(fake.values("payments", 0) + fake.values("payments", 1)) == [b"1", b"2"]
    topics = TopicReader(SourceOptions.parse(options, streaming=False))
    try:
        assert {tp.partition for tp in topics.partitions()} == {0, 1}
    finally:
        topics.close()
    calls = recorder.seen()
    assert {"Metadata", "InitProducerId", "Produce"} <= {c.method for c in calls}
    assert {c.transport for c in calls} == {b"ssl"}
    assert [c.method for c in calls if c.header(AUTHORIZATION_KEY) != [BASIC]] == []
