"""What one produce batch may be, on the gRPC door: max.message.bytes limits the whole batch,
measured as one uncompressed record batch of its records, as Kafka's broker checks it. A refused
batch is answered with Kafka's error and a message naming the limit and its value, nothing of it
is written, and the broker serves the next request. No Spark: the real gRPC server in front of
in-memory brokers (tests/client/fake_cluster.py), which apply the partition log's rules."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest

from deltabus import config as cfg
from deltabus import errors
from deltabus.records import to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.client.fake_cluster import FakeCluster

TOPIC = "t"
KIB = 1024
DEFAULT_LIMIT = f"max.message.bytes={cfg.MESSAGE_MAX_BYTES}"


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster(brokers=1)
    cluster.create_topic(TOPIC, 1)  # max.message.bytes: Kafka's default, 1,048,588
    yield cluster
    cluster.close()


@pytest.fixture
def stub(fake: FakeCluster) -> Iterator[pb_grpc.DeltaBusStub]:
    with grpc.insecure_channel(fake.bootstrap_servers, options=[
            ("grpc.max_send_message_length", cfg.REQUEST_MAX_BYTES)]) as channel:
        yield pb_grpc.DeltaBusStub(channel)


def produce(stub: pb_grpc.DeltaBusStub, data: pb.PartitionProduceData
            ) -> pb.PartitionProduceResponse:
    (answer,) = stub.Produce(pb.ProduceRequest(acks=pb.ACKS_LEADER, partitions=[data]),
                             timeout=60).partitions
    return answer


def arrow(table: pa.Table) -> pb.PartitionProduceData:
    return pb.PartitionProduceData(topic=TOPIC, partition=0, arrow_records=to_ipc(table))


def values(*sizes: int) -> pa.Table:
    return pa.table({"value": pa.array([b"v" * n for n in sizes], pa.binary())})


def assert_refused(answer: pb.PartitionProduceResponse, error: type[errors.DeltaBusError],
                   *named: str) -> None:
    assert (answer.error_code, answer.base_offset) == (error.code, -1), answer.error_message
    for text in named:
        assert text in answer.error_message


def test_a_value_of_1_mib_and_1_byte_is_over_the_default_max_message_bytes(
        stub, fake) -> None:
    """Kafka counts the batch: its 61-byte header and the record's own fields come on top of
    the value, so the largest value the default admits is below 1,048,588 bytes."""
    answer = produce(stub, arrow(values(1024 * KIB + 1)))
    assert_refused(answer, errors.MessageTooLargeError, f"{TOPIC}-0", DEFAULT_LIMIT)
    answer = produce(stub, pb.PartitionProduceData(topic=TOPIC, partition=0, records=[
        pb.Record(value=b"v" * (1024 * KIB + 1))]))
    assert_refused(answer, errors.MessageTooLargeError, DEFAULT_LIMIT)
    assert fake.values(TOPIC, 0) == []
    assert produce(stub, arrow(values(1024 * KIB - 100))).error_code == 0


def test_three_records_of_600_kib_in_one_batch_are_refused_as_one_batch(stub, fake) -> None:
    answer = produce(stub, arrow(values(600 * KIB, 600 * KIB, 600 * KIB)))
    assert_refused(answer, errors.MessageTooLargeError, DEFAULT_LIMIT)
    assert fake.values(TOPIC, 0) == []
    # The same records, one batch each, are within the limit.
    for _ in range(3):
        assert produce(stub, arrow(values(600 * KIB))).error_code == 0
    assert [len(v or b"") for v in fake.values(TOPIC, 0)] == [600 * KIB] * 3
