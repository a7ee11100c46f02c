"""Kafka's named listeners as deltabus reads them: the syntax and checks of server.properties,
which listener serves what, and the addresses clients are told (no Spark, no sockets)."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.cluster.cluster import open_listener_warning
from deltabus.config import ClusterConfig, ListenerSecurity
from deltabus.listeners import GRPC, KAFKA, Listener, ListenerConfig
from deltabus.metadata import BrokerEndpoint, ListenerEndpoint, MetadataImage

SPLIT = dict(
    listeners="CLIENT://127.0.0.1:9092",
    grpc_listeners="CLIENT://127.0.0.1:9192,REPLICATION://127.0.0.2:0,CONTROLLER://127.0.0.3:0",
    advertised_listeners="CLIENT://kafka.example.com:19092",
    listener_security_protocol_map="CLIENT:SASL_SSL,REPLICATION:SSL,CONTROLLER:SSL",
    inter_broker_listener_name="REPLICATION", controller_listener_names="CONTROLLER")


def test_kafkas_syntax_gives_each_listener_its_address_and_protocol() -> None:
    config = ListenerConfig.parse(**SPLIT)
    assert [(x.name, x.host, x.port, x.security_protocol) for x in config.grpc] == [
        ("CLIENT", "127.0.0.1", 9192, "SASL_SSL"), ("REPLICATION", "127.0.0.2", 0, "SSL"),
        ("CONTROLLER", "127.0.0.3", 0, "SSL")]
    (client,) = config.kafka
    assert (client.door, client.advertised_host, client.advertised_port) == (
        KAFKA, "kafka.example.com", 19092)
    assert config.inter_broker.name == "REPLICATION" and config.controller.name == "CONTROLLER"
    assert [x.name for x in config.client_grpc()] == ["CLIENT", "REPLICATION"]
    assert config.controller_only(config.controller)
    assert not config.controller_only(config.inter_broker)


def test_a_protocol_name_maps_to_itself_and_the_defaults_follow_kafka() -> None:
    config = ListenerConfig.parse(grpc_listeners="SASL_SSL://:9192,PLAINTEXT://127.0.0.1:0",
                                  listeners="SSL://[::1]:9092")
    assert [x.security_protocol for x in config.grpc[:2]] == ["SASL_SSL", "PLAINTEXT"]
    assert config.kafka[0].bind_host == "::1"
    assert config.grpc[0].bind_host == "0.0.0.0"  # no host: every interface
    # inter.broker.listener.name defaults to the first gRPC listener. The controller gets a
    # listener of its own on the inter-broker listener's host and protocol, any free port:
    # no client traffic shares its threads.
    assert config.inter_broker_listener_name == "SASL_SSL"
    assert config.controller_listener_names == ("CONTROLLER",)
    own = config.controller
    assert (own.host, own.port, own.security_protocol) == ("", 0, "SASL_SSL")
    assert config.controller_only(own)
    assert config.client_grpc() == config.grpc[:2]


def test_the_controller_never_shares_the_inter_broker_listener() -> None:
    """Named as a controller listener, the inter-broker listener (which serves clients and
    followers) is replaced by a controller listener of its own, named apart from the rest."""
    config = ListenerConfig.parse(
        grpc_listeners="CONTROLLER://127.0.0.3:0,B://127.0.0.4:0",
        listener_security_protocol_map="CONTROLLER:SSL,B:PLAINTEXT",
        inter_broker_listener_name="CONTROLLER", controller_listener_names="CONTROLLER")
    assert config.controller_listener_names == ("CONTROLLER_2",)
    assert (config.controller.host, config.controller.security_protocol) == (
        "127.0.0.3", "SSL")
    assert [x.name for x in config.client_grpc()] == ["CONTROLLER", "B"]
    # A controller listener named apart from the inter-broker one is kept as it is.
    assert ListenerConfig.parse(**SPLIT).controller_listener_names == ("CONTROLLER",)


@pytest.mark.parametrize("changes, message", [
    (dict(listeners="CLIENT://127.0.0.1"), "not a listener: use NAME://host:port"),
    (dict(listeners="CLIENT://127.0.0.1:99999"), "above 65535"),
    (dict(listeners="CLIENT://127.0.0.1:9092,CLIENT://127.0.0.1:9093"),
     "CLIENT is used twice"),
    (dict(listeners="EXTERNAL://127.0.0.1:9092"),
     "no security protocol defined for listener EXTERNAL"),
    (dict(listener_security_protocol_map="CLIENT:SASL_SSL,REPLICATION:TLS,CONTROLLER:SSL"),
     "REPLICATION maps to TLS, which is not one of"),
    (dict(listener_security_protocol_map="CLIENT"), "takes NAME:PROTOCOL pairs"),
    (dict(inter_broker_listener_name="INTERNAL"),
     "inter.broker.listener.name must be a listener name defined in grpc.listeners"),
    (dict(controller_listener_names="CONTROLLER,BROKERS"),
     "controller.listener.names must name listeners of grpc.listeners, not BROKERS"),
    (dict(advertised_listeners="EXTERNAL://example.com:9092"),
     "EXTERNAL is not a listener name of listeners"),
    (dict(advertised_listeners="CLIENT://0.0.0.0:9092"), "nonroutable meta-address 0.0.0.0"),
    (dict(grpc_listeners="CONTROLLER://127.0.0.3:0", inter_broker_listener_name="CONTROLLER"),
     None),
])
def test_bad_listener_settings_name_the_setting(changes: dict, message: str | None) -> None:
    settings = {**SPLIT, **changes}
    if message is None:  # one gRPC listener for everything is a valid (simple) cluster
        assert ListenerConfig.parse(**settings).client_grpc()
        return
    with pytest.raises(errors.InvalidConfigError, match=message):
        ListenerConfig.parse(**settings)


def test_ports_and_advertised_addresses_per_node() -> None:
    fixed = Listener("CLIENT", KAFKA, "0.0.0.0", 9092, "PLAINTEXT")
    assert [fixed.bind_port(n) for n in (-1, 0, 2)] == [9092, 9093, 9095]
    assert Listener("X", GRPC, "127.0.0.1", 0, "PLAINTEXT").bind_port(4) == 0  # any free port
    # A wildcard bind is told as the machine's address; an advertised host as given, with the
    # broker's offset on an advertised port.
    assert fixed.advertised(9095, 2, "10.0.0.7") == ("10.0.0.7", 9095)
    told = Listener("CLIENT", KAFKA, "0.0.0.0", 9092, "PLAINTEXT", "kafka.example.com", 19092)
    assert told.advertised(9093, 0, "10.0.0.7") == ("kafka.example.com", 19093)
    assert told.advertised(9092, -1, "10.0.0.7") == ("kafka.example.com", 19092)
    assert Listener("B", GRPC, "127.0.0.2", 0, "SSL").advertised(40001, 1, "x") == (
        "127.0.0.2", 40001)


def test_a_simple_cluster_has_two_listeners_for_clients_and_two_of_its_own() -> None:
    """Followers fetch, and brokers heartbeat, on servers (thread pools) of their own, on any
    free port: client calls cannot take their threads."""
    config = ClusterConfig(root="/tmp/x", host="127.0.0.1", port=9192, kafka_port=9092)
    listeners = config.listener_config()
    assert [(x.name, x.door, x.port) for x in listeners.grpc + listeners.kafka] == [
        ("PLAINTEXT", GRPC, 9192), ("REPLICATION", GRPC, 0), ("CONTROLLER", GRPC, 0),
        ("PLAINTEXT", KAFKA, 9092)]
    assert listeners.inter_broker_listener_name == "REPLICATION"
    assert listeners.controller_listener_names == ("CONTROLLER",)
    assert listeners.client_grpc()[0].name == "PLAINTEXT"  # the bootstrap
    assert ClusterConfig(root="/tmp/x", kafka_port=-1).listener_config().kafka == ()


def test_each_listener_is_secured_with_its_own_protocol() -> None:
    security = ListenerSecurity(ssl_certificate=b"cert", ssl_key=b"key", ssl_ca=b"ca",
                                ssl_client_auth="required")
    config = ClusterConfig(root="/tmp/x", security=security,
                           listeners=ListenerConfig.parse(**SPLIT))
    client = config.listener_security("SASL_SSL")
    assert client.uses_tls and client.uses_sasl and client.ssl_client_auth == "required"
    plain = config.listener_security("PLAINTEXT")
    assert not plain.uses_tls and plain.ssl_client_auth == "none"
    # A TLS listener without the certificate and key is refused when the cluster is made.
    with pytest.raises(errors.InvalidConfigError, match="needs the listeners' certificate"):
        ClusterConfig(root="/tmp/x", listeners=ListenerConfig.parse(**SPLIT))
    # Without names, client certificates still need a TLS protocol.
    with pytest.raises(errors.InvalidConfigError, match="ssl.client.auth=required needs TLS"):
        ClusterConfig(root="/tmp/x", security=security)


def test_clients_are_told_the_endpoints_of_the_listener_they_came_in_on() -> None:
    broker = BrokerEndpoint(0, "127.0.0.2", 41000, "rack-a", 9093, (
        ListenerEndpoint("CLIENT", GRPC, "bus.example.com", 9193),
        ListenerEndpoint("REPLICATION", GRPC, "127.0.0.2", 41000),
        ListenerEndpoint("CLIENT", KAFKA, "kafka.example.com", 19093)))
    seen = broker.on_listener("CLIENT")
    assert seen == BrokerEndpoint(0, "bus.example.com", 9193, "rack-a", 19093)
    assert seen.listeners == ()  # no other listener's address reaches a client
    assert broker.on_listener("REPLICATION") == BrokerEndpoint(0, "127.0.0.2", 41000, "rack-a")
    assert broker.on_listener("EXTERNAL") is None
    assert broker.kafka_address("CLIENT") == ("kafka.example.com", 19093)
    assert broker.kafka_address("REPLICATION") is None
    image = MetadataImage(3, "c", 0, (broker, BrokerEndpoint(1, "h", 1)), {})
    assert [b.host for b in image.on_listener("CLIENT").brokers] == ["bus.example.com", "h"]
    assert image.on_listener("") is image


def test_open_listeners_beyond_loopback_are_named_in_the_warning() -> None:
    security = ListenerSecurity(ssl_certificate=b"cert", ssl_key=b"key")
    inside = ClusterConfig(root="/tmp/x", security=security,
                           listeners=ListenerConfig.parse(**SPLIT))
    assert open_listener_warning(inside) is None  # all on loopback
    outside = ClusterConfig(root="/tmp/x", security=security, listeners=ListenerConfig.parse(
        **{**SPLIT, "grpc_listeners": "CLIENT://127.0.0.1:9192,REPLICATION://10.0.0.5:0,"
                                      "CONTROLLER://127.0.0.3:0"}))
    warning = open_listener_warning(outside)
    assert warning is not None and "REPLICATION://10.0.0.5:0" in warning
    assert "CLIENT" not in warning  # SASL_SSL on loopback
    assert open_listener_warning(outside.with_(authorizer=True)) is None
