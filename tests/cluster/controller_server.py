"""A controller and its gRPC server in the test process, with no Spark: a real metadata log (a
Delta table under tmp_path), the public API and the brokers' lifecycle API on a free port."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deltabus import NewTopic
from deltabus import config as cfg
from deltabus.cluster.broker import Broker, BrokerSpec
from deltabus.cluster.controller import Controller
from deltabus.cluster.controller_apis import ControllerHandler
from deltabus.listeners import GRPC
from deltabus.metadata import CONTROLLER_NODE_ID, BrokerEndpoint, ListenerEndpoint
from deltabus.rpc.kafka.listener import KafkaListener
from deltabus.rpc.server import start_server
from tests.conftest import wait_until


class LiveBrokers:
    """Brokers 0..count-1 registered by hand (no Spark) that go on heartbeating as live brokers
    do: each long-polls the controller and reports its latest metadata version as applied. A
    request that waits for the brokers to apply a change (an auto-created topic, a
    transaction's new partitions) then answers when it would in a cluster, not at its timeout.
    The heartbeats end with `close` or when the controller shuts down."""

    def __init__(self, controller: Controller, count: int) -> None:
        self._controller = controller
        self._closed = threading.Event()
        self.epochs: dict[int, int] = {}
        for b in range(count):
            self.epochs[b] = controller.register_broker(
                BrokerEndpoint(b, "127.0.0.1", 9000 + b), 100 + b)
            controller.heartbeat(b, self.epochs[b], controller.image().version, 0)
        self._threads = [threading.Thread(target=self._heartbeat, args=(b,), daemon=True,
                                          name=f"broker-{b}-heartbeat") for b in self.epochs]
        for t in self._threads:
            t.start()

    def _heartbeat(self, broker_id: int) -> None:
        while not self._closed.is_set():
            try:
                stop, _, _ = self._controller.heartbeat(
                    broker_id, self.epochs[broker_id], self._controller.image().version, 200)
            except Exception:  # fenced or stopped: a real broker would stop heartbeating too
                return
            if stop:
                return

    def close(self) -> None:
        self._closed.set()
        for t in self._threads:
            t.join()


class ControllerServer:
    """A controller and its gRPC server (public API and brokers' lifecycle API); with `kafka`,
    also its Kafka door (the bootstrap listener a cluster's driver runs), at `kafka_address`."""

    def __init__(self, root: Path, *, kafka: bool = False, **settings: object) -> None:
        """`settings`: more ClusterConfig settings (security, authorizer, ...)."""
        # Brokers made from this config: any free ports; no Kafka door unless kafka_port says.
        settings = {"port": 0, "kafka_port": -1, **settings}
        self.config = cfg.ClusterConfig(root=str(root), brokers=3,
                                        **settings)  # type: ignore[arg-type]
        self.controller = Controller(self.config)
        self.handler = ControllerHandler(self.controller)
        self.server, port = start_server(
            "127.0.0.1", 0, self.handler, self.controller,
            broker_secret=self.config.inter_broker_secret, security=self.config.security,
            credentials=self.handler.scram_credential)
        self.address = f"127.0.0.1:{port}"
        # The driver's node, as a BrokerSpec names it to brokers run against this controller:
        # its one gRPC server is the config's controller listener (where brokers register and
        # heartbeat) and its inter-broker listener (where they forward admin calls). A real
        # driver (deltabus.cluster.doors) serves the two on servers of their own.
        listeners = self.config.listener_config()
        names = dict.fromkeys((listeners.controller.name, listeners.inter_broker.name))
        self.node = BrokerEndpoint(CONTROLLER_NODE_ID, "127.0.0.1", port, listeners=tuple(
            ListenerEndpoint(name, GRPC, "127.0.0.1", port) for name in names))
        self.kafka: KafkaListener | None = None
        if kafka:
            self.kafka = KafkaListener("127.0.0.1", 0, self.handler,
                                       security=self.config.security,
                                       credentials=self.handler.scram_credential).start()
        self.kafka_address = f"127.0.0.1:{self.kafka.port}" if self.kafka else ""

        self._brokers: LiveBrokers | None = None

    def start_brokers(self, count: int) -> dict[int, int]:
        """Brokers 0..count-1, live until `stop` (`LiveBrokers`); their epochs."""
        self._brokers = LiveBrokers(self.controller, count)
        return self._brokers.epochs

    def stop(self) -> None:
        if self._brokers is not None:
            self._brokers.close()
        if self.kafka is not None:
            self.kafka.stop()
        self.server.stop(grace=None)


def serve(root: Path) -> Iterator[ControllerServer]:
    """The body of a test module's fixture: a server, stopped after the test."""
    server = ControllerServer(root)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def leading_broker(server: ControllerServer, topics: tuple[str, ...]) -> Iterator[Broker]:
    """Broker 0 against `server`, live and leading partition 0 of each of `topics` (one
    partition, its only replica); closed, and the server stopped, afterwards."""
    broker = Broker(BrokerSpec(0, server.node, server.config))
    try:
        broker.start()
        wait_until(lambda: server.controller.live_brokers() == [0], "the broker to be live", 30)
        server.controller.create_topics(
            [NewTopic(t, replica_assignment={0: [0]}) for t in topics], timeout_ms=30_000)
        wait_until(lambda: all((p := broker._partitions.get((t, 0))) is not None
                               and p.is_leader for t in topics), "the broker to lead", 30)
        yield broker
    finally:
        broker.close()
        server.stop()
