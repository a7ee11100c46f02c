"""How every deltabus process opens a gRPC channel to a server: the same message size limits as
the servers (Kafka's socket.request.max.bytes), and no transparent retries, since clients retry
themselves by Kafka's rules (idempotence, metadata refresh) and a silent resend could write twice.
"""

from __future__ import annotations

import grpc

from deltabus import config as cfg


def open_channel(address: str, user_agent: str,
                 credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A channel to `address` (host:port) whose calls carry `user_agent`: TLS with
    `credentials`, else plaintext."""
    options = [
        ("grpc.max_receive_message_length", cfg.REQUEST_MAX_BYTES),
        ("grpc.max_send_message_length", cfg.REQUEST_MAX_BYTES),
        ("grpc.primary_user_agent", user_agent),
        ("grpc.enable_retries", 0),
    ]
    if credentials is not None:
        return grpc.secure_channel(address, credentials, options=options)
    return grpc.insecure_channel(address, options=options)
