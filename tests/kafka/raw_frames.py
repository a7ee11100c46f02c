"""Kafka requests as raw frames on a socket, for tests that must send what no client library
would (a version we do not advertise, a 1 MB topic name): kio writes the request and reads the
answer, so what crosses the socket is exactly Kafka's wire format."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from deltabus.rpc.kafka.frames import make


def frame(key: int, version: int, body: Any, correlation_id: int = 7) -> bytes:
    cls = load_request_schema(key, version)
    header_cls = cls.__header_schema__
    out = io.BytesIO()
    entity_writer(header_cls)(out, make(header_cls, request_api_key=key,
                                        request_api_version=version,
                                        correlation_id=correlation_id, client_id="test"))
    entity_writer(cls)(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def read_response(sock: socket.socket, key: int, version: int) -> tuple[int, Any]:
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    data = recv_exactly(sock, size)
    cls = load_response_schema(key, version)
    header, n = entity_reader(cls.__header_schema__)(data, 0)
    body, _ = entity_reader(cls)(data, n)
    return header.correlation_id, body


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def call(address: str, key: int, version: int, body: Any) -> Any:
    """One request on a connection of its own to `address` (host:port); its answer."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(frame(key, version, body))
        _, answer = read_response(sock, key, version)
    return answer
