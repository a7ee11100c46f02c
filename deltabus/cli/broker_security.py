"""The broker side of security for `deltabus cluster start`: how the listeners are secured, who
may do what, and the first users, with the names Kafka gives them.

    --security-protocol SASL_SSL        both unnamed listeners' protocol (PLAINTEXT by default)
    --ssl-certificate-location FILE     PEM: the listeners' certificate chain
    --ssl-key-location FILE             PEM: its private key
    --ssl-ca-location FILE              PEM: the CA of client certificates (and of the listeners')
    --ssl-client-auth none|required     Kafka's ssl.client.auth
    --sasl-enabled-mechanisms LIST      Kafka's sasl.enabled.mechanisms, comma-separated
    --authorizer                        Kafka's authorizer.class.name: check every request's ACLs
    --super-users 'User:a;User:b'       Kafka's super.users
    --allow-everyone-if-no-acl-found    Kafka's allow.everyone.if.no.acl.found
    --add-scram 'SCRAM-SHA-256=[name=admin,password=admin-secret]'
                                        kafka-storage format's flag: a user made at start
    --override key=value                kafka-server-start.sh's: the same settings by their
                                        server.properties names (a flag wins over it), and
                                        every other broker config deltabus implements
                                        (num.partitions=3, default.replication.factor=2,
                                        auto.create.topics.enable=false, log.retention.hours,
                                        max.connections.per.ip, ...: cfg.BROKER_CONFIGS),
                                        which have no flags

Named listeners (deltabus.listeners), instead of one protocol for the two doors:

    --listeners 'CLIENT://0.0.0.0:9092'             the Kafka door's listeners
    --advertised-listeners 'CLIENT://bus.example.com:9092'
    --grpc-listeners 'CLIENT://0.0.0.0:9192,REPLICATION://10.0.0.5:0'
    --grpc-advertised-listeners ...                 the gRPC door's, the same way
    --listener-security-protocol-map 'CLIENT:SASL_SSL,REPLICATION:SSL'
    --inter-broker-listener-name REPLICATION        a gRPC listener: brokers replicate over it
    --controller-listener-names CONTROLLER          gRPC listeners brokers register on (default:
                                                    CONTROLLER on the inter-broker listener's
                                                    host and protocol, any free port)

Without --grpc-listeners, the gRPC door is one listener named as the first Kafka listener, on its
host and the bootstrap port.

Everything is read and checked before Spark starts, so a typo costs a second, not a cluster
start. A password is never printed: errors about --add-scram name the mechanism and user only.
PEM files are read here, on the driver (ListenerSecurity.load); broker tasks get the bytes.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

from deltabus import config as cfg
from deltabus import errors
from deltabus.cli.options import CliError, parse_bool, parse_properties
from deltabus.listeners import ListenerConfig
from deltabus.security import scram

ADD_SCRAM_KEYS = ("name", "password", "iterations")

# server.properties name -> the flag's argparse dest; values are parsed as the flag's are.
OVERRIDES = {
    "security.protocol": "security_protocol",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.client.auth": "ssl_client_auth",
    "sasl.enabled.mechanisms": "sasl_enabled_mechanisms",
    "authorizer.class.name": "authorizer",
    "super.users": "super_users",
    "allow.everyone.if.no.acl.found": "allow_everyone_if_no_acl_found",
    "listeners": "listeners",
    "advertised.listeners": "advertised_listeners",
    "grpc.listeners": "grpc_listeners",
    "grpc.advertised.listeners": "grpc_advertised_listeners",
    "listener.security.protocol.map": "listener_security_protocol_map",
    "inter.broker.listener.name": "inter_broker_listener_name",
    "controller.listener.names": "controller_listener_names",
}
# Every other broker config deltabus takes (num.partitions, auto.create.topics.enable, the
# Kafka listeners' limits, ...) has no flag: --override only, read by cfg.broker_settings.
BROKER_OVERRIDES = (*cfg.BROKER_CONFIGS, *cfg.COARSE_BROKER_CONFIGS)
# The settings of named listeners: ListenerConfig.parse's keywords.
LISTENER_SETTINGS = ("listeners", "advertised_listeners", "grpc_listeners",
                     "grpc_advertised_listeners", "listener_security_protocol_map",
                     "inter_broker_listener_name", "controller_listener_names")
# Java's key and trust stores: deltabus takes PEM files (the client side refuses them too).
JAVA_STORES = ("ssl.keystore.location", "ssl.truststore.location", "ssl.keystore.password",
               "ssl.truststore.password", "ssl.key.password")


@dataclass(frozen=True)
class ScramUser:
    """One `--add-scram`: a user's credential for one mechanism, made once the cluster runs."""

    mechanism: str
    name: str
    password: str = field(repr=False)
    iterations: int = scram.DEFAULT_ITERATIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags above, in a group of their own in `cluster start --help`."""
    g = parser.add_argument_group("security (the broker side, as Kafka names it)")
    g.add_argument("--security-protocol", metavar="PROTOCOL",
                   help="PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL, for both "
                        "unnamed listeners")
    g.add_argument("--ssl-certificate-location", metavar="FILE",
                   help="PEM file of the listeners' certificate chain (SSL, SASL_SSL)")
    g.add_argument("--ssl-key-location", metavar="FILE", help="PEM file of its private key")
    g.add_argument("--ssl-ca-location", metavar="FILE",
                   help="PEM file of the CA that signs client certificates and the listeners'")
    g.add_argument("--ssl-client-auth", metavar="none|required",
                   help="require TLS client certificates (Kafka's ssl.client.auth)")
    g.add_argument("--sasl-enabled-mechanisms", metavar="LIST",
                   help="comma-separated, of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (default all)")
    g.add_argument("--authorizer", action="store_const", const="true", default=None,
                   help="check every request against the ACLs (Kafka's StandardAuthorizer)")
    g.add_argument("--super-users", metavar="'User:a;User:b'",
                   help="principals allowed everything (Kafka's super.users)")
    g.add_argument("--allow-everyone-if-no-acl-found", action="store_const", const="true",
                   default=None, help="let requests on resources no ACL names through")
    g.add_argument("--add-scram", action="append", metavar="'MECHANISM=[name=N,password=P]'",
                   help="make a user at start, as kafka-storage format does (repeatable; "
                        "also iterations=N)")
    n = parser.add_argument_group("named listeners (Kafka's listeners, one protocol each)")
    n.add_argument("--listeners", metavar="NAME://HOST:PORT,...",
                   help="the Kafka door's listeners; broker b binds port + 1 + b (0: any)")
    n.add_argument("--advertised-listeners", metavar="NAME://HOST:PORT,...",
                   help="what Kafka clients are told, where not the bound address")
    n.add_argument("--grpc-listeners", metavar="NAME://HOST:PORT,...",
                   help="the gRPC door's listeners (default: one named as the first Kafka "
                        "listener, on the bootstrap port)")
    n.add_argument("--grpc-advertised-listeners", metavar="NAME://HOST:PORT,...",
                   help="what gRPC clients are told, where not the bound address")
    n.add_argument("--listener-security-protocol-map", metavar="NAME:PROTOCOL,...",
                   help="each listener name's protocol (a protocol's own name maps to itself)")
    n.add_argument("--inter-broker-listener-name", metavar="NAME",
                   help="the gRPC listener brokers replicate over (default: the first)")
    n.add_argument("--controller-listener-names", metavar="NAME,...",
                   help="gRPC listeners brokers register on (default: the inter-broker one)")
    g.add_argument("--override", action="append", metavar="KEY=VALUE",
                   help="a setting by its server.properties name, e.g. super.users=User:admin "
                        "(kafka-server-start.sh's; a flag of the same setting wins)")


def cluster_settings(args: argparse.Namespace, bootstrap: tuple[str, int] = (
        cfg.DEFAULT_HOST, cfg.DEFAULT_BOOTSTRAP_PORT)) -> dict[str, Any]:
    """Cluster(...) keyword arguments of the security and listener flags and the other
    broker configs' --overrides: {} when none was given, so a plain start is exactly what it
    was. `bootstrap`: the gRPC door's address when only Kafka listeners are named. Raises
    CliError or InvalidConfigError (one line)."""
    given = _given(args)
    settings = broker_settings({key: given.pop(key) for key in list(given)
                                if key in BROKER_OVERRIDES})
    if not given:
        return settings
    named = listener_config(given, args, bootstrap)
    protocol = given.get("security_protocol", "PLAINTEXT").strip().upper()
    tls_files = [flag for flag in ("ssl_certificate_location", "ssl_key_location")
                 if given.get(flag)]
    if tls_files and protocol not in ("SSL", "SASL_SSL") and named is None:
        raise CliError(f"--{tls_files[0].replace('_', '-')} needs --security-protocol SSL or "
                       f"SASL_SSL, not {protocol}")
    listener: dict[str, Any] = {"security_protocol": protocol}
    if "ssl_client_auth" in given:
        listener["ssl_client_auth"] = given["ssl_client_auth"].strip().lower()
    if "sasl_enabled_mechanisms" in given:
        listener["sasl_enabled_mechanisms"] = tuple(
            m.strip().upper() for m in given["sasl_enabled_mechanisms"].split(",") if m.strip())
    security = cfg.ListenerSecurity.load(
        ssl_certificate_location=given.get("ssl_certificate_location", ""),
        ssl_key_location=given.get("ssl_key_location", ""),
        ssl_ca_location=given.get("ssl_ca_location", ""), **listener)
    settings["security"] = security
    if named is not None:
        for item in named.grpc + named.kafka:  # a TLS listener needs the certificate
            security.for_protocol(item.security_protocol)
        settings["listeners"] = named
    if "authorizer" in given:
        settings["authorizer"] = bool(given["authorizer"].strip())
    if "super_users" in given:
        settings["super_users"] = super_users(given["super_users"])
    if "allow_everyone_if_no_acl_found" in given:
        settings["allow_everyone_if_no_acl_found"] = parse_bool(
            given, "allow_everyone_if_no_acl_found")
    return settings


def listener_config(given: dict[str, str], args: argparse.Namespace,
                    bootstrap: tuple[str, int]) -> ListenerConfig | None:
    """The named listeners of the flags (None: none named, the simple form). They replace
    --security-protocol and --kafka-port, which set the unnamed two."""
    values = {key: given[key].strip() for key in LISTENER_SETTINGS if key in given}
    if not values:
        return None
    for flag, dest in (("--security-protocol", "security_protocol"),
                       ("--kafka-port", "kafka_port")):
        if given.get(dest) is not None or getattr(args, dest, None) is not None:
            raise CliError(f"{flag} sets the unnamed listeners: with named listeners give each "
                           "its address in --listeners/--grpc-listeners and its protocol in "
                           "--listener-security-protocol-map")
    if not values.get("grpc_listeners"):
        first = next((e.strip() for e in values.get("listeners", "").split(",") if e.strip()),
                     "")
        if not first:
            raise CliError("--grpc-listeners or --listeners must name at least one listener")
        name, _, address = first.partition("://")
        host = address.rpartition(":")[0] if ":" in address else bootstrap[0]
        values["grpc_listeners"] = f"{name}://{host}:{bootstrap[1]}"
    return ListenerConfig.parse(**values)


def _given(args: argparse.Namespace) -> dict[str, str]:
    """The settings given, by dest: flags over their --override (Kafka's names)."""
    overrides = parse_properties(getattr(args, "override", None), "--override")
    for key in overrides:
        if key in JAVA_STORES:
            raise CliError(f"{key} is Java's key or trust store setting: deltabus takes PEM "
                           "files, give --ssl-certificate-location, --ssl-key-location and "
                           "--ssl-ca-location")
        if key not in OVERRIDES and key not in BROKER_OVERRIDES:
            raise CliError(f"--override {key} is not a setting deltabus takes: use one of "
                           f"{', '.join([*OVERRIDES, *sorted(BROKER_OVERRIDES)])}")
    given = {OVERRIDES.get(key, key): value for key, value in overrides.items()}
    for dest in OVERRIDES.values():
        value = getattr(args, dest, None)
        if value is not None:
            given[dest] = value
    if "authorizer" in given and given["authorizer"].strip().lower() in ("false", "none"):
        given["authorizer"] = ""  # authorizer.class.name= (empty) is Kafka's "no authorizer"
    return given


def broker_settings(overrides: dict[str, str]) -> dict[str, Any]:
    """Cluster(...) keyword arguments of the broker configs among the `--override`s
    (cfg.broker_settings); a bad value is one CliError line."""
    try:
        return cfg.broker_settings(overrides)
    except errors.InvalidConfigError as e:
        raise CliError(e.message) from None
    except ValueError as e:  # a group or listener limit out of its range
        raise CliError(str(e)) from None


def super_users(text: str) -> tuple[str, ...]:
    """Kafka's super.users (`User:a;User:b`) as principals; each must be `Type:name`."""
    principals = tuple(p.strip() for p in text.split(";") if p.strip())
    for principal in principals:
        kind, sep, name = principal.partition(":")
        if not (kind and sep and name):
            raise CliError(f"--super-users lists principals as User:name separated by ';', "
                           f"not {principal!r}")
    return principals


def scram_users(args: argparse.Namespace) -> list[ScramUser]:
    """The users of every `--add-scram`, checked (never echoing a password)."""
    return [parse_add_scram(text) for text in getattr(args, "add_scram", None) or ()]


_ADD_SCRAM = re.compile(r"\s*([A-Za-z0-9-]+)=\[(.*)\]\s*", re.DOTALL)


def parse_add_scram(text: str) -> ScramUser:
    """kafka-storage's `MECHANISM=[name=N,password=P,iterations=I]`: components split at
    commas, a value may be in double quotes. Errors say what is wrong, never the value."""
    match = _ADD_SCRAM.fullmatch(text)
    if match is None:
        raise CliError("--add-scram takes MECHANISM=[name=NAME,password=PASSWORD], e.g. "
                       "'SCRAM-SHA-256=[name=admin,password=...]'")
    mechanism, body = match.group(1).upper(), match.group(2)
    if mechanism not in scram.MECHANISMS:
        raise CliError(f"The add-scram mechanism {mechanism} is not supported: use one of "
                       f"{', '.join(scram.MECHANISMS)}")
    components: dict[str, str] = {}
    for component in body.split(","):
        key, sep, value = component.partition("=")
        key = key.strip()
        if not sep:
            raise CliError(f"--add-scram {mechanism}: each component is key=value")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        components[key] = value
    unknown = sorted(set(components) - set(ADD_SCRAM_KEYS))
    if unknown:
        raise CliError(f"--add-scram {mechanism}: unknown SCRAM configurations: "
                       f"{', '.join(unknown)} (deltabus takes {', '.join(ADD_SCRAM_KEYS)})")
    name, password = components.get("name", ""), components.get("password", "")
    if not name:
        raise CliError(f"--add-scram {mechanism}: you must supply 'name'")
    if not password:
        raise CliError(f"--add-scram {mechanism} for {name}: you must supply a non-empty "
                       "'password'")
    return ScramUser(mechanism, name, password, _iterations(mechanism, name, components))


def _iterations(mechanism: str, name: str, components: dict[str, str]) -> int:
    raw = components.get("iterations", "").strip()
    if not raw:
        return scram.DEFAULT_ITERATIONS
    if not raw.isdigit() or not (scram.MIN_ITERATIONS <= int(raw) <= scram.MAX_ITERATIONS):
        raise CliError(f"--add-scram {mechanism} for {name}: iterations must be a number from "
                       f"{scram.MIN_ITERATIONS} to {scram.MAX_ITERATIONS}")
    return int(raw)


def describe(settings: dict[str, Any]) -> str | None:
    """The line `cluster start` prints about security (None on a plain cluster)."""
    security: cfg.ListenerSecurity = settings.get("security", cfg.ListenerSecurity())
    named: ListenerConfig | None = settings.get("listeners")
    if named is not None:
        protocols = {x.security_protocol for x in named.grpc + named.kafka}
        parts = ["listener.security.protocol.map=" + ",".join(
            sorted({f"{x.name}:{x.security_protocol}" for x in named.grpc + named.kafka})),
            f"inter.broker.listener.name={named.inter_broker_listener_name}",
            f"controller.listener.names={','.join(named.controller_listener_names)}"]
        if protocols & {"SASL_PLAINTEXT", "SASL_SSL"}:
            parts.append(f"sasl.enabled.mechanisms={','.join(security.sasl_enabled_mechanisms)}")
        if protocols & {"SSL", "SASL_SSL"}:
            parts.append(f"ssl.client.auth={security.ssl_client_auth}")
        _authorizer(parts, settings)
        return "Security: " + ", ".join(parts)
    if security.security_protocol == "PLAINTEXT" and not settings.get("authorizer"):
        return None
    parts = [f"security.protocol={security.security_protocol}"]
    if security.uses_sasl:
        parts.append(f"sasl.enabled.mechanisms={','.join(security.sasl_enabled_mechanisms)}")
    if security.uses_tls:
        parts.append(f"ssl.client.auth={security.ssl_client_auth}")
    _authorizer(parts, settings)
    return "Security: " + ", ".join(parts)


def _authorizer(parts: list[str], settings: dict[str, Any]) -> None:
    if settings.get("authorizer"):
        parts.append("authorizer on, super.users="
                     + (";".join(settings.get("super_users", ())) or "(none)"))
