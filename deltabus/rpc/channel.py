"""How every deltabus process opens a gRPC channel to a server: the same message size limits as
the servers (Kafka's socket.request.max.bytes), and no transparent retries, since clients retry
themselves by Kafka's rules (idempotence, metadata refresh) and a silent resend could write twice.

A channel is TLS when given channel credentials, and given call metadata (a client's SASL
authorization) it adds that to every call of every stub and method made on it, so no call can
leave without it. Metadata goes through an interceptor rather than gRPC call credentials, which
gRPC sends only over TLS: SASL_PLAINTEXT must carry it too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import grpc

from deltabus import config as cfg

Metadata = Sequence[tuple[str, str]]
CLIENT_ID_KEY = "deltabus-client-id"  # call metadata: the client's client_id (client quotas)
RECONNECT_BACKOFF_MS, RECONNECT_BACKOFF_MAX_MS = 50, 1000  # Kafka's defaults


def client_id_metadata(client_id: str) -> Metadata:
    """The metadata naming a client's client id, where gRPC can carry it (printable ASCII;
    the user agent names it too)."""
    return ((CLIENT_ID_KEY, client_id),) if client_id.isascii() and client_id.isprintable() \
        else ()


def open_channel(address: str, user_agent: str, *,
                 credentials: grpc.ChannelCredentials | None = None,
                 metadata: Metadata = ()) -> grpc.Channel:
    """A channel to `address` (host:port) whose calls carry `user_agent` and `metadata`; TLS
    with `credentials`, else insecure."""
    options = [
        ("grpc.max_receive_message_length", cfg.REQUEST_MAX_BYTES),
        ("grpc.max_send_message_length", cfg.REQUEST_MAX_BYTES),
        ("grpc.primary_user_agent", user_agent),
        ("grpc.enable_retries", 0),
        # Kafka's reconnect.backoff.ms and reconnect.backoff.max.ms: after a server comes back
        # (a relaunched leader, a restarted controller) a channel connects again within about
        # a second, where gRPC's own backoff grows to two minutes and left followers apart from
        # a leader that was back long before
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    ]
    channel = (grpc.secure_channel(address, credentials, options=options) if credentials
               else grpc.insecure_channel(address, options=options))
    if metadata:
        channel = grpc.intercept_channel(channel, CallMetadata(metadata))
    return channel


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Metadata | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: Any


class CallMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds fixed metadata to every call, after what the call itself carries."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = tuple(metadata)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        own = tuple(details.metadata or ())
        return _ClientCallDetails(details.method, details.timeout, own + self._metadata,
                                  details.credentials, getattr(details, "wait_for_ready", None),
                                  getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Callable, details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable, details: grpc.ClientCallDetails,
                               request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable, details: grpc.ClientCallDetails,
                               request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable, details: grpc.ClientCallDetails,
                                request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


class _ClientCallDetails(_CallDetails, grpc.ClientCallDetails):
    """grpc.ClientCallDetails is an interface with no constructor: a named tuple fills it."""
