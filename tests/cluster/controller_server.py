"""A controller and its gRPC server in the test process, with no Spark: a real metadata log (a
Delta table under tmp_path), the public API and the brokers' lifecycle API on a free port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from deltabus import config as cfg
from deltabus.cluster.controller import Controller, ControllerHandler
from deltabus.rpc.server import start_server


class ControllerServer:
    """A controller and its gRPC server (public API and brokers' lifecycle API)."""

    def __init__(self, root: Path, **settings: object) -> None:
        """`settings`: more ClusterConfig settings (security, authorizer, ...)."""
        self.config = cfg.ClusterConfig(root=str(root), brokers=3, kafka_port=-1,
                                        **settings)  # type: ignore[arg-type]
        self.controller = Controller(self.config)
        handler = ControllerHandler(self.controller)
        self.server, port = start_server(
            "127.0.0.1", 0, handler, self.controller,
            broker_secret=self.config.inter_broker_secret, security=self.config.security,
            credentials=handler.scram_credential)
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.stop(grace=None)


def serve(root: Path) -> Iterator[ControllerServer]:
    """The body of a test module's fixture: a server, stopped after the test."""
    server = ControllerServer(root)
    try:
        yield server
    finally:
        server.stop()
