"""A batch of an idempotent producer that arrives ahead of its predecessor: on the gRPC door,
whose calls are served concurrently, it waits for it at most until its produce request's
timeout (the broker's thread is not held for the partition log's whole sequence wait, 10 s by
default, whatever timeout the client asked for); on the Kafka door, which serves a
connection's requests in order, it is answered at once. Either way a gap is answered with
OUT_OF_ORDER_SEQUENCE_NUMBER, as Kafka's broker answers a sequence out of order, and nothing of
the batch is written.

A real broker runs in this process around a controller server (controller_server.py), with a
sequence wait far longer than any call of the test may take: an answer that comes back at all
came from the request's timeout, not from the sequence wait.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import NewTopic, errors
from deltabus.cluster.broker import Broker, BrokerSpec
from deltabus.metadata import BrokerEndpoint
from deltabus.records import to_ipc
from deltabus.rpc.kafka.apis import PRODUCE
from deltabus.rpc.kafka.frames import make, nested
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.cluster.controller_server import ControllerServer
from tests.conftest import wait_until
from tests.kafka.raw_frames import connect_to, frame, read_response

TOPIC = "orders"
SEQUENCE_WAIT_MS = 600_000  # ten minutes: no call below waits that long
CALL_TIMEOUT_S = 30  # the longest any call of the test may take
REQUEST_TIMEOUT_MS = 1_000
PRODUCE_VERSION = 9


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[BrokerEndpoint]:
    """Broker 0, the leader of the topic's one partition, as the metadata names it."""
    server = ControllerServer(tmp_path, kafka_port=0, sequence_wait_ms=SEQUENCE_WAIT_MS)
    broker = Broker(BrokerSpec(0, server.node, server.config))
    try:
        broker.start()
        wait_until(lambda: 0 in server.controller.live_brokers(), "broker 0 to be live", 30)
        server.controller.create_topics([NewTopic(TOPIC, replica_assignment={0: [0]})],
                                        timeout_ms=10_000)
        node = server.controller.image().broker(0)
        assert node is not None
        yield node
    finally:
        broker.close()
        server.stop()


@pytest.fixture
def stub(leader: BrokerEndpoint) -> Iterator[pb_grpc.DeltaBusStub]:
    with grpc.insecure_channel(leader.address) as channel:
        yield pb_grpc.DeltaBusStub(channel)


def init_producer_id(stub: pb_grpc.DeltaBusStub) -> tuple[int, int]:
    answer = stub.InitProducerId(pb.InitProducerIdRequest(), timeout=CALL_TIMEOUT_S)
    assert answer.error_code == 0, answer.error_message
    return answer.producer_id, answer.producer_epoch


def grpc_produce(stub: pb_grpc.DeltaBusStub, producer: tuple[int, int], base_sequence: int,
                 values: list[bytes], **request: int) -> pb.PartitionProduceResponse:
    data = pb.PartitionProduceData(
        topic=TOPIC, partition=0, arrow_records=to_ipc(pa.table({"value": values})),
        producer_id=producer[0], producer_epoch=producer[1], base_sequence=base_sequence)
    (answer,) = stub.Produce(pb.ProduceRequest(acks=pb.ACKS_LEADER, partitions=[data],
                                               **request), timeout=CALL_TIMEOUT_S).partitions
    return answer


def test_a_grpc_batch_ahead_of_its_sequence_is_answered_at_the_request_timeout(
        stub: pb_grpc.DeltaBusStub) -> None:
    producer = init_producer_id(stub)
    first = grpc_produce(stub, producer, 0, [b"a", b"b"], timeout_ms=REQUEST_TIMEOUT_MS)
    assert (first.error_code, first.base_offset) == (0, 0)

    # Sequences 2 to 4 never come: the batch at 5 waits for them until the request's timeout
    # (1 s), not the sequence wait (10 minutes), which would outlast the call's own deadline.
    gap = grpc_produce(stub, producer, 5, [b"late"], timeout_ms=REQUEST_TIMEOUT_MS)
    assert gap.error_code == errors.OutOfOrderSequenceNumberError.code, gap.error_message
    assert gap.base_offset == -1

    # Nothing of it was written, and the producer's next sequence goes on as usual.
    after = grpc_produce(stub, producer, 2, [b"c"], timeout_ms=REQUEST_TIMEOUT_MS)
    assert (after.error_code, after.base_offset) == (0, 2)


def kafka_batch(producer: tuple[int, int], base_sequence: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=producer[0],
        producer_epoch=producer[1], base_sequence=base_sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def kafka_produce_request(records: bytes, timeout_ms: int, correlation_id: int = 7) -> bytes:
    """One Produce (acks=1) of `records` to partition 0, framed."""
    cls = load_request_schema(PRODUCE, PRODUCE_VERSION)
    data = nested(cls, "PartitionProduceData")(index=0, records=records)
    return frame(PRODUCE, PRODUCE_VERSION, make(
        cls, transactional_id=None, acks=1, timeout=timedelta(milliseconds=timeout_ms),
        topic_data=(nested(cls, "TopicProduceData")(name=TOPIC, partition_data=(data,)),)),
        correlation_id)


def kafka_answer(sock: socket.socket) -> tuple[int, object]:
    """The next Produce answer on `sock`: (correlation id, its partition's answer)."""
    correlation_id, body = read_response(sock, PRODUCE, PRODUCE_VERSION)
    return correlation_id, body.responses[0].partition_responses[0]


def kafka_produce(sock: socket.socket, records: bytes, timeout_ms: int) -> object:
    """One Produce (acks=1) of `records` to partition 0; its partition's answer."""
    sock.sendall(kafka_produce_request(records, timeout_ms))
    return kafka_answer(sock)[1]


def test_a_kafka_batch_ahead_of_its_sequence_is_answered_at_once_and_its_predecessor_taken(
        leader: BrokerEndpoint, stub: pb_grpc.DeltaBusStub) -> None:
    """The Kafka door takes a connection's requests in order, so a batch's predecessor sent
    behind it on the same connection cannot arrive while it waits: as Kafka's broker, the door
    answers OUT_OF_ORDER_SEQUENCE_NUMBER at once (clients retry it while its predecessors are
    unacknowledged), and the predecessor behind it is taken. Waiting instead held the
    connection: in the diskless soak three of librdkafka's requests waited 10 s each in turn
    for one queued behind them, its request timed out, and it bumped its producer epoch,
    sending again records a killed leader had written but not acknowledged."""
    producer = init_producer_id(stub)
    with connect_to(f"{leader.host}:{leader.kafka_port}", timeout_s=CALL_TIMEOUT_S) as sock:
        first = kafka_produce(sock, kafka_batch(producer, 0, [b"a"]), SEQUENCE_WAIT_MS)
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        # pipelined: sequence 2 first, then its predecessor 1 behind it on the connection
        sock.sendall(kafka_produce_request(kafka_batch(producer, 2, [b"c"]), SEQUENCE_WAIT_MS,
                                           correlation_id=8)
                     + kafka_produce_request(kafka_batch(producer, 1, [b"b"]), SEQUENCE_WAIT_MS,
                                             correlation_id=9))
        gap_id, gap = kafka_answer(sock)
        after_id, after = kafka_answer(sock)
        assert (gap_id, gap.error_code) == (8, ErrorCode.out_of_order_sequence_number)
        assert (after_id, after.error_code, after.base_offset) == (9, ErrorCode.none, 1)
        retried = kafka_produce(sock, kafka_batch(producer, 2, [b"c"]), SEQUENCE_WAIT_MS)
        assert (retried.error_code, retried.base_offset) == (ErrorCode.none, 2)
