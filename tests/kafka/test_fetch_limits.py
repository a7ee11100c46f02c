"""The Kafka door keeps fetch.max.bytes and max.partition.fetch.bytes on the record batches it
sends (issue 14), whatever the number and sizes of the files behind a read: partitions of 500
Delta files whose records' sizes vary file by file (where a cut by average size overshot), read
with raw Fetch requests, then by kafka-python and librdkafka with their default limits."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
from confluent_kafka import Consumer as LibrdkafkaConsumer
from confluent_kafka import TopicPartition as LibrdkafkaTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic
from deltabus import config as cfg
from deltabus.rpc.kafka.apis import FETCH
from deltabus.rpc.kafka.frames import make, nested
from tests.kafka.test_listener import frame, read_response
from tests.rpc.test_fetch_limits import produce_files

PARTITIONS = 2
LEADER = 0
FILES = 500  # per partition, alternately one record of 9,000 bytes and 100 records of 100
FILE_VALUES = [[b"b" * 9_000], [b"s" * 100] * 100]
RECORDS = FILES // 2 * sum(len(values) for values in FILE_VALUES)  # per partition
FETCH_VERSION = 11


@pytest.fixture(scope="module")
def varied_files(cluster) -> str:
    topic = "t-kafka-fetch-limits-varied-files"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, replica_assignment={
            p: [LEADER] for p in range(PARTITIONS)})])
    produce_files(cluster, topic, PARTITIONS, FILE_VALUES * (FILES // 2))
    return topic


def kafka_fetch(cluster, topic: str, offsets: dict[int, int], *, partition_max_bytes: int,
                max_bytes: int) -> list[tuple[int, int, bytes]]:
    """One raw Fetch to the leader's Kafka listener: (partition, high watermark, records) of
    each partition, in the request's order."""
    endpoint = cluster.controller.image().broker(LEADER)
    cls = load_request_schema(FETCH, FETCH_VERSION)
    topic_cls, partition_cls = nested(cls, "FetchTopic"), nested(cls, "FetchPartition")
    request = make(cls, replica_id=-1, max_wait=timedelta(0), min_bytes=0, max_bytes=max_bytes,
                   isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(),
                   rack_id="", topics=(make(topic_cls, topic=topic, partitions=tuple(
                       make(partition_cls, partition=p, current_leader_epoch=-1,
                            fetch_offset=offset, log_start_offset=-1,
                            partition_max_bytes=partition_max_bytes)
                       for p, offset in offsets.items())),))
    with socket.create_connection((endpoint.host, endpoint.kafka_port), timeout=30) as sock:
        sock.sendall(frame(FETCH, FETCH_VERSION, request))
        _, body = read_response(sock, FETCH, FETCH_VERSION)
    (answer,) = body.responses
    out = []
    for p in answer.partitions:
        assert p.error_code == ErrorCode.none
        out.append((p.partition_index, p.high_watermark, p.records or b""))
    assert [p for p, _, _ in out] == list(offsets)
    assert sum(len(records) for _, _, records in out) <= max_bytes
    assert out[0][2]  # the first partition always progresses
    return out


def offsets_of(records: bytes) -> list[int]:
    batches, out = MemoryRecords(records), []
    while batches.has_next():
        batch = batches.next_batch()
        assert batch.validate_crc()
        out += [r.offset for r in batch]
    return out


@pytest.mark.parametrize("partition_max_bytes,max_bytes", [
    (cfg.FETCH_PARTITION_MAX_BYTES, cfg.FETCH_MAX_BYTES),  # Kafka's defaults
    (10_000, cfg.FETCH_MAX_BYTES),
    (100_000, 150_000),
    (30_000, 30_000),  # the first partition spends it all
])
def test_kafka_fetch_answers_keep_their_limits(cluster, varied_files, partition_max_bytes,
                                               max_bytes):
    for _, high_watermark, records in kafka_fetch(
            cluster, varied_files, dict.fromkeys(range(PARTITIONS), 0),
            partition_max_bytes=partition_max_bytes, max_bytes=max_bytes):
        assert high_watermark == RECORDS
        assert len(records) <= partition_max_bytes
        offsets = offsets_of(records)
        assert offsets == list(range(len(offsets)))  # a prefix of the log, in order


def test_a_kafka_consumer_walking_500_files_gets_answers_within_its_limits(cluster,
                                                                           varied_files):
    """Partition 0 answer after answer, 12 kB each at most: every record once, in order."""
    position, answers = 0, 0
    while position < RECORDS:
        ((_, _, records),) = kafka_fetch(cluster, varied_files, {0: position},
                                         partition_max_bytes=12_000, max_bytes=cfg.FETCH_MAX_BYTES)
        assert len(records) <= 12_000
        offsets = offsets_of(records)
        assert offsets == list(range(position, position + len(offsets)))
        position += len(offsets)
        answers += 1
    value_bytes = FILES // 2 * sum(len(v) for values in FILE_VALUES for v in values)
    assert answers >= value_bytes // 12_000


def kafka_python_offsets(cluster, topic: str, count: int, **limits: int) -> dict[int, list[int]]:
    """The offsets kafka-python reads from the beginning of each partition, `count` a partition
    (or what it has read when nothing comes for 10 s)."""
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers,
                             enable_auto_commit=False, consumer_timeout_ms=10_000, **limits)
    got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        for record in consumer:
            if len(got[record.partition]) < count:
                got[record.partition].append(record.offset)
            if sum(map(len, got.values())) == PARTITIONS * count:
                break
    finally:
        consumer.close()
    return got


def test_kafka_python_reads_every_record_with_default_limits(cluster, varied_files):
    got = kafka_python_offsets(cluster, varied_files, RECORDS)
    assert got == {p: list(range(RECORDS)) for p in range(PARTITIONS)}


def test_kafka_python_progresses_past_records_over_its_fetch_limits(cluster, varied_files):
    # 9,000-byte records against 5,000 bytes a partition: each comes alone, as Kafka sends it.
    count = 5 * 101
    got = kafka_python_offsets(cluster, varied_files, count, max_partition_fetch_bytes=5_000,
                               fetch_max_bytes=20_000)
    assert got == {p: list(range(count)) for p in range(PARTITIONS)}


def test_librdkafka_reads_every_record_with_default_limits(cluster, varied_files):
    consumer = LibrdkafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                                   "group.id": "fetch-limits", "enable.auto.commit": False})
    got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([LibrdkafkaTopicPartition(varied_files, p, 0)
                         for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < PARTITIONS * RECORDS and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                assert message.error() is None, message.error()
                got[message.partition()].append(message.offset())
    finally:
        consumer.close()
    assert got == {p: list(range(RECORDS)) for p in range(PARTITIONS)}
