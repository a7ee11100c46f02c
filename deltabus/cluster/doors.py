"""The listeners one node opens: a gRPC server per named gRPC listener and a Kafka listener per
named Kafka listener (deltabus.listeners), each secured with its own protocol, and the endpoints
clients are told for them.

Who serves what, as KRaft splits it:
- the driver (node -1: controller, bootstrap, group coordinator) opens every listener; its
  controller listeners serve the broker lifecycle (RegisterBroker, BrokerHeartbeat,
  AlterPartition) and nothing else, on gRPC servers of their own: grpcio's server is one thread
  pool, so a pool no client call can reach is what keeps client long-polls (JoinGroup) and
  floods from starving heartbeats until brokers are fenced. They answer only the cluster's
  brokers. Brokers forward their clients' admin calls, and their Kafka clients' requests for
  the group and transaction coordinators, to the driver's inter-broker listener;
- broker b opens every listener but the controller-only ones; followers fetch from it on the
  inter-broker listener and nowhere else.

Runs on the driver and in broker tasks on executors.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from deltabus import config as cfg
from deltabus.cluster.executor_process import broker_host, local_host
from deltabus.cluster.handler import DeltaBusHandler, LifecycleHandler, TransactionHandler
from deltabus.listeners import GRPC, KAFKA, Listener, ListenerBindError, ListenerConfig
from deltabus.metadata import CONTROLLER_NODE_ID, BrokerEndpoint, ListenerEndpoint
from deltabus.metrics import NodeMetrics, RequestMeters
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.rpc.access import Access
from deltabus.rpc.authentication import CredentialLookup
from deltabus.rpc.console_http import ConsoleApp
from deltabus.rpc.http_door import HttpApp, HttpDoor
from deltabus.rpc.kafka.listener import KafkaListener
from deltabus.rpc.metrics_http import (
    CONSOLE_LISTENER_NAME,
    HTTP,
    METRICS_LISTENER_NAME,
    MetricsApp,
    http_scheme,
)
from deltabus.rpc.server import start_server
from deltabus.security.acls import Authorizer
from deltabus.security.principal import KafkaPrincipal

log = logging.getLogger(__name__)

# Passes a Kafka request on to the driver's listener named first: (listener, frame, client's
# host, principal) -> the future of the answer frame and throttle time (`ControllerChannel`).
Bound = TypeVar("Bound")
ForwardKafka = Callable[[str, bytes, str, KafkaPrincipal], "Future[tuple[bytes, int]]"]


@dataclass
class Doors:
    """A node's open listeners and the endpoints clients are told for them."""

    grpc_servers: list[Any] = field(default_factory=list)
    kafka_listeners: dict[str, KafkaListener] = field(default_factory=dict)
    http_doors: list[HttpDoor] = field(default_factory=list)
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
        for door in self.http_doors:
            door.stop()


def open_doors(config: cfg.ClusterConfig, node: int, handler: DeltaBusHandler, *,
               credentials: CredentialLookup, lifecycle: LifecycleHandler | None = None,
               groups: GroupCoordinator | None = None,
               forward: ForwardKafka | None = None,
               transactions: TransactionHandler | None = None,
               previous: Sequence[ListenerEndpoint] = (),
               metrics: NodeMetrics | None = None,
               sd_nodes: Callable[[], Sequence[BrokerEndpoint]] | None = None,
               console: Callable[[Access], dict[str, Any]] | None = None) -> Doors:
    """Open node `node`'s listeners (CONTROLLER_NODE_ID: the driver's, with the `lifecycle`,
    the `groups` it coordinates and the `transactions`; else a broker's, which `forward`s its
    Kafka clients' requests for them to the driver's listener of the same name). `previous`:
    the node's listeners in its last incarnation (`_bind`). `metrics`: the node's, timed on
    every door and served on config.metrics_port's door (with `sd_nodes`, the driver's
    service discovery); `console`: the driver's overview, its console served on
    config.console_port. Closes what it opened if one cannot be bound, and raises
    ListenerBindError naming it."""
    listeners = config.listener_config(
        None if node == CONTROLLER_NODE_ID else broker_host(config.host))
    # metrics.port -1: none served, none kept
    meters = metrics.requests if metrics is not None and config.metrics_port >= 0 else None
    doors = Doors()
    try:
        for listener in listeners.grpc:
            if node != CONTROLLER_NODE_ID and listeners.controller_only(listener):
                continue
            controller = (node == CONTROLLER_NODE_ID
                          and listener.name in listeners.controller_listener_names)
            server, port = _bind(listener, node, previous, functools.partial(
                start_server, host=listener.bind_host, handler=handler,
                lifecycle=lifecycle if controller else None,
                threads=(config.controller_threads() if controller
                         else _grpc_threads(config, node)), groups=groups,
                replica_fetch=(node != CONTROLLER_NODE_ID
                               and listener.name == listeners.inter_broker_listener_name),
                broker_secret=config.inter_broker_secret,
                security=config.listener_security(listener.security_protocol),
                credentials=credentials, listener=listener.name,
                brokers_only=node == CONTROLLER_NODE_ID and listeners.controller_only(listener),
                long_polls_max=config.grpc_long_polls_max, transactions=transactions,
                kafka_forwarded=(doors.kafka_listeners if node == CONTROLLER_NODE_ID and
                                 listener.name == listeners.inter_broker_listener_name
                                 else None), meters=meters))
            doors.grpc_servers.append(server)
            doors.endpoints.append(_endpoint(listener, port, node))
        for listener in listeners.kafka:
            kafka = _bind(listener, node, previous, functools.partial(
                KafkaListener, host=listener.bind_host, handler=handler, groups=groups,
                forward=functools.partial(forward, listener.name) if forward else None,
                security=config.listener_security(listener.security_protocol),
                credentials=credentials, listener=listener.name,
                socket_server=config.socket_server, transactions=transactions,
                meters=meters)).start()
            doors.kafka_listeners[listener.name] = kafka
            endpoint = _endpoint(listener, kafka.bound_port, node)
            kafka.advertise(endpoint.host, endpoint.port)
            doors.endpoints.append(endpoint)
        if metrics is not None and config.metrics_port >= 0:
            app = MetricsApp(metrics.exposition, nodes=sd_nodes, scheme=http_scheme(config))
            _open_http(config, listeners, node, previous, METRICS_LISTENER_NAME,
                       config.metrics_port, app, credentials, handler.authorizer, meters,
                       doors)
        if console is not None and config.console_port >= 0:
            _open_http(config, listeners, node, previous, CONSOLE_LISTENER_NAME,
                       config.console_port, ConsoleApp(console), credentials,
                       handler.authorizer, meters, doors)
    except BaseException:
        doors.stop()
        raise
    return doors


def _open_http(config: cfg.ClusterConfig, listeners: ListenerConfig, node: int,
               previous: Sequence[ListenerEndpoint], name: str, port: int, app: HttpApp,
               credentials: CredentialLookup, authorizer: Callable[[], Authorizer | None],
               meters: RequestMeters | None, doors: Doors) -> None:
    """An HTTP door of the node (`name`: metrics, console), on the host and security of its
    first client gRPC listener, at `port` as the Kafka listeners number theirs (broker b:
    port + 1 + b)."""
    client = listeners.client_grpc()[0]
    security = config.listener_security(client.security_protocol)
    listener = Listener(name, HTTP, client.host, port, client.security_protocol,
                        client.advertised_host)
    door = _bind(listener, node, previous, functools.partial(
        HttpDoor, app, listener.bind_host, security=security,
        credentials=credentials if security.uses_sasl else None,
        authorizer=authorizer, meters=meters)).start()
    doors.http_doors.append(door)
    doors.endpoints.append(_endpoint(listener, door.port, node))


def _bind(listener: Listener, node: int, previous: Sequence[ListenerEndpoint],
          open_at: Callable[..., Bound]) -> Bound:
    """`open_at(port=...)` for the listener: its configured port; for one on a free port (0), the
    port it had in the node's last incarnation where that is still free. A relaunched broker
    keeps its address, as a Kafka broker does across restarts: Kafka clients keep the brokers'
    addresses, and some (kafka-python) never ask the bootstrap again once they know them."""
    port = listener.bind_port(node)
    again = next((e.port for e in previous if (e.door, e.name) == (listener.door, listener.name)),
                 0)
    if port == 0 and again and not listener.advertised_port:
        try:
            return open_at(port=again)
        except ListenerBindError:
            log.info("%s listener %s: port %d is taken now, binding another", listener.door,
                     listener.name, again)
    return open_at(port=port)


def _endpoint(listener: Listener, bound_port: int, node: int) -> ListenerEndpoint:
    host, port = listener.advertised(bound_port, node, local_host())
    return ListenerEndpoint(listener.name, listener.door, host, port)


def _grpc_threads(config: cfg.ClusterConfig, node: int) -> int:
    """The driver's servers also hold group long-polls (JoinGroup, SyncGroup)."""
    if node == CONTROLLER_NODE_ID:
        return max(config.grpc_threads, config.group.coordinator_threads)
    return config.grpc_threads
