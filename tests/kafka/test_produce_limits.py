"""What one produce batch may be, on the Kafka door: max.message.bytes limits each record batch
as the client sent it (compressed or not), as Kafka's broker checks it (MESSAGE_TOO_LARGE, with
its message). A refused batch writes nothing, and the connection serves the next request. No
Spark: the real Kafka listener in front of in-memory brokers (tests/client/fake_cluster.py),
which apply the partition log's rules."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c
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


# ---- what a batch declares and what it unpacks to ------------------------------------------

MIB = 1024 * KIB
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def forged_count(records: bytes, count: int) -> bytes:
    """A record batch declaring `count` records, its CRC made good again."""
    forged = bytearray(records)
    struct.pack_into(">i", forged, 57, count)
    struct.pack_into(">I", forged, 17, calc_crc32c(bytes(forged[21:])))
    return bytes(forged)


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_unpacks_what_a_client_packed(door, fake, codec) -> None:
    values = [b"%d" % i * 100 for i in range(50)]
    answer = produce(door, record_batch(values, CODECS[codec], headers=[("h", b"x")]))
    assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 0)
    assert fake.values(TOPIC, 0) == values
    assert fake.log(TOPIC, 0).records.column("headers").to_pylist()[0] == [
        {"key": "h", "value": b"x"}]


@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_unpacking_past_the_request_limit_is_refused_before_it_is_unpacked(
        door, fake, codec) -> None:
    """101 MiB of zeros, a few KiB to a few MiB packed, each record within max.message.bytes:
    refused with RECORD_LIST_TOO_LARGE naming the limit, nothing written."""
    bomb = record_batch([bytes(MIB)] * 101, CODECS[codec])
    assert len(bomb) < cfg.MESSAGE_MAX_BYTES * 6
    answer = produce(door, bomb)
    assert answer.error_code == ErrorCode.record_list_too_large
    assert str(cfg.PRODUCE_UNPACKED_BYTES_MAX) in answer.error_message
    assert fake.values(TOPIC, 0) == []
    assert produce(door, record_batch([b"next"], CODECS[codec])).error_code == ErrorCode.none


def test_what_a_request_unpacks_to_is_counted_over_all_its_partitions(fake) -> None:
    """Two partitions of 51 MiB each, a few KiB packed: over the request's limit together."""
    fake.create_topic("two", 2)
    host, port = fake.serve_kafka(0).rsplit(":", 1)
    half = record_batch([bytes(MIB)] * 51, CODECS["zstd"])
    cls = load_request_schema(PRODUCE, PRODUCE_VERSION)
    topic_cls, partition_cls = nested(cls, "TopicProduceData"), nested(cls, "PartitionProduceData")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(frame(PRODUCE, PRODUCE_VERSION, make(
            cls, transactional_id=None, acks=1, timeout=timedelta(seconds=30),
            topic_data=(make(topic_cls, name="two", partition_data=tuple(
                make(partition_cls, index=p, records=half) for p in (0, 1))),))))
        _, body = read_response(sock, PRODUCE, PRODUCE_VERSION)
    codes = [p.error_code for p in body.responses[0].partition_responses]
    assert codes == [ErrorCode.none, ErrorCode.record_list_too_large]
    assert len(fake.values("two", 0)) == 51 and fake.values("two", 1) == []


def test_a_batch_declaring_more_records_than_the_limit_is_refused_before_reading_them(
        door, fake) -> None:
    answer = produce(door, forged_count(record_batch([b"v"] * 3), 2**31 - 1))
    assert answer.error_code == ErrorCode.record_list_too_large
    assert str(cfg.PRODUCE_BATCH_RECORDS_MAX) in answer.error_message
    assert produce(door, record_batch([b"v"])).error_code == ErrorCode.none


@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_that_does_not_unpack_is_corrupt_and_the_door_goes_on(door, fake, codec) -> None:
    packed = record_batch([b"v"] * 3, CODECS[codec])
    junk = bytearray(packed[:61] + b"\x05garbage, not a compressed stream")
    struct.pack_into(">i", junk, 8, len(junk) - 12)
    struct.pack_into(">I", junk, 17, calc_crc32c(bytes(junk[21:])))
    assert produce(door, bytes(junk)).error_code == ErrorCode.corrupt_message
    assert produce(door, packed).error_code == ErrorCode.none


def test_a_batch_declaring_more_records_than_it_holds_is_corrupt(door, fake) -> None:
    answer = produce(door, forged_count(record_batch([b"v"] * 3), 4))
    assert answer.error_code == ErrorCode.corrupt_message
    assert fake.values(TOPIC, 0) == []


def test_a_record_with_more_headers_than_the_limit_is_an_invalid_record(door, fake) -> None:
    many = [("h", None)] * (cfg.RECORD_HEADERS_MAX + 1)
    answer = produce(door, record_batch([b"v"], headers=many))
    assert answer.error_code == ErrorCode.invalid_record
    assert str(cfg.RECORD_HEADERS_MAX) in answer.error_message
    assert fake.values(TOPIC, 0) == []
    most = [("h", None)] * cfg.RECORD_HEADERS_MAX
    assert produce(door, record_batch([b"v"], headers=most)).error_code == ErrorCode.none
