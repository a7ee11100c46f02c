"""The listeners one node opens: a gRPC server per named gRPC listener and a Kafka listener per
named Kafka listener (deltabus.listeners), each secured with its own protocol, and the endpoints
clients are told for them.

Who serves what, as KRaft splits it:
- the driver (node -1: controller, bootstrap, group coordinator) opens every listener; its
  controller listeners serve the broker lifecycle (RegisterBroker, BrokerHeartbeat,
  AlterPartition) and nothing else, on gRPC servers of their own: grpcio's server is one thread
  pool, so a pool no client call can reach is what keeps client long-polls (JoinGroup) and
  floods from starving heartbeats until brokers are fenced. They answer only the cluster's
  brokers. Brokers forward their clients' admin calls to the driver's inter-broker listener;
- broker b opens every listener but the controller-only ones; followers fetch from it on the
  inter-broker listener and nowhere else.

Runs on the driver and in broker tasks on executors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deltabus import config as cfg
from deltabus.cluster.executor_process import broker_host, local_host
from deltabus.cluster.handler import DeltaBusHandler, LifecycleHandler, TransactionHandler
from deltabus.listeners import GRPC, KAFKA, Listener
from deltabus.metadata import CONTROLLER_NODE_ID, BrokerEndpoint, ListenerEndpoint
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.rpc.authentication import CredentialLookup
from deltabus.rpc.kafka.listener import KafkaListener
from deltabus.rpc.server import start_server


@dataclass
class Doors:
    """A node's open listeners and the endpoints clients are told for them."""

    grpc_servers: list[Any] = field(default_factory=list)
    kafka_listeners: dict[str, KafkaListener] = field(default_factory=dict)
    endpoints: list[ListenerEndpoint] = field(default_factory=list)

    def endpoint(self, door: str, name: str) -> ListenerEndpoint:
        found = next((e for e in self.endpoints if e.door == door and e.name == name), None)
        if found is None:
            raise KeyError(f"no {door} listener {name} is open here (is the cluster started?)")
        return found

    def node(self, node_id: int, inter_broker: str, rack: str = "") -> BrokerEndpoint:
        """The node as the metadata names it: host and port its `inter_broker` gRPC listener,
        kafka_port its first Kafka listener's, and every listener."""
        grpc = self.endpoint(GRPC, inter_broker)
        kafka = next((e.port for e in self.endpoints if e.door == KAFKA), 0)
        return BrokerEndpoint(node_id, grpc.host, grpc.port, rack, kafka, tuple(self.endpoints))

    def stop(self) -> None:
        for listener in self.kafka_listeners.values():
            listener.stop()
        for server in self.grpc_servers:
            server.stop(grace=1).wait(5)


def open_doors(config: cfg.ClusterConfig, node: int, handler: DeltaBusHandler, *,
               credentials: CredentialLookup, lifecycle: LifecycleHandler | None = None,
               groups: GroupCoordinator | None = None,
               coordinator: BrokerEndpoint | None = None,
               transactions: TransactionHandler | None = None) -> Doors:
    """Open node `node`'s listeners (CONTROLLER_NODE_ID: the driver's, with the `lifecycle`,
    the `groups` it coordinates and the `transactions`; else a broker's, sending Kafka clients
    to the group `coordinator`). Closes what it opened if one cannot be bound, and raises
    ListenerBindError naming it."""
    listeners = config.listener_config(
        None if node == CONTROLLER_NODE_ID else broker_host(config.host))
    doors = Doors()
    try:
        for listener in listeners.grpc:
            if node != CONTROLLER_NODE_ID and listeners.controller_only(listener):
                continue
            controller = (node == CONTROLLER_NODE_ID
                          and listener.name in listeners.controller_listener_names)
            server, port = start_server(
                listener.bind_host, listener.bind_port(node), handler,
                lifecycle if controller else None,
                threads=(config.controller_threads() if controller
                         else _grpc_threads(config, node)), groups=groups,
                replica_fetch=(node != CONTROLLER_NODE_ID
                               and listener.name == listeners.inter_broker_listener_name),
                broker_secret=config.inter_broker_secret,
                security=config.listener_security(listener.security_protocol),
                credentials=credentials, listener=listener.name,
                brokers_only=node == CONTROLLER_NODE_ID and listeners.controller_only(listener),
                long_polls_max=config.grpc_long_polls_max, transactions=transactions)
            doors.grpc_servers.append(server)
            doors.endpoints.append(_endpoint(listener, port, node))
        for listener in listeners.kafka:
            kafka = KafkaListener(
                listener.bind_host, listener.bind_port(node), handler, groups=groups,
                coordinator=_coordinator_address(coordinator, listener.name),
                security=config.listener_security(listener.security_protocol),
                credentials=credentials, listener=listener.name,
                socket_server=config.socket_server, transactions=transactions).start()
            doors.kafka_listeners[listener.name] = kafka
            endpoint = _endpoint(listener, kafka.bound_port, node)
            kafka.advertise(endpoint.host, endpoint.port)
            doors.endpoints.append(endpoint)
    except BaseException:
        doors.stop()
        raise
    return doors


def _endpoint(listener: Listener, bound_port: int, node: int) -> ListenerEndpoint:
    host, port = listener.advertised(bound_port, node, local_host())
    return ListenerEndpoint(listener.name, listener.door, host, port)


def _coordinator_address(coordinator: BrokerEndpoint | None, name: str) -> str:
    """host:port of the group coordinator's Kafka listener `name` ("": none known)."""
    address = coordinator.kafka_address(name) if coordinator is not None else None
    return f"{address[0]}:{address[1]}" if address else ""


def _grpc_threads(config: cfg.ClusterConfig, node: int) -> int:
    """The driver's servers also hold group long-polls (JoinGroup, SyncGroup)."""
    if node == CONTROLLER_NODE_ID:
        return max(config.grpc_threads, config.group.coordinator_threads)
    return config.grpc_threads
