"""A FakeCluster broker's gRPC server over TLS (optionally requiring a client certificate), with
every call's metadata and TLS peer recorded: what the client security tests look at.

It serves the real `DeltaBusServicer` as `deltabus.rpc.server.start_server` does, with a server
certificate added; the broker side of authentication (checking the password) is not here, only
what a client sends. Certificates come from `trustme`: a CA made per test, a server certificate
for 127.0.0.1 and localhost, and client certificates with a common name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import trustme

from deltabus import config as cfg
from deltabus.rpc.server import DeltaBusServicer
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class SeenCall:
    """One call as the server saw it."""

    method: str  # the short name: Metadata, Produce, Fetch...
    metadata: tuple[tuple[str, str], ...]
    peer_common_names: tuple[bytes, ...]  # the client certificate's CN (mTLS), else ()
    transport: bytes  # b"ssl" over TLS, b"insecure" otherwise

    def header(self, key: str) -> list[str]:
        return [v for k, v in self.metadata if k == key]


class CallRecorder(grpc.ServerInterceptor):
    """Records each call before the servicer runs it. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[SeenCall] = []

    def seen(self) -> list[SeenCall]:
        with self._lock:
            return list(self.calls)

    def _record(self, method: str, context: grpc.ServicerContext) -> None:
        auth = context.auth_context()
        call = SeenCall(method.rsplit("/", 1)[-1],
                        tuple((k, v) for k, v in context.invocation_metadata()
                              if isinstance(v, str)),
                        tuple(auth.get("x509_common_name", ())),
                        (auth.get("transport_security_type") or [b"insecure"])[0])
        with self._lock:
            self.calls.append(call)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None

        def wrap(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Callable:
            def recorded(request: Any, context: grpc.ServicerContext) -> Any:
                self._record(details.method, context)
                return behavior(request, context)
            return recorded

        kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                    if getattr(handler, k) is not None)
        return handler._replace(**{kind: wrap(getattr(handler, kind))})


@dataclass
class TlsServers:
    """How a test's FakeCluster serves: pass `serve` as FakeCluster(serve=...)."""

    ca: trustme.CA
    recorder: CallRecorder
    require_client_auth: bool = False
    tls: bool = True

    def serve(self, host: str, port: int, handler: Any, *, threads: int,
              groups: Any = None) -> tuple[grpc.Server, int]:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads),
                             interceptors=[self.recorder], options=[
                                 ("grpc.max_receive_message_length", cfg.REQUEST_MAX_BYTES),
                                 ("grpc.max_send_message_length", cfg.REQUEST_MAX_BYTES),
                                 ("grpc.so_reuseport", 0)])
        pb_grpc.add_DeltaBusServicer_to_server(DeltaBusServicer(handler, groups), server)
        if self.tls:
            leaf = self.ca.issue_cert("127.0.0.1", "localhost")
            credentials = grpc.ssl_server_credentials(
                [(leaf.private_key_pem.bytes(), b"".join(b.bytes() for b in leaf.cert_chain_pems))],
                root_certificates=self.ca.cert_pem.bytes() if self.require_client_auth else None,
                require_client_auth=self.require_client_auth)
            bound = server.add_secure_port(f"{host}:{port}", credentials)
        else:
            bound = server.add_insecure_port(f"{host}:{port}")
        server.start()
        return server, bound
