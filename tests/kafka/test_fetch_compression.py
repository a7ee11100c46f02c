"""A topic's compression.type compresses the record batches of Kafka fetch answers (issue 19):
the records are stored uncompressed, and each codec Kafka clients know goes out as the batches'
codec; librdkafka and kafka-python, unmodified, read every record of each; a batch that would
not shrink goes out as stored (tests/kafka/test_batches.py); an unknown codec is INVALID_CONFIG."""

from __future__ import annotations

import socket
import struct
from datetime import timedelta

import pytest
from confluent_kafka import Consumer as LibrdkafkaConsumer
from kafka import KafkaConsumer
from kafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema

from deltabus import AdminClient, NewTopic, Producer, errors
from deltabus.rpc.kafka import batches
from deltabus.rpc.kafka.apis import FETCH
from deltabus.rpc.kafka.frames import make, nested
from tests.kafka.raw_frames import frame, read_response

RECORDS = 300
VALUES = [f"payment {i} of 100 EUR from account {i % 7}".encode() for i in range(RECORDS)]


def raw_fetch(cluster, topic: str) -> bytes:
    endpoint = cluster.controller.image().broker(0)
    cls = load_request_schema(FETCH, 11)
    topic_cls, partition_cls = nested(cls, "FetchTopic"), nested(cls, "FetchPartition")
    request = make(cls, replica_id=-1, max_wait=timedelta(0), min_bytes=0, max_bytes=1 << 20,
                   isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(),
                   rack_id="", topics=(make(topic_cls, topic=topic, partitions=(make(
                       partition_cls, partition=0, fetch_offset=0, log_start_offset=-1,
                       partition_max_bytes=1 << 20),)),))
    with socket.create_connection((endpoint.host, endpoint.kafka_port), timeout=30) as sock:
        sock.sendall(frame(FETCH, 11, request))
        _, body = read_response(sock, FETCH, 11)
    return body.responses[0].partitions[0].records or b""


def codecs_of(records: bytes) -> list[int]:
    """The compression codec of each record batch (the attributes' low bits)."""
    out, pos = [], 0
    while pos < len(records):
        size = struct.unpack_from(">i", records, pos + 8)[0] + 12
        out.append(struct.unpack_from(">h", records, pos + 21)[0] & 0x7)
        pos += size
    return out


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_fetch_answers_carry_the_topics_codec(cluster, topic_name, codec) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, replica_assignment={0: [0]},
                                      configs={"compression.type": codec})])
    with Producer(cluster.bootstrap_servers) as producer:
        for value in VALUES:
            producer.send(topic_name, value, partition=0)
        producer.flush()

    records = raw_fetch(cluster, topic_name)
    assert set(codecs_of(records)) == {batches.CODECS[codec]}
    read, stored = MemoryRecords(records), []
    while read.has_next():
        stored += [r.value for r in read.next_batch()]
    assert stored == VALUES

    librdkafka = LibrdkafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                                     "group.id": f"{topic_name}-g",
                                     "auto.offset.reset": "earliest"})
    got: list[bytes] = []
    try:
        librdkafka.subscribe([topic_name])
        while len(got) < RECORDS:
            message = librdkafka.poll(30)
            assert message is not None and message.error() is None
            got.append(message.value())
    finally:
        librdkafka.close()
    assert got == VALUES
    consumer = KafkaConsumer(topic_name, bootstrap_servers=cluster.kafka_bootstrap_servers,
                             auto_offset_reset="earliest", consumer_timeout_ms=30_000)
    try:
        assert [r.value for _, r in zip(range(RECORDS), consumer, strict=False)] == VALUES
    finally:
        consumer.close()


def test_an_unknown_codec_is_invalid_config(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin, pytest.raises(
            errors.InvalidConfigError, match="compression.type"):
        admin.create_topics([NewTopic(topic_name, 1, 1, {"compression.type": "brotli"})])
