"""Kafka's named listeners: where each door binds, what clients are told, how each is secured.

A listener is `NAME://host:port`, as in Kafka's server.properties. deltabus has two doors, so it
keeps two lists with Kafka's syntax: `listeners` for the Kafka door (Kafka's own key) and
`grpc.listeners` for the gRPC door. `listener.security.protocol.map` gives every name its
security protocol (a name that is itself a protocol maps to itself, as in Kafka); a name on both
lists is one network with one protocol, e.g. `CLIENT` on both doors.

What must stay true:
- Ports: the driver (the cluster's bootstrap, controller and group coordinator) binds a
  listener's `port`; broker b binds `port + 1 + b`, so brokers can share a machine; port 0 binds
  any free port. An advertised port follows the same rule; without one the bound port is told.
- Hosts: an empty host, `0.0.0.0` or `::` binds every interface and is advertised as the
  address of the machine the server runs on (the caller supplies it); `advertised.listeners`
  tells clients another address than the one bound (NAT, a load balancer, a DNS name). Kafka's
  clients reach brokers through the listener they bootstrapped on: Metadata answers with the
  brokers' endpoints of that listener only, so an internal listener's address is never shown to
  clients of another.
- `inter.broker.listener.name` names the gRPC listener brokers replicate over: follower fetches
  are served there and nowhere else. `controller.listener.names` names the gRPC listeners the
  controller takes RegisterBroker, BrokerHeartbeat and AlterPartition on. A controller listener
  is never one that serves anything else: it is bound by the driver only, on a gRPC server (a
  thread pool) of its own, and answers only the cluster's brokers, as KRaft's controller
  listeners (and Kafka's control plane listener, KIP-291) do. So no client traffic (group
  long-polls, a flood of calls) can take the threads broker heartbeats need, and starve them
  until the brokers are fenced. Where controller.listener.names is not given, or names only the
  inter-broker listener (which serves clients too), the controller gets such a listener anyway:
  `CONTROLLER` (`CONTROLLER_2`, ... if taken), on the inter-broker listener's host, advertised
  host and protocol, on any free port (brokers learn it from the driver, clients never use it).
- Without named listeners a cluster has two for clients: `grpc.listeners=P://host:port` and
  `listeners=P://host:kafka_port`, both named after their protocol P (`ListenerConfig.simple`),
  and two for its own traffic: `REPLICATION://host:0`, the inter-broker listener, on a server
  of its own so clients' long polls cannot starve follower fetches, and the controller's own
  `CONTROLLER://host:0`. Clients are never told either address.

Pure: no I/O. `ListenerConfig` is frozen and travels to the broker tasks inside ClusterConfig.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from deltabus import errors

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA, GRPC = "kafka", "grpc"  # the two doors
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
CONTROLLER_LISTENER_NAME = "CONTROLLER"  # the controller's own listener, where none is named
REPLICATION_LISTENER_NAME = "REPLICATION"  # a simple cluster's inter-broker listener
PORT_MAX = 65_535
# NAME://host:port, with an IPv6 host in brackets; the host may be empty (every interface).
_LISTENER = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)://(?P<host>\[[^\]]*\]|[^:/\s]*):(?P<port>\d+)")


class ListenerBindError(OSError):
    """A listener's address is taken (or not this machine's): the server cannot start, as
    Kafka's "Socket server failed to bind". Not a Kafka error code: nothing answers a client
    yet. A broker reports it to its supervisor, which fails the cluster's start with it rather
    than relaunching the broker into the same taken port until the start-up times out."""


def _invalid(message: str) -> errors.DeltaBusError:
    return errors.InvalidConfigError(message)


@dataclass(frozen=True)
class Listener:
    """One named listener of one door."""

    name: str
    door: str  # KAFKA or GRPC
    host: str  # where it binds ("" or a wildcard: every interface)
    port: int  # the driver's port; broker b's is port + 1 + b (0: any free port)
    security_protocol: str
    advertised_host: str = ""  # what clients are told ("": the bind host, or the machine's)
    advertised_port: int = 0  # likewise with the broker offset (0: the bound port)

    def bind_port(self, node: int) -> int:
        """The port node `node` binds: the driver's (node -1) is `port`, broker b's
        `port + 1 + b`, any free one for port 0."""
        return _node_port(self.port, node)

    def advertised(self, bound_port: int, node: int, local_host: str) -> tuple[str, int]:
        """The (host, port) clients are told for this listener of node `node` that bound
        `bound_port` on a machine whose address is `local_host`."""
        host = self.advertised_host or (local_host if self.host in WILDCARD_HOSTS else self.host)
        port = _node_port(self.advertised_port, node) if self.advertised_port else bound_port
        return host.strip("[]"), port

    @property
    def bind_host(self) -> str:
        """The host as a socket binds it: every interface for an empty host."""
        return self.host.strip("[]") or "0.0.0.0"


def _node_port(port: int, node: int) -> int:
    return port + 1 + node if port and node >= 0 else port


@dataclass(frozen=True)
class ListenerConfig:
    """Every named listener of a cluster, with the names that pick the internal ones."""

    kafka: tuple[Listener, ...]
    grpc: tuple[Listener, ...]
    inter_broker_listener_name: str
    controller_listener_names: tuple[str, ...]

    @classmethod
    def parse(cls, *, grpc_listeners: str, listeners: str = "",
              advertised_listeners: str = "", grpc_advertised_listeners: str = "",
              listener_security_protocol_map: str = "", inter_broker_listener_name: str = "",
              controller_listener_names: str = "") -> ListenerConfig:
        """Kafka's settings as server.properties writes them (comma-separated lists). Raises
        InvalidConfigError naming the setting and what is wrong with it."""
        protocols = _protocol_map(listener_security_protocol_map)
        kafka = _listeners("listeners", listeners, KAFKA, protocols)
        grpc = _listeners("grpc.listeners", grpc_listeners, GRPC, protocols)
        kafka = _advertise("advertised.listeners", advertised_listeners, kafka)
        grpc = _advertise("grpc.advertised.listeners", grpc_advertised_listeners, grpc)
        inter = inter_broker_listener_name.strip() or (grpc[0].name if grpc else "")
        controllers = tuple(n.strip() for n in controller_listener_names.split(",")
                            if n.strip())
        for name in controllers:  # checked here: the inter-broker one is dropped below
            if name not in {item.name for item in grpc}:
                raise _invalid(f"controller.listener.names must name listeners of "
                               f"grpc.listeners, not {name}")
        return cls(kafka, *_own_controller(grpc, inter, controllers))

    @classmethod
    def simple(cls, *, host: str, port: int, kafka_port: int,
               security_protocol: str) -> ListenerConfig:
        """The two listeners of a cluster configured without names, one per door, with one
        protocol (`kafka_port` -1: no Kafka door), and two for the cluster's own traffic on
        servers (thread pools) of their own, any free port, never told to clients:
        `REPLICATION`, the inter-broker listener (follower fetches, so clients' long polls
        cannot starve them), and the controller's `CONTROLLER` (broker heartbeats)."""
        name = security_protocol
        grpc = (Listener(name, GRPC, host, port, security_protocol),
                Listener(REPLICATION_LISTENER_NAME, GRPC, host, 0, security_protocol))
        kafka = (() if kafka_port < 0
                 else (Listener(name, KAFKA, host, kafka_port, security_protocol),))
        return cls(kafka, *_own_controller(grpc, REPLICATION_LISTENER_NAME, ()))

    def __post_init__(self) -> None:
        for door, items, key in ((KAFKA, self.kafka, "listeners"),
                                 (GRPC, self.grpc, "grpc.listeners")):
            names = [item.name for item in items]
            duplicate = next((n for n in names if names.count(n) > 1), None)
            if duplicate:
                raise _invalid(f"{key}: each listener must have a different name, "
                               f"{duplicate} is used twice")
            if any(item.door != door for item in items):
                raise _invalid(f"{key} holds a listener of the other door")
        grpc_names = {item.name for item in self.grpc}
        if self.inter_broker_listener_name not in grpc_names:
            raise _invalid(f"inter.broker.listener.name must be a listener name defined in "
                           f"grpc.listeners (brokers replicate over gRPC), not "
                           f"{self.inter_broker_listener_name or '(none)'}")
        for name in self.controller_listener_names:
            if name not in grpc_names:
                raise _invalid(f"controller.listener.names must name listeners of "
                               f"grpc.listeners, not {name}")

    # ---- which listener serves what ------------------------------------------------------------

    def grpc_listener(self, name: str) -> Listener:
        return next(item for item in self.grpc if item.name == name)

    @property
    def inter_broker(self) -> Listener:
        """The gRPC listener followers fetch from their leaders on."""
        return self.grpc_listener(self.inter_broker_listener_name)

    @property
    def controller(self) -> Listener:
        """The gRPC listener brokers reach the controller on (the first controller listener)."""
        return self.grpc_listener(self.controller_listener_names[0])

    def controller_only(self, listener: Listener) -> bool:
        """A controller listener that is not the inter-broker listener: the driver's alone, for
        the cluster's brokers only."""
        return (listener.name in self.controller_listener_names
                and listener.name != self.inter_broker_listener_name)

    def client_grpc(self) -> tuple[Listener, ...]:
        """The gRPC listeners clients may use: every one but the controller-only ones (never
        empty: the inter-broker listener is one). The first is the cluster's bootstrap
        (`Cluster.bootstrap_servers`)."""
        return tuple(item for item in self.grpc if not self.controller_only(item))

    def with_protocol(self, security_protocol: str) -> ListenerConfig:
        """The same listeners, all with `security_protocol` (a simple cluster's change)."""
        def change(items: tuple[Listener, ...]) -> tuple[Listener, ...]:
            return tuple(replace(item, security_protocol=security_protocol) for item in items)
        return replace(self, kafka=change(self.kafka), grpc=change(self.grpc))


def _own_controller(grpc: tuple[Listener, ...], inter: str, controllers: tuple[str, ...]
                    ) -> tuple[tuple[Listener, ...], str, tuple[str, ...]]:
    """(gRPC listeners, inter-broker listener name, controller listener names) with the
    controller's listeners apart from every other: the inter-broker listener (which serves
    clients and followers) is never one; if none is left, a controller-only listener is added
    on the inter-broker listener's host, advertised host and protocol, on any free port."""
    controllers = tuple(name for name in controllers if name != inter)
    taken = {item.name for item in grpc}
    if controllers or inter not in taken:  # (an unknown inter-broker name fails the checks)
        return grpc, inter, controllers or (inter,)
    name = next(n for n in (CONTROLLER_LISTENER_NAME if i == 1
                            else f"{CONTROLLER_LISTENER_NAME}_{i}"
                            for i in range(1, len(taken) + 2)) if n not in taken)
    base = next(item for item in grpc if item.name == inter)
    own = Listener(name, GRPC, base.host, 0, base.security_protocol, base.advertised_host)
    return grpc + (own,), inter, (name,)


def _protocol_map(text: str) -> dict[str, str]:
    """listener.security.protocol.map: `NAME:PROTOCOL,...`."""
    protocols: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        name, sep, protocol = entry.partition(":")
        protocol = protocol.strip().upper()
        if not (sep and name.strip()):
            raise _invalid(f"listener.security.protocol.map takes NAME:PROTOCOL pairs, not "
                           f"{entry!r}")
        if protocol not in SECURITY_PROTOCOLS:
            raise _invalid(f"listener.security.protocol.map: {name.strip()} maps to "
                           f"{protocol or '(nothing)'}, which is not one of "
                           f"{', '.join(SECURITY_PROTOCOLS)}")
        protocols[name.strip()] = protocol
    return protocols


def _entries(key: str, text: str) -> list[tuple[str, str, int]]:
    """(name, host, port) of each `NAME://host:port` of a comma-separated list."""
    out = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        match = _LISTENER.fullmatch(entry)
        if match is None:
            raise _invalid(f"{key}: {entry!r} is not a listener: use NAME://host:port, e.g. "
                           "CLIENT://0.0.0.0:9092")
        port = int(match.group("port"))
        if port > PORT_MAX:
            raise _invalid(f"{key}: {entry} has port {port}, above {PORT_MAX}")
        out.append((match.group("name"), match.group("host"), port))
    return out


def _listeners(key: str, text: str, door: str, protocols: dict[str, str]) -> tuple[Listener, ...]:
    out = []
    for name, host, port in _entries(key, text):
        protocol = protocols.get(name) or (name.upper() if name.upper() in SECURITY_PROTOCOLS
                                           else "")
        if not protocol:
            raise _invalid(f"{key}: no security protocol defined for listener {name}: add "
                           f"{name}:PROTOCOL to listener.security.protocol.map")
        out.append(Listener(name, door, host, port, protocol))
    return tuple(out)


def _advertise(key: str, text: str, items: tuple[Listener, ...]) -> tuple[Listener, ...]:
    """Kafka's advertised.listeners: what clients are told for a listener of the same name."""
    by_name = {item.name: item for item in items}
    for name, host, port in _entries(key, text):
        if name not in by_name:
            raise _invalid(f"{key}: {name} is not a listener name of "
                           f"{key.replace('advertised.', '')}")
        if host in ("0.0.0.0", "[::]"):
            raise _invalid(f"{key} cannot use the nonroutable meta-address {host}: use a "
                           "routable IP address or a host name")
        by_name[name] = replace(by_name[name], advertised_host=host, advertised_port=port)
    return tuple(by_name[item.name] for item in items)
