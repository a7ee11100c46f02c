"""The metrics door: Prometheus' `/metrics` of one node, and on the driver Prometheus' HTTP
service discovery (`/sd`, for `http_sd_configs`) listing every node's metrics endpoint.

Brokers move between executors (a relaunch, a scale), so their addresses are not known when
Prometheus is configured: one scrape config pointed at the driver's `/sd` finds them wherever
Spark put them. Each target carries `__scheme__` and `__metrics_path__`, which Prometheus
honours, and a `broker` label (-1: the driver).

Behind the cluster's TLS and HTTP Basic (rpc/http_door.py); with an authorizer, both paths
need DESCRIBE on the cluster, as describing the cluster over either door does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST

from deltabus.config import ClusterConfig
from deltabus.metadata import BrokerEndpoint, ListenerEndpoint
from deltabus.rpc.http_door import HttpRequest, HttpResponse
from deltabus.security.acls import Operation

METRICS_PATH = "/metrics"
SD_PATH = "/sd"
HTTP = "http"  # a ListenerEndpoint's door for a node's metrics endpoint
METRICS_LISTENER_NAME = "METRICS"
CONSOLE_LISTENER_NAME = "CONSOLE"
TEXT = "text/plain; charset=utf-8"


def metrics_endpoint(node: BrokerEndpoint) -> ListenerEndpoint | None:
    """Where a node serves its metrics (None: it does not)."""
    return node.listener(HTTP, METRICS_LISTENER_NAME)


def http_scheme(config: ClusterConfig) -> str:
    """The HTTP doors' scheme: they are secured as the first client gRPC listener is."""
    client = config.listener_config().client_grpc()[0]
    return "https" if config.listener_security(client.security_protocol).uses_tls else "http"


def http_url(node: BrokerEndpoint | None, name: str, config: ClusterConfig) -> str:
    """The base URL of a node's HTTP door `name` (METRICS_LISTENER_NAME,
    CONSOLE_LISTENER_NAME)."""
    endpoint = node.listener(HTTP, name) if node is not None else None
    if endpoint is None:
        raise RuntimeError(f"this node serves no {name.lower()} (its port is -1, or the "
                           "cluster is not started)")
    return f"{http_scheme(config)}://{endpoint.host}:{endpoint.port}"


def sd_targets(nodes: Sequence[BrokerEndpoint], scheme: str) -> list[dict[str, object]]:
    """Prometheus' http_sd answer: one target group per node that serves metrics."""
    groups: list[dict[str, object]] = []
    for node in sorted(nodes, key=lambda n: n.broker_id):
        endpoint = metrics_endpoint(node)
        if endpoint is not None:
            groups.append({"targets": [f"{endpoint.host}:{endpoint.port}"],
                           "labels": {"broker": str(node.broker_id), "__scheme__": scheme,
                                      "__metrics_path__": METRICS_PATH}})
    return groups


class MetricsApp:
    """A node's metrics (`exposition`: Prometheus' text of its registry) and, on the driver,
    the service discovery of every node (`nodes`: the driver and the registered brokers)."""

    name = "metrics"
    request_bytes_max = 0

    def __init__(self, exposition: Callable[[], bytes], *, scheme: str = "http",
                 nodes: Callable[[], Sequence[BrokerEndpoint]] | None = None) -> None:
        self._exposition = exposition
        self._nodes = nodes
        self.scheme = scheme

    def serve(self, request: HttpRequest) -> HttpResponse:
        if request.method != "GET":
            return self.refusal(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not "
                                "served here: GET /metrics")
        if request.path not in (METRICS_PATH, SD_PATH) or (
                request.path == SD_PATH and self._nodes is None):
            return self.refusal(HTTPStatus.NOT_FOUND, f"{request.path} is not served here: "
                                f"GET {METRICS_PATH}" + (f" or {SD_PATH}" if self._nodes else ""))
        refused = request.access.cluster(Operation.DESCRIBE)
        if refused is not None:
            return self.refusal(HTTPStatus.FORBIDDEN, f"{refused.message}: {request.path} "
                                "needs DESCRIBE on the cluster")
        if request.path == METRICS_PATH:
            return HttpResponse(HTTPStatus.OK, self._exposition(), CONTENT_TYPE_LATEST)
        assert self._nodes is not None
        return HttpResponse(HTTPStatus.OK, json.dumps(sd_targets(self._nodes(), self.scheme))
                            .encode(), "application/json")

    def refusal(self, status: int, message: str) -> HttpResponse:
        return HttpResponse(status, (message + "\n").encode(), TEXT)
