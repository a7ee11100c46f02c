"""Transactions on a partition, through the Kafka door of a real broker in this process (no
Spark; the controller is controller_server.py's): transactional batches are taken from a
producer with a transaction open on the partition and refused (INVALID_TXN_STATE) from one
without; markers written as the coordinator will write them (the broker's TxnMarkers API, with
the cluster's broker credential); kafka-python's read_committed consumer then never sees the
aborted records, sees the committed ones once, and never sees a marker; read_uncommitted sees
every record and no marker; before the markers, read_committed stops at the last stable offset
(Fetch and ListOffsets).

The coordinator (which records open transactions in the metadata) is not part of this branch:
the broker's metadata image is given the open transactions directly, as its record will."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema

from deltabus import Consumer
from deltabus import TopicPartition as DeltaBusPartition
from deltabus.cluster.broker import Broker
from deltabus.log_tables.control_records import TxnMarker
from deltabus.rpc.kafka.frames import make, nested
from deltabus.rpc.txn_markers import write_txn_markers
from tests.cluster.controller_server import ControllerServer, leading_broker
from tests.conftest import wait_until
from tests.kafka.raw_frames import FETCH, PRODUCE, call, connect_to, fetch, read_response

TOPIC = "txn"
ABORTED, COMMITTED, STRANGER = 1000, 1001, 999
LIST_OFFSETS = 2
INVALID_TXN_STATE = 48


@pytest.fixture
def door(tmp_path: Path) -> Iterator[tuple[ControllerServer, Broker, str]]:
    """Broker 0 leading TOPIC-0, its Kafka door's address."""
    server = ControllerServer(tmp_path, kafka_port=0)
    with leading_broker(server, (TOPIC,)) as broker:
        node = server.controller.image().broker(0)
        assert node is not None
        yield server, broker, f"{node.host}:{node.kafka_port}"


def produce(address: str, values: list[bytes], producer_id: int = -1,
            transactional_id: str | None = None) -> Any:
    """One Produce v9 of `values` in one batch; transactional with a producer id."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=producer_id >= 0,
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    cls = load_request_schema(PRODUCE, 9)
    data = nested(cls, "PartitionProduceData")(index=0, records=bytes(builder.build()))
    answer = call(address, PRODUCE, 9, make(
        cls, transactional_id=transactional_id, acks=-1, timeout=timedelta(seconds=30),
        topic_data=(nested(cls, "TopicProduceData")(name=TOPIC, partition_data=(data,)),)))
    return answer.responses[0].partition_responses[0]


def latest(address: str, isolation_level: int) -> int:
    cls = load_request_schema(LIST_OFFSETS, 5)
    answer = call(address, LIST_OFFSETS, 5, make(
        cls, replica_id=-1, isolation_level=isolation_level, topics=(
            nested(cls, "ListOffsetsTopic")(name=TOPIC, partitions=(
                nested(cls, "ListOffsetsPartition")(partition_index=0, current_leader_epoch=-1,
                                                    timestamp=-1),)),)))
    return answer.topics[0].partitions[0].offset


def consume(address: str, isolation_level: str, expected: int) -> tuple[list[bytes], int]:
    """Every value kafka-python's consumer reads from the start, and its position after."""
    consumer = KafkaConsumer(bootstrap_servers=address, isolation_level=isolation_level,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    partition = TopicPartition(TOPIC, 0)
    consumer.assign([partition])
    values: list[bytes] = []

    def more() -> bool:
        for records in consumer.poll(200).values():
            values.extend(r.value for r in records)
        return len(values) >= expected

    wait_until(more, f"{expected} records", 30)
    end = consumer.end_offsets([partition])[partition]
    wait_until(lambda: consumer.poll(100) == {} and consumer.position(partition) >= end,
               "the consumer to reach the end", 30)
    position = consumer.position(partition)
    consumer.close()
    return values, position


def test_read_committed_sees_committed_records_once_and_no_aborted_record_or_marker(door):
    server, broker, address = door
    # What the coordinator's AddPartitionsToTxn record will put in the broker's metadata.
    broker._publisher.apply(dataclasses.replace(broker._image, open_transactions={
        (TOPIC, 0): frozenset({ABORTED, COMMITTED})}))
    assert produce(address, [b"p0"]).base_offset == 0
    assert produce(address, [b"a0", b"a1"], ABORTED, "tx-a").base_offset == 1
    assert produce(address, [b"c0"], COMMITTED, "tx-c").base_offset == 3
    assert produce(address, [b"p1"]).base_offset == 4
    refused = produce(address, [b"s0"], STRANGER, "tx-s")
    assert refused.error_code == INVALID_TXN_STATE
    assert produce(address, [b"x"], ABORTED, None).error_code != 0  # no transactional id
    # Both transactions open: read_committed stops at the first one's first offset.
    assert (latest(address, 0), latest(address, 1)) == (5, 1)
    answer = fetch_answer(address, isolation_level=1)
    assert (answer.high_watermark, answer.last_stable_offset) == (5, 1)
    # The coordinator ends them: one aborted, one committed.
    leader = server.controller.image().broker(0).address
    outcome = write_txn_markers(leader, [TxnMarker(ABORTED, 0, False, 0, ((TOPIC, 0),)),
                                         TxnMarker(COMMITTED, 0, True, 0, ((TOPIC, 0),))],
                                timeout_ms=30_000, broker_secret=server.config.inter_broker_secret)
    assert set(outcome.values()) == {None}
    assert latest(address, 1) == latest(address, 0) == 7
    answer = fetch_answer(address, isolation_level=1)
    assert [(a.producer_id, a.first_offset) for a in answer.aborted_transactions] == [
        (ABORTED, 1)]
    assert consume(address, "read_committed", 3) == ([b"p0", b"c0", b"p1"], 7)
    assert consume(address, "read_uncommitted", 5) == ([b"p0", b"a0", b"a1", b"c0", b"p1"], 7)
    # deltabus's own consumer (gRPC): the same, and never a marker either.
    assert consume_grpc(server.address, "read_committed", 3) == ([b"p0", b"c0", b"p1"], 7)
    assert consume_grpc(server.address, "read_uncommitted", 5) == (
        [b"p0", b"a0", b"a1", b"c0", b"p1"], 7)


def consume_grpc(bootstrap: str, isolation_level: str, expected: int) -> tuple[list[bytes], int]:
    """Every value deltabus's Consumer reads from the start, and its position at the end."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation_level)
    partition = DeltaBusPartition(TOPIC, 0)
    consumer.assign([partition])
    values: list[bytes] = []

    def more() -> bool:
        values.extend(r.value for r in consumer.poll(200))
        return len(values) >= expected

    wait_until(more, f"{expected} records", 30)
    end = consumer.end_offsets([partition])[partition]
    wait_until(lambda: not consumer.poll(100) and consumer.position(partition) >= end,
               "the consumer to reach the end", 30)
    position = consumer.position(partition)
    consumer.close()
    return values, position


def fetch_answer(address: str, isolation_level: int) -> Any:
    """The partition's answer to a Fetch v12 from offset 0."""
    with connect_to(address, timeout_s=30) as sock:
        sock.sendall(fetch(TOPIC, 0, 0, isolation_level=isolation_level))
        _, answer = read_response(sock, FETCH, 12)
    return answer.responses[0].partitions[0]


def test_a_read_committed_long_poll_is_woken_by_the_commit_marker(door):
    server, broker, address = door
    broker._publisher.apply(dataclasses.replace(broker._image, open_transactions={
        (TOPIC, 0): frozenset({COMMITTED})}))
    assert produce(address, [b"c0"], COMMITTED, "tx-c").base_offset == 0
    with connect_to(address, timeout_s=60) as sock:
        sock.sendall(fetch(TOPIC, 0, 50_000, isolation_level=1))
        wait_until(lambda: broker.fetches_waiting() == 1, "the fetch to wait", 30)
        leader = server.controller.image().broker(0).address
        started = time.monotonic()
        assert write_txn_markers(
            leader, [TxnMarker(COMMITTED, 0, True, 0, ((TOPIC, 0),))], timeout_ms=30_000,
            broker_secret=server.config.inter_broker_secret) == {(COMMITTED, TOPIC, 0): None}
        _, answer = read_response(sock, FETCH, 12)
        assert time.monotonic() - started < 25  # woken, long before its 50 s max wait
    partition = answer.responses[0].partitions[0]
    assert partition.last_stable_offset == 2
    assert MemoryRecords(partition.records).next_batch().base_offset == 0
