"""Kafka request frames written and responses read with kio, on plain sockets: what the tests of
the Kafka listener send where a client library would hide the framing."""

from __future__ import annotations

import io
import resource
import socket
import struct
from datetime import timedelta
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from deltabus.rpc.kafka.frames import make, nested

API_VERSIONS, METADATA, FETCH, PRODUCE = 18, 3, 1, 0


def room_for_connections(connections: int) -> None:
    """Raise this process's open-file limit (up to the hard limit) so a test can hold both
    ends of `connections` loopback connections, with room to spare for everything else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * connections + 1_000
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def connect_to(address: str, timeout_s: float = 10) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def frame(key: int, version: int, body: Any, correlation_id: int = 7, *,
          client_id: str = "test") -> bytes:
    cls = load_request_schema(key, version)
    header_cls = cls.__header_schema__
    out = io.BytesIO()
    entity_writer(header_cls)(out, make(header_cls, request_api_key=key,
                                        request_api_version=version,
                                        correlation_id=correlation_id, client_id=client_id))
    entity_writer(cls)(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def read_response(sock: socket.socket, key: int, version: int) -> tuple[int, Any]:
    """(correlation id, body) of the next response on `sock`, read as API `key` v`version`."""
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


def closed(sock: socket.socket) -> bool:
    """Whether the broker ends the connection (True) rather than answering or waiting (a
    socket timeout raises)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def api_versions(correlation_id: int = 7) -> bytes:
    return frame(API_VERSIONS, 3, make(load_request_schema(API_VERSIONS, 3),
                                       client_software_name="t", client_software_version="1"),
                 correlation_id)


def metadata(topics: list[str], correlation_id: int = 7) -> bytes:
    cls = load_request_schema(METADATA, 12)
    return frame(METADATA, 12, make(cls, topics=tuple(
        nested(cls, "MetadataRequestTopic")(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False),
        correlation_id)


def fetch(topic: str, offset: int, max_wait_ms: int, correlation_id: int = 7, *,
          client_id: str = "test", isolation_level: int = 0) -> bytes:
    """A Fetch v12 of one partition (0) from `offset`, long-polling up to `max_wait_ms` for a
    byte (read_committed with `isolation_level` 1)."""
    cls = load_request_schema(FETCH, 12)
    partition = nested(cls, "FetchPartition")(
        partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20)
    return frame(FETCH, 12, make(
        cls, replica_id=-1, max_wait=timedelta(milliseconds=max_wait_ms), min_bytes=1,
        max_bytes=1 << 20, isolation_level=isolation_level, session_id=0, session_epoch=-1,
        topics=(nested(cls, "FetchTopic")(topic=topic, partitions=(partition,)),),
        forgotten_topics_data=(), rack_id=""), correlation_id, client_id=client_id)


def produce(topic: str, values: list[bytes], correlation_id: int = 7, *,
            client_id: str = "test", acks: int = 1) -> bytes:
    """A Produce v9 (acks=1 unless given) of `values` to partition 0, in one record batch."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    cls = load_request_schema(PRODUCE, 9)
    data = nested(cls, "PartitionProduceData")(index=0, records=bytes(builder.build()))
    return frame(PRODUCE, 9, make(
        cls, transactional_id=None, acks=acks, timeout=timedelta(seconds=30),
        topic_data=(nested(cls, "TopicProduceData")(name=topic, partition_data=(data,)),)),
        correlation_id, client_id=client_id)


def call(address: str, key: int, version: int, body: Any, timeout_s: float = 30) -> Any:
    """One request on a connection of its own to `address` (host:port); its answer, waited
    for `timeout_s` at most (a client's request.timeout.ms)."""
    with connect_to(address, timeout_s=timeout_s) as sock:
        sock.sendall(frame(key, version, body))
        _, answer = read_response(sock, key, version)
    return answer
