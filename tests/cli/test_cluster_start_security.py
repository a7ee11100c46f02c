"""`deltabus cluster start` takes the broker side of security with Kafka's names: the flags map to
the cluster's config (PEM files read on the driver), `--override` takes server.properties names,
`--add-scram` is kafka-storage's; a bad value is one error line before Spark starts, and a
password is never printed. The last test starts a SASL_SSL cluster in a process of its own."""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trustme

from deltabus import AdminClient, NewTopic, Producer, errors
from deltabus import config as cfg
from deltabus.cli import broker_security, cluster_command
from deltabus.cli.main import build_parser, main
from deltabus.security.scram import DEFAULT_ITERATIONS
from tests.conftest import free_port_block

SECRET = "admin-secret"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PEM files of a trustme CA and a certificate for loopback: the flags' paths."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"cert": str(folder / "server.pem"), "key": str(folder / "server.key"),
             "ca": str(folder / "ca.pem")}
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(paths["cert"], append=True)
    server.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    return paths


def start_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["cluster", "start", *argv])


def tls_flags(tls: dict[str, str]) -> list[str]:
    return ["--ssl-certificate-location", tls["cert"], "--ssl-key-location", tls["key"],
            "--ssl-ca-location", tls["ca"]]


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tripwire: these starts must fail on their arguments, before Spark is asked for."""
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("cluster start reached Spark with arguments it should refuse")
    monkeypatch.setattr("deltabus.cluster.cluster.local_spark", refuse)  # start imports it
    monkeypatch.setattr(cluster_command, "spark_session", refuse)


# ---- flags to config ----------------------------------------------------------------------------

def test_without_security_flags_the_cluster_is_as_before() -> None:
    args = start_args()
    assert broker_security.cluster_settings(args) == {}
    assert broker_security.scram_users(args) == []


def test_the_flags_map_to_the_clusters_security(tls: dict[str, str]) -> None:
    args = start_args("--security-protocol", "sasl_ssl", *tls_flags(tls),
                      "--ssl-client-auth", "required",
                      "--sasl-enabled-mechanisms", "SCRAM-SHA-256, scram-sha-512",
                      "--authorizer", "--super-users", "User:admin; User:ops",
                      "--allow-everyone-if-no-acl-found")
    settings = broker_security.cluster_settings(args)
    security = settings.pop("security")
    assert settings == {"authorizer": True, "super_users": ("User:admin", "User:ops"),
                        "allow_everyone_if_no_acl_found": True}
    assert security.security_protocol == "SASL_SSL"
    assert security.ssl_certificate == pathlib.Path(tls["cert"]).read_bytes()
    assert security.ssl_key == pathlib.Path(tls["key"]).read_bytes()
    assert security.ssl_ca == pathlib.Path(tls["ca"]).read_bytes()
    assert security.ssl_client_auth == "required"
    assert security.sasl_enabled_mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert broker_security.describe({"security": security, **settings}) == (
        "Security: security.protocol=SASL_SSL, sasl.enabled.mechanisms=SCRAM-SHA-256,"
        "SCRAM-SHA-512, ssl.client.auth=required, authorizer on, super.users=User:admin;User:ops")


def test_override_takes_server_properties_names_and_a_flag_wins(tls: dict[str, str]) -> None:
    args = start_args(
        "--override", "security.protocol=SASL_PLAINTEXT",
        "--override", "authorizer.class.name="
                      "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "super.users=User:from-override",
        "--override", "allow.everyone.if.no.acl.found=false",
        "--override", "sasl.enabled.mechanisms=PLAIN",
        "--super-users", "User:from-flag")
    settings = broker_security.cluster_settings(args)
    assert settings["security"].security_protocol == "SASL_PLAINTEXT"
    assert settings["security"].sasl_enabled_mechanisms == ("PLAIN",)
    assert settings["authorizer"] is True
    assert settings["super_users"] == ("User:from-flag",)
    assert settings["allow_everyone_if_no_acl_found"] is False
    no_authorizer = start_args("--override", "authorizer.class.name=")
    assert broker_security.cluster_settings(no_authorizer)["authorizer"] is False


def test_override_takes_the_kafka_listeners_limits_by_their_kafka_names() -> None:
    args = start_args("--override", "max.connections.per.ip=100",
                      "--override", "connections.max.idle.ms=60000",
                      "--override", "num.io.threads=4")
    assert broker_security.cluster_settings(args) == {"socket_server": cfg.SocketServerConfig(
        max_connections_per_ip=100, connections_max_idle_ms=60_000, num_io_threads=4)}


def test_override_takes_the_broker_defaults_kafkas_server_properties_sets() -> None:
    """num.partitions and default.replication.factor (what auto-created topics and a CreateTopics
    without counts get), and every other broker config deltabus implements, by Kafka's name."""
    args = start_args("--override", "num.partitions=3",
                      "--override", "default.replication.factor=2",
                      "--override", "log.retention.hours=168",
                      "--override", "group.initial.rebalance.delay.ms=0")
    assert broker_security.cluster_settings(args) == {
        "num_partitions": 3, "default_replication_factor": 2,
        "topic_config_defaults": {"retention.ms": "604800000"},
        "group": cfg.GroupConfig(group_initial_rebalance_delay_ms=0)}


def test_named_listeners_take_kafkas_flags_and_server_properties_names(
        tls: dict[str, str]) -> None:
    args = start_args(
        "--listeners", "CLIENT://0.0.0.0:9092",
        "--advertised-listeners", "CLIENT://bus.example.com:9092",
        "--grpc-listeners", "CLIENT://0.0.0.0:9192,REPLICATION://127.0.0.2:0",
        "--override", "listener.security.protocol.map=CLIENT:SASL_SSL,REPLICATION:SSL",
        "--override", "inter.broker.listener.name=REPLICATION", *tls_flags(tls), "--authorizer")
    settings = broker_security.cluster_settings(args)
    listeners = settings["listeners"]
    assert [(x.name, x.door, x.host, x.port, x.security_protocol)
            for x in listeners.grpc + listeners.kafka] == [
        ("CLIENT", "grpc", "0.0.0.0", 9192, "SASL_SSL"),
        ("REPLICATION", "grpc", "127.0.0.2", 0, "SSL"),
        ("CONTROLLER", "grpc", "127.0.0.2", 0, "SSL"),  # the controller's own, any free port
        ("CLIENT", "kafka", "0.0.0.0", 9092, "SASL_SSL")]
    assert listeners.kafka[0].advertised_host == "bus.example.com"
    assert listeners.inter_broker_listener_name == "REPLICATION"
    assert broker_security.describe(settings) == (
        "Security: listener.security.protocol.map=CLIENT:SASL_SSL,CONTROLLER:SSL,"
        "REPLICATION:SSL, inter.broker.listener.name=REPLICATION, "
        "controller.listener.names=CONTROLLER, "
        "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512, ssl.client.auth=none, "
        "authorizer on, super.users=(none)")
    # Only Kafka listeners named: the gRPC door is one listener of the first one's name, on
    # its host and the bootstrap port (and the controller's own beside it).
    only_kafka = broker_security.cluster_settings(
        start_args("--listeners", "PLAINTEXT://127.0.0.5:9092"), ("127.0.0.1", 9192))
    (grpc,) = only_kafka["listeners"].client_grpc()
    assert (grpc.name, grpc.host, grpc.port) == ("PLAINTEXT", "127.0.0.5", 9192)


def test_override_turns_topic_auto_creation_off_as_kafka_names_it() -> None:
    args = start_args("--override", "auto.create.topics.enable=false")
    assert broker_security.cluster_settings(args) == {"auto_create_topics_enable": False}
    on = start_args("--override", "auto.create.topics.enable=TRUE")
    assert broker_security.cluster_settings(on) == {"auto_create_topics_enable": True}


def test_add_scram_is_kafka_storages_flag() -> None:
    users = broker_security.scram_users(start_args(
        "--add-scram", f"SCRAM-SHA-256=[name=admin,password={SECRET}]",
        "--add-scram", 'scram-sha-512=[name="ops",iterations=8192,password="p=a;ss"]'))
    assert [(u.mechanism, u.name, u.password, u.iterations) for u in users] == [
        ("SCRAM-SHA-256", "admin", SECRET, DEFAULT_ITERATIONS),
        ("SCRAM-SHA-512", "ops", "p=a;ss", 8192)]
    assert SECRET not in repr(users)


# ---- bad values ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "says"), [
    (["--security-protocol", "TLS"], "security.protocol must be one of PLAINTEXT, SSL, "
                                     "SASL_PLAINTEXT, SASL_SSL, not 'TLS'"),
    (["--security-protocol", "SASL_SSL"], "needs the listeners' certificate and key"),
    (["--security-protocol", "SSL", "--ssl-certificate-location", "/no/such/cert.pem",
      "--ssl-key-location", "/no/such/key.pem"],
     "cannot read ssl.certificate.location /no/such/cert.pem"),
    (["--ssl-certificate-location", "/etc/hostname"],
     "--ssl-certificate-location needs --security-protocol SSL or SASL_SSL, not PLAINTEXT"),
    (["--security-protocol", "SASL_PLAINTEXT", "--sasl-enabled-mechanisms", "GSSAPI"],
     "sasl.enabled.mechanisms takes PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, not GSSAPI"),
    (["--ssl-client-auth", "requested"], "ssl.client.auth must be none or required"),
    (["--super-users", "admin"], "--super-users lists principals as User:name"),
    (["--override", "num.network.threads=8"], "--override num.network.threads is not a setting"),
    (["--override", "log.dirs=/var/kafka-logs"], "--override log.dirs is not a setting"),
    (["--override", "num.partitions=0"], "num.partitions must be at least 1, not 0"),
    (["--override", "default.replication.factor=two"],
     "Invalid value two for configuration default.replication.factor: Not a number"),
    (["--override", "max.connections=many"],
     "Invalid value many for configuration max.connections: Not a number of type INT"),
    (["--override", "connections.max.idle.ms=0"], "connections.max.idle.ms must be at least 1"),
    (["--listeners", "CLIENT://127.0.0.1:9092"],
     "no security protocol defined for listener CLIENT"),
    (["--listeners", "SASL_SSL://127.0.0.1:9092", "--security-protocol", "SASL_SSL"],
     "--security-protocol sets the unnamed listeners"),
    (["--grpc-listeners", "PLAINTEXT://127.0.0.1:9192", "--kafka-port", "9092"],
     "--kafka-port sets the unnamed listeners"),
    (["--listeners", "PLAINTEXT://127.0.0.1:9092", "--inter-broker-listener-name", "BROKER"],
     "inter.broker.listener.name must be a listener name defined in grpc.listeners"),
    (["--listeners", "SSL://127.0.0.1:9092"], "needs the listeners' certificate and key"),
    (["--override", "auto.create.topics.enable=no"],
     "Invalid value no for configuration auto.create.topics.enable: Expected value to be "
     "either true or false"),
    (["--override", "ssl.keystore.location=/etc/kafka/keystore.jks"],
     "ssl.keystore.location is Java's key or trust store setting"),
    (["--add-scram", f"SCRAM-SHA-1=[name=admin,password={SECRET}]"],
     "The add-scram mechanism SCRAM-SHA-1 is not supported"),
    (["--add-scram", f"SCRAM-SHA-256=name=admin,password={SECRET}"],
     "--add-scram takes MECHANISM=[name=NAME,password=PASSWORD]"),
    (["--add-scram", f"SCRAM-SHA-256=[password={SECRET}]"], "you must supply 'name'"),
    (["--add-scram", "SCRAM-SHA-256=[name=admin]"], "you must supply a non-empty 'password'"),
    (["--add-scram", f"SCRAM-SHA-256=[name=admin,{SECRET}]"], "each component is key=value"),
    (["--add-scram", f"SCRAM-SHA-256=[name=admin,password={SECRET},salt=c2FsdA==]"],
     "unknown SCRAM configurations: salt"),
    (["--add-scram", f"SCRAM-SHA-256=[name=admin,password={SECRET},iterations=10]"],
     "iterations must be a number from 4096 to 16384"),
])
def test_a_bad_value_is_one_error_line_before_spark_starts(
        no_spark: None, capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    rc = main(["cluster", "start", "--bootstrap-server", "127.0.0.1:9192", *argv])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert says in lines[0]
    assert SECRET not in err


# ---- a real start -------------------------------------------------------------------------------

@pytest.fixture
def secured_start(tmp_path: pathlib.Path, tls: dict[str, str]
                  ) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    """`deltabus cluster start` on SASL_SSL with an authorizer and a super user made by
    --add-scram, in a process of its own: (process, bootstrap port, stdout up to the prompt)."""
    port = free_port_block(2)  # the bootstrap's, and broker 0's next to it
    process = subprocess.Popen(
        [sys.executable, "-m", "deltabus.cli.main", "cluster", "start", "--brokers", "1",
         "--master", "local[3]", "--root", str(tmp_path / "data"), "--port", str(port),
         "--kafka-port", "0", "--security-protocol", "SASL_SSL", *tls_flags(tls),
         "--authorizer", "--super-users", "User:admin",
         "--add-scram", f"SCRAM-SHA-256=[name=admin,password={SECRET}]"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not lines or lines[-1] != "Press Ctrl-C to stop.":
            line = process.stdout.readline()
            assert line, f"cluster start ended early: {process.communicate(timeout=60)}"
            lines.append(line.rstrip("\n"))
        yield process, port, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


@pytest.mark.spark  # `cluster start` runs Spark in the process it starts
def test_cluster_start_serves_sasl_ssl_to_the_user_it_made(
        secured_start, tls: dict[str, str]) -> None:
    process, port, lines = secured_start
    assert lines[0] == "Added SCRAM-SHA-256 credential for user admin"
    assert ("Security: security.protocol=SASL_SSL, sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,"
            "SCRAM-SHA-512, ssl.client.auth=none, authorizer on, super.users=User:admin") in lines
    bootstrap = f"127.0.0.1:{port}"
    admin = dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                 sasl_username="admin", sasl_password=SECRET, ssl_ca_location=tls["ca"])
    with AdminClient(bootstrap, **admin) as client:
        client.create_topics([NewTopic("secured", 1, 1)])
    with Producer(bootstrap, **admin) as producer:
        assert producer.send("secured", b"in").get(60).offset == 0
    with pytest.raises(errors.SaslAuthenticationFailedError):
        with AdminClient(bootstrap, **{**admin, "sasl_password": "guess"}) as client:
            client.list_topics()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert out.splitlines()[-1] == "deltabus cluster stopped"
    assert SECRET not in "\n".join(lines) + out + err
