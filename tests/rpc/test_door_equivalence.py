"""Both doors answer a request the same: the same principal sending the same operation through
the gRPC door and through the Kafka door gets the same outcome for each partition (allowed, or
the same error code and message). The doors are codecs around one request layer
(deltabus/rpc/request_layer.py); each operation it serves has its cases here.

In-memory brokers behind both real doors (no Spark), users authenticated on each (SASL PLAIN on
the Kafka door, HTTP Basic on the gRPC door), raw Kafka frames so no client library rewrites a
request or its answer."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema

from deltabus import config as cfg
from deltabus import errors
from deltabus.rpc.kafka.frames import make, nested
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.acls import (
    AclBinding,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from deltabus.security.scram import make_credential
from tests.client.fake_cluster import FakeCluster
from tests.kafka.raw_frames import connect_to, frame, read_response

PRODUCE, DELETE_RECORDS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 21, 17, 36
PASSWORDS = {"alice": "alice-secret", "carol": "carol-secret", "bob": "bob-secret"}
CREDENTIALS = {(u, m): make_credential(m, p) for u, p in PASSWORDS.items()
               for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
TOPIC, PARTITIONS = "orders", (0, 1)
TXN_ID, PRODUCER_ID = "orders-tx", 1000

Outcome = dict[int, tuple[int, str]]  # partition -> (error code, error message)


def _allow(resource: ResourceType, name: str, user: str, *ops: Operation) -> list[AclBinding]:
    return [AclBinding(resource, name, PatternType.LITERAL, f"User:{user}", "*", op,
                       Permission.ALLOW) for op in ops]


ACLS = [*_allow(ResourceType.TOPIC, TOPIC, "alice", Operation.WRITE, Operation.DELETE,
               Operation.READ),
        *_allow(ResourceType.TOPIC, "*", "alice", Operation.DESCRIBE),
        *_allow(ResourceType.TRANSACTIONAL_ID, TXN_ID, "alice", Operation.WRITE),
        *_allow(ResourceType.TOPIC, TOPIC, "carol", Operation.WRITE)]


class Doors:
    """One operation sent through each door as one user."""

    def __init__(self, fake: FakeCluster, kafka_address: str) -> None:
        self.fake = fake
        self.kafka_address = kafka_address

    def grpc(self, user: str, method: str, request: Any, timeout_s: float = 30) -> Any:
        token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
        with grpc.insecure_channel(self.fake.bootstrap_servers) as channel:
            call = getattr(pb_grpc.DeltaBusStub(channel), method)
            return call(request, timeout=timeout_s,
                        metadata=(("authorization", f"Basic {token}"),))

    def kafka(self, user: str, key: int, version: int, body: Any) -> Any:
        with connect_to(self.kafka_address, timeout_s=30) as sock:
            self._authenticate(sock, user)
            sock.sendall(frame(key, version, body, correlation_id=3))
            return read_response(sock, key, version)[1]

    @staticmethod
    def _authenticate(sock: socket.socket, user: str) -> None:
        hello = load_request_schema(SASL_HANDSHAKE, 1)
        sock.sendall(frame(SASL_HANDSHAKE, 1, make(hello, mechanism="PLAIN"), 1))
        assert read_response(sock, SASL_HANDSHAKE, 1)[1].error_code.value == 0
        token = f"\0{user}\0{PASSWORDS[user]}".encode()
        auth = load_request_schema(SASL_AUTHENTICATE, 2)
        sock.sendall(frame(SASL_AUTHENTICATE, 2, make(auth, auth_bytes=token), 2))
        assert read_response(sock, SASL_AUTHENTICATE, 2)[1].error_code.value == 0


@pytest.fixture(scope="module")
def doors() -> Iterator[Doors]:
    security = cfg.ListenerSecurity(security_protocol="SASL_PLAINTEXT")
    fake = FakeCluster(brokers=1, security=security,
                       credentials=lambda user, mechanism: CREDENTIALS.get((user, mechanism)))
    fake.create_topic(TOPIC, len(PARTITIONS))
    fake.authorizer = Authorizer(ACLS)
    address = fake.serve_kafka(0, security=security, credentials=lambda user, mechanism:
                               CREDENTIALS.get((user, mechanism)))
    yield Doors(fake, address)
    fake.close()


# ---- Produce ---------------------------------------------------------------------------------

def _kafka_records(transactional: bool) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=transactional,
        producer_id=PRODUCER_ID if transactional else -1,
        producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=None, value=b"v", headers=[])
    return bytes(builder.build())


def _produce_both(doors: Doors, user: str, acks: int = 1,
                  transactional: bool = False) -> tuple[Outcome, Outcome]:
    cls = load_request_schema(PRODUCE, 9)
    kafka = doors.kafka(user, PRODUCE, 9, make(
        cls, transactional_id=TXN_ID if transactional else None, acks=acks,
        timeout=timedelta(seconds=30), topic_data=(nested(cls, "TopicProduceData")(
            name=TOPIC, partition_data=tuple(
                nested(cls, "PartitionProduceData")(index=p, records=_kafka_records(
                    transactional)) for p in PARTITIONS)),)))
    kafka_outcome = {p.index: (p.error_code.value, p.error_message or "")
                     for t in kafka.responses for p in t.partition_responses}
    producer = (dict(producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=0)
                if transactional else {})
    request = pb.ProduceRequest(acks=acks, partitions=[pb.PartitionProduceData(
        topic=TOPIC, partition=p, records=[pb.Record(value=b"v")], **producer)
        for p in PARTITIONS])
    if transactional:
        request.transactional_id = TXN_ID
    try:
        answer = doors.grpc(user, "Produce", request)
        grpc_outcome = {p.partition: (p.error_code, p.error_message) for p in answer.partitions}
    except grpc.RpcError as e:  # the whole request refused: every partition says so
        error = error_from_rpc(e)
        grpc_outcome = {p: (error.code, error.message) for p in PARTITIONS}
    return kafka_outcome, grpc_outcome


def test_produce_allowed_and_refused_alike(doors: Doors) -> None:
    kafka, through_grpc = _produce_both(doors, "alice")
    assert kafka == through_grpc == {p: (0, "") for p in PARTITIONS}
    kafka, through_grpc = _produce_both(doors, "bob")
    assert kafka == through_grpc
    assert {code for code, _ in kafka.values()} == {errors.TopicAuthorizationFailedError.code}


def test_acks_outside_0_1_and_all_are_refused_in_the_same_words(doors: Doors) -> None:
    kafka, through_grpc = _produce_both(doors, "alice", acks=2)
    assert kafka == through_grpc == {p: (errors.InvalidRequiredAcksError.code,
                                         "acks must be 0, 1 or -1 (all), not 2")
                                     for p in PARTITIONS}


@pytest.mark.parametrize("user", ["carol", "bob"])
def test_a_transaction_without_write_on_its_id_is_refused_whole_before_anything_else(
        doors: Doors, user: str) -> None:
    """As Kafka: WRITE on the transactional id, checked once for the request before the
    topics and producer ids, and its refusal answers every partition (carol may write the
    topic, bob may not: both hear about the transactional id)."""
    before = [doors.fake.values(TOPIC, p) for p in PARTITIONS]
    kafka, through_grpc = _produce_both(doors, user, transactional=True)
    assert kafka == through_grpc
    assert {code for code, _ in kafka.values()} == {
        errors.TransactionalIdAuthorizationFailedError.code}
    assert [doors.fake.values(TOPIC, p) for p in PARTITIONS] == before  # nothing written


# ---- DeleteRecords ---------------------------------------------------------------------------

def _delete_both(doors: Doors, user: str, offsets: dict[int, int],
                 timeout_ms: int) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """Each door's (error code, low watermark) per partition, deleting below `offsets`."""
    answers = []
    for door in ("kafka", "grpc"):
        if door == "kafka":
            cls = load_request_schema(DELETE_RECORDS, 2)
            kafka = doors.kafka(user, DELETE_RECORDS, 2, make(
                cls, timeout=timedelta(milliseconds=timeout_ms), topics=(
                    nested(cls, "DeleteRecordsTopic")(name=TOPIC, partitions=tuple(
                        nested(cls, "DeleteRecordsPartition")(partition_index=p, offset=o)
                        for p, o in offsets.items())),)))
            answers.append({p.partition_index: (p.error_code.value, p.low_watermark)
                            for t in kafka.topics for p in t.partitions})
        else:  # a deadline short of the 30 s the gRPC door once waited for a timeout of 0
            answer = doors.grpc(user, "DeleteRecords", pb.DeleteRecordsRequest(
                timeout_ms=timeout_ms, partitions=[pb.DeleteRecordsPartition(
                    topic=TOPIC, partition=p, offset=o) for p, o in offsets.items()]),
                timeout_s=20)
            answers.append({p.partition: (p.error_code, p.low_watermark)
                            for p in answer.partitions})
    return answers[0], answers[1]


def test_delete_records_allowed_refused_and_out_of_range_alike(doors: Doors) -> None:
    for _ in range(3):
        _produce_both(doors, "alice")  # two records a partition each time
    kafka, through_grpc = _delete_both(doors, "alice", {0: 1, 1: 2}, 30_000)
    assert kafka == {0: (0, 1), 1: (0, 2)}
    assert through_grpc == {0: (0, 1), 1: (0, 2)}  # asked again: the same low watermarks
    kafka, through_grpc = _delete_both(doors, "bob", {0: 2}, 30_000)
    assert kafka == through_grpc == {0: (errors.TopicAuthorizationFailedError.code, -1)}
    kafka, through_grpc = _delete_both(doors, "alice", {1: 1_000}, 30_000)
    assert kafka == through_grpc == {1: (errors.OffsetOutOfRangeError.code, -1)}


def test_delete_records_with_a_timeout_of_0_answers_at_once_through_both(doors: Doors) -> None:
    """As Kafka: 0 answers without waiting, REQUEST_TIMED_OUT where the ISR does not hold the
    new log start yet (here: held back), and the log start has moved all the same."""
    _produce_both(doors, "alice")
    with doors.fake.acks_held():
        kafka, through_grpc = _delete_both(doors, "alice", {0: 3}, 0)
    assert kafka == through_grpc == {0: (errors.RequestTimedOutError.code, -1)}
    kafka, through_grpc = _delete_both(doors, "alice", {0: 3}, 30_000)
    assert kafka == through_grpc == {0: (0, 3)}


# ---- ListOffsets, OffsetForLeaderEpoch -------------------------------------------------------

LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH = 2, 23


def _list_offsets_both(doors: Doors, user: str, asked: list[tuple[int, int]]
                       ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """Each door's (partition, error code, offset) per entry, in order, for `asked`
    (partition, timestamp) entries of the topic."""
    cls = load_request_schema(LIST_OFFSETS, 7)
    kafka = doors.kafka(user, LIST_OFFSETS, 7, make(
        cls, replica_id=-1, isolation_level=0, topics=(nested(cls, "ListOffsetsTopic")(
            name=TOPIC, partitions=tuple(nested(cls, "ListOffsetsPartition")(
                partition_index=p, current_leader_epoch=-1, timestamp=ts)
                for p, ts in asked)),)))
    through_grpc = doors.grpc(user, "ListOffsets", pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic=TOPIC, partition=p, timestamp=ts) for p, ts in asked]))
    return ([(p.partition_index, p.error_code.value, p.offset)
             for t in kafka.topics for p in t.partitions],
            [(p.partition, p.error_code, p.offset) for p in through_grpc.partitions])


def test_list_offsets_allowed_refused_and_named_twice_alike(doors: Doors) -> None:
    _produce_both(doors, "alice")
    kafka, through_grpc = _list_offsets_both(doors, "alice", [(0, -1), (1, -2)])
    assert kafka == through_grpc
    assert [code for _, code, _ in kafka] == [0, 0] and kafka[0][2] > 0
    kafka, through_grpc = _list_offsets_both(doors, "bob", [(0, -1)])
    assert kafka == through_grpc == [(0, errors.TopicAuthorizationFailedError.code, -1)]
    kafka, through_grpc = _list_offsets_both(doors, "alice", [(0, -1), (0, -2), (9, -1)])
    assert kafka == through_grpc == [(0, errors.InvalidRequestError.code, -1),
                                     (0, errors.InvalidRequestError.code, -1),
                                     (9, errors.UnknownTopicOrPartitionError.code, -1)]


def test_offset_for_leader_epoch_alike(doors: Doors) -> None:
    _produce_both(doors, "alice")
    cls = load_request_schema(OFFSET_FOR_LEADER_EPOCH, 4)
    answers = []
    for user in ("alice", "bob"):
        kafka = doors.kafka(user, OFFSET_FOR_LEADER_EPOCH, 4, make(
            cls, replica_id=-1, topics=(nested(cls, "OffsetForLeaderTopic")(
                topic=TOPIC, partitions=(nested(cls, "OffsetForLeaderPartition")(
                    partition=0, current_leader_epoch=-1, leader_epoch=0),)),)))
        through_grpc = doors.grpc(user, "OffsetForLeaderEpoch", pb.OffsetForLeaderEpochRequest(
            partitions=[pb.OffsetForLeaderEpochPartition(topic=TOPIC, partition=0,
                                                         leader_epoch=0)]))
        answers.append(([(p.error_code.value, p.leader_epoch, p.end_offset)
                         for t in kafka.topics for p in t.partitions],
                        [(p.error_code, p.leader_epoch, p.end_offset)
                         for p in through_grpc.partitions]))
    (alice_kafka, alice_grpc), (bob_kafka, bob_grpc) = answers
    assert alice_kafka == alice_grpc and alice_kafka[0][0] == 0 and alice_kafka[0][2] > 0
    assert bob_kafka == bob_grpc == [(errors.TopicAuthorizationFailedError.code, -1, -1)]


# ---- Fetch -----------------------------------------------------------------------------------

FETCH = 1
FetchOutcome = list[tuple[int, int, int, list[int]]]  # partition, error, high watermark, offsets


def _fetch_both(doors: Doors, user: str, asked: list[tuple[int, int]],
                max_bytes: int = 1 << 20) -> tuple[FetchOutcome, FetchOutcome]:
    """Each door's answer per partition (sorted), fetching `asked` (partition, offset) pairs
    without waiting; a request refused whole answers every partition with its code."""
    cls = load_request_schema(FETCH, 12)
    kafka = doors.kafka(user, FETCH, 12, make(
        cls, replica_id=-1, max_wait=timedelta(0), min_bytes=0, max_bytes=max_bytes,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=(),
        topics=(nested(cls, "FetchTopic")(topic=TOPIC, partitions=tuple(
            nested(cls, "FetchPartition")(partition=p, current_leader_epoch=-1,
                                          fetch_offset=o, last_fetched_epoch=-1,
                                          log_start_offset=-1, partition_max_bytes=1 << 20)
            for p, o in asked)),)))
    through_kafka = sorted(
        (p.partition_index, p.error_code.value or kafka.error_code.value, p.high_watermark,
         [r.offset for batch in _batches(p.records) for r in batch])
        for t in kafka.responses for p in t.partitions)
    request = pb.FetchRequest(max_wait_ms=0, max_bytes=max_bytes, partitions=[
        pb.FetchPartition(topic=TOPIC, partition=p, fetch_offset=o) for p, o in asked])
    try:
        answer = doors.grpc(user, "Fetch", request)
        through_grpc = sorted((p.partition, p.error_code, p.high_watermark,
                               [r.offset for r in p.records]) for p in answer.partitions)
    except grpc.RpcError as e:
        code = error_from_rpc(e).code
        through_grpc = sorted((p, code, -1, []) for p, _ in asked)
    return through_kafka, through_grpc


def _batches(records: bytes | None) -> list[Any]:
    out, read = [], MemoryRecords(records or b"")
    while (batch := read.next_batch()) is not None:
        out.append(list(batch))
    return out


def test_fetch_allowed_and_refused_alike(doors: Doors) -> None:
    _produce_both(doors, "alice")
    starts = [offset for _, _, offset in
              _list_offsets_both(doors, "alice", [(0, -2), (1, -2)])[0]]
    kafka, through_grpc = _fetch_both(doors, "alice", [(0, starts[0]), (1, starts[1] + 1)])
    assert kafka == through_grpc
    assert [code for _, code, _, _ in kafka] == [0, 0]
    assert kafka[0][3] == list(range(starts[0], kafka[0][2])) and kafka[0][3]  # every record
    kafka, through_grpc = _fetch_both(doors, "bob", [(0, 0)])
    assert kafka == through_grpc == [(0, errors.TopicAuthorizationFailedError.code, -1, [])]
    kafka, through_grpc = _fetch_both(doors, "alice", [(0, 1_000_000), (9, 0)])
    assert kafka == through_grpc
    assert [(p, code, offsets) for p, code, _, offsets in kafka] == [
        (0, errors.OffsetOutOfRangeError.code, []),
        (9, errors.UnknownTopicOrPartitionError.code, [])]


@pytest.mark.parametrize("asked, max_bytes, code", [
    ([(0, 0), (0, 1)], 1 << 20, errors.InvalidRequestError.code),  # a partition twice
    ([(0, 0)], -1, errors.InvalidFetchSizeError.code),
])
def test_a_fetch_refused_whole_is_refused_alike(doors: Doors, asked: list[tuple[int, int]],
                                                max_bytes: int, code: int) -> None:
    kafka, through_grpc = _fetch_both(doors, "alice", asked, max_bytes)
    assert kafka == through_grpc == sorted((p, code, -1, []) for p, _ in asked)


# ---- Metadata --------------------------------------------------------------------------------

METADATA = 3


Topics = list[tuple[str, int]]  # topic, error code


def _metadata_both(doors: Doors, user: str, names: list[str] | None,
                   auto_create: bool = False) -> tuple[Topics, Topics]:
    """Each door's (topic, error code) entries, sorted, for a Metadata naming `names` (None:
    every topic)."""
    cls = load_request_schema(METADATA, 12)
    kafka = doors.kafka(user, METADATA, 12, make(
        cls, allow_auto_topic_creation=auto_create, include_topic_authorized_operations=False,
        topics=None if names is None else tuple(
            nested(cls, "MetadataRequestTopic")(topic_id=None, name=n) for n in names)))
    through_grpc = doors.grpc(user, "Metadata", pb.MetadataRequest(
        topics=names or [], allow_auto_topic_creation=auto_create))
    return (sorted((t.name, t.error_code.value) for t in kafka.topics),
            sorted((t.name, t.error_code) for t in through_grpc.topics))


def test_metadata_shows_and_refuses_alike(doors: Doors) -> None:
    kafka, through_grpc = _metadata_both(doors, "alice", None)
    assert kafka == through_grpc == [(TOPIC, 0)]
    kafka, through_grpc = _metadata_both(doors, "bob", None)
    assert kafka == through_grpc == []  # a listing shows only what the caller may describe
    kafka, through_grpc = _metadata_both(doors, "bob", [TOPIC])
    assert kafka == through_grpc == [(TOPIC, errors.TopicAuthorizationFailedError.code)]
    kafka, through_grpc = _metadata_both(doors, "alice", ["no such", "missing"],
                                         auto_create=True)
    assert kafka == through_grpc == [  # alice may describe any topic but create none
        ("missing", errors.UnknownTopicOrPartitionError.code),
        ("no such", errors.InvalidTopicError.code)]
