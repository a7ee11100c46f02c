"""What one produce batch may be, on the gRPC door: max.message.bytes limits the whole batch,
measured as one uncompressed record batch of its records, as Kafka's broker checks it. A refused
batch is answered with Kafka's error and a message naming the limit and its value, nothing of it
is written, and the broker serves the next request. No Spark: the real gRPC server in front of
in-memory brokers (tests/client/fake_cluster.py), which apply the partition log's rules."""

from __future__ import annotations

import resource
import struct
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest

from deltabus import config as cfg
from deltabus import errors
from deltabus.records import HEADERS_TYPE, to_ipc
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


# ---- what an Arrow batch declares and what it unpacks to -----------------------------------

MIB = 1024 * KIB


def ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def raw(data: bytes) -> pb.PartitionProduceData:
    return pb.PartitionProduceData(topic=TOPIC, partition=0, arrow_records=data)


def null_rows(count: int) -> bytes:
    """An Arrow batch whose value column is of type null: `count` rows in about 200 bytes."""
    return ipc(pa.table({"value": pa.nulls(count, pa.null())}))


def max_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_a_billion_declared_rows_are_refused_before_anything_is_allocated_for_them(
        stub, fake) -> None:
    """224 bytes declaring 10^9 rows: normalising them took about 20 GB."""
    data = null_rows(10**9)
    assert len(data) < 300
    before = max_rss_kib()
    answer = produce(stub, raw(data))
    assert_refused(answer, errors.RecordListTooLargeError, str(cfg.PRODUCE_BATCH_RECORDS_MAX))
    assert max_rss_kib() - before < 200 * 1024  # this process serves the gRPC door
    assert fake.values(TOPIC, 0) == []
    assert produce(stub, arrow(values(10))).error_code == 0


def test_rows_count_against_the_limits_whatever_their_columns_hold(stub, fake) -> None:
    """Null rows are not free: each is a record of at least 7 bytes in the batch."""
    answer = produce(stub, raw(null_rows(2 * cfg.PRODUCE_BATCH_RECORDS_MAX)))
    assert_refused(answer, errors.RecordListTooLargeError, str(cfg.PRODUCE_BATCH_RECORDS_MAX))
    answer = produce(stub, raw(null_rows(200_000)))  # 61 + 7 * 200,000 bytes at least
    assert_refused(answer, errors.MessageTooLargeError, "at least 1400061 bytes", DEFAULT_LIMIT)
    assert fake.values(TOPIC, 0) == []
    assert produce(stub, raw(null_rows(1000))).error_code == 0


def test_compressed_arrow_buffers_unpacking_past_the_request_limit_are_refused(
        stub, fake) -> None:
    """101 MiB of zeros in a few KiB of zstd: refused before the buffers are unpacked."""
    bomb = ipc(values(*[MIB] * 101), "zstd")
    assert len(bomb) < 100 * KIB
    answer = produce(stub, raw(bomb))
    assert_refused(answer, errors.RecordListTooLargeError, str(cfg.PRODUCE_UNPACKED_BYTES_MAX))
    assert fake.values(TOPIC, 0) == []
    assert produce(stub, raw(ipc(values(100, 200), "lz4"))).error_code == 0
    assert fake.values(TOPIC, 0) == [b"v" * 100, b"v" * 200]


def test_an_arrow_batch_with_forged_offsets_is_a_corrupt_message(stub, fake) -> None:
    """Offsets pointing past the data would make later kernels read outside the buffers."""
    data = bytearray(ipc(values(*[1] * 10)))
    honest = struct.pack("<i", 10)  # the last value offset: 10 bytes of values in all
    at = data.rindex(honest)
    data[at:at + 4] = struct.pack("<i", 10**9)
    answer = produce(stub, raw(bytes(data)))
    assert_refused(answer, errors.CorruptMessageError)
    assert fake.values(TOPIC, 0) == []


def test_a_record_with_more_headers_than_the_limit_is_an_invalid_record(stub, fake) -> None:
    many = [{"key": "h", "value": None}] * (cfg.RECORD_HEADERS_MAX + 1)
    table = pa.table({"value": pa.array([b"v"], pa.binary()),
                      "headers": pa.array([many], HEADERS_TYPE)})
    assert_refused(produce(stub, arrow(table)), errors.InvalidRecordError,
                   str(cfg.RECORD_HEADERS_MAX))
    answer = produce(stub, pb.PartitionProduceData(topic=TOPIC, partition=0, records=[
        pb.Record(value=b"v", headers=[pb.Header(key="h")] * (cfg.RECORD_HEADERS_MAX + 1))]))
    assert_refused(answer, errors.InvalidRecordError, str(cfg.RECORD_HEADERS_MAX))
    assert fake.values(TOPIC, 0) == []
    table = pa.table({"value": pa.array([b"v"], pa.binary()),
                      "headers": pa.array([many[1:]], HEADERS_TYPE)})
    assert produce(stub, arrow(table)).error_code == 0
