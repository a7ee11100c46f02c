"""What one produce batch may be, on the Kafka door: max.message.bytes limits each record batch
as the client sent it (compressed or not), as Kafka's broker checks it (MESSAGE_TOO_LARGE, with
its message). A refused batch writes nothing, and the connection serves the next request. No
Spark: the real Kafka listener in front of in-memory brokers (tests/client/fake_cluster.py),
which apply the partition log's rules."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus.rpc.kafka.apis import PRODUCE
from deltabus.rpc.kafka.frames import make, nested
from tests.client.fake_cluster import FakeCluster
from tests.kafka.test_listener import frame, read_response

TOPIC = "t"
KIB = 1024
PRODUCE_VERSION = 9
GZIP = 1


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster(brokers=1)
    cluster.create_topic(TOPIC, 1)  # max.message.bytes: Kafka's default, 1,048,588
    yield cluster
    cluster.close()


@pytest.fixture
def door(fake: FakeCluster) -> Iterator[socket.socket]:
    host, port = fake.serve_kafka(0).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        yield sock


def record_batch(values: list[bytes], compression: int = 0,
                 headers: list[tuple[str, bytes | None]] | None = None) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression,
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1,
                                        batch_size=2**31 - 1)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=value,
                       headers=headers or [])
    return bytes(builder.build())


def produce(sock: socket.socket, records: bytes) -> Any:
    """One Produce (acks=1) of `records` to partition 0; its partition's answer."""
    cls = load_request_schema(PRODUCE, PRODUCE_VERSION)
    topic_cls, partition_cls = nested(cls, "TopicProduceData"), nested(cls, "PartitionProduceData")
    sock.sendall(frame(PRODUCE, PRODUCE_VERSION, make(
        cls, transactional_id=None, acks=1, timeout=timedelta(seconds=30),
        topic_data=(make(topic_cls, name=TOPIC, partition_data=(
            make(partition_cls, index=0, records=records),)),))))
    _, body = read_response(sock, PRODUCE, PRODUCE_VERSION)
    return body.responses[0].partition_responses[0]


def test_a_value_of_1_mib_and_1_byte_is_over_the_default_max_message_bytes(door, fake) -> None:
    answer = produce(door, record_batch([b"v" * (1024 * KIB + 1)]))
    assert answer.error_code == ErrorCode.message_too_large
    assert f"max.message.bytes={cfg.MESSAGE_MAX_BYTES}" in answer.error_message
    assert fake.values(TOPIC, 0) == []
    assert produce(door, record_batch([b"v" * (1024 * KIB - 100)])).error_code == ErrorCode.none


def test_three_records_of_600_kib_in_one_batch_are_refused_as_one_batch(door, fake) -> None:
    answer = produce(door, record_batch([b"v" * (600 * KIB)] * 3))
    assert answer.error_code == ErrorCode.message_too_large
    assert fake.values(TOPIC, 0) == []
    assert produce(door, record_batch([b"v" * (600 * KIB)])).error_code == ErrorCode.none


def test_a_compressed_batch_is_measured_as_sent_as_kafka_does(door, fake) -> None:
    """3 MiB of values gzipped to a few KiB: within the limit, as in Kafka."""
    answer = produce(door, record_batch([b"v" * (1024 * KIB)] * 3, compression=GZIP))
    assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 0)
    assert [len(v or b"") for v in fake.values(TOPIC, 0)] == [1024 * KIB] * 3
