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
from pathlib import Path
from typing import Any

import grpc
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema

from deltabus import config as cfg
from deltabus import errors
from deltabus.rpc.kafka.apis import SUPPORTED
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
        *[AclBinding(ResourceType.GROUP, "pay", PatternType.PREFIXED, "User:alice", "*", op,
                     Permission.ALLOW) for op in (Operation.READ, Operation.DELETE)],
        *[AclBinding(ResourceType.TOPIC, "adm-", PatternType.PREFIXED, "User:alice", "*", op,
                     Permission.ALLOW)
          for op in (Operation.CREATE, Operation.DELETE, Operation.ALTER,
                     Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS)],
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
    fake = FakeCluster(brokers=1, security=security, share_groups=True,
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


# ---- Transactions ----------------------------------------------------------------------------
# The fake cluster's server is a broker, not the transaction coordinator: an allowed call gets
# NOT_COORDINATOR through both doors, a refused one its refusal first.

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 22, 24, 25, 26
TXN_OFFSET_COMMIT, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 28, 65, 66
TXN = dict(transactional_id=TXN_ID, producer_id=PRODUCER_ID, producer_epoch=0)


def _init_both(doors: Doors, user: str, transactional: bool) -> tuple[int, int]:
    cls = load_request_schema(INIT_PRODUCER_ID, 4)
    kafka = doors.kafka(user, INIT_PRODUCER_ID, 4, make(
        cls, transactional_id=TXN_ID if transactional else None,
        transaction_timeout=timedelta(seconds=60), producer_id=-1, producer_epoch=-1))
    request = pb.InitProducerIdRequest()
    if transactional:
        request.transactional_id, request.transaction_timeout_ms = TXN_ID, 60_000
    try:
        code = doors.grpc(user, "InitProducerId", request).error_code
    except grpc.RpcError as e:
        code = error_from_rpc(e).code
    return kafka.error_code.value, code


@pytest.mark.parametrize("user, transactional, code", [
    ("alice", False, 0),
    ("bob", False, errors.ClusterAuthorizationFailedError.code),
    ("alice", True, errors.NotCoordinatorError.code),
    ("bob", True, errors.TransactionalIdAuthorizationFailedError.code),
])
def test_init_producer_id_alike(doors: Doors, user: str, transactional: bool,
                                code: int) -> None:
    assert _init_both(doors, user, transactional) == (code, code)


def _add_partitions_both(doors: Doors, user: str, topics: list[str]) -> tuple[Outcomes, Outcomes]:
    cls = load_request_schema(ADD_PARTITIONS_TO_TXN, 3)
    kafka = doors.kafka(user, ADD_PARTITIONS_TO_TXN, 3, make(
        cls, v3_and_below_transactional_id=TXN_ID, v3_and_below_producer_id=PRODUCER_ID,
        v3_and_below_producer_epoch=0, v3_and_below_topics=tuple(
            nested(cls, "AddPartitionsToTxnTopic")(name=t, partitions=(0,)) for t in topics)))
    through_grpc = doors.grpc(user, "AddPartitionsToTxn", pb.AddPartitionsToTxnRequest(
        topic_partitions=[pb.TopicPartitions(topic=t, partitions=[0]) for t in topics], **TXN))
    return (sorted((t.name, p.partition_error_code.value)
                   for t in kafka.results_by_topic_v3_and_below for p in t.results_by_partition),
            sorted((r.topic, r.error_code) for r in through_grpc.results))


Outcomes = list[tuple[str, int]]  # topic, error code


def test_add_partitions_to_txn_alike(doors: Doors) -> None:
    kafka, through_grpc = _add_partitions_both(doors, "alice", [TOPIC, "secret"])
    assert kafka == through_grpc == [(TOPIC, errors.OperationNotAttemptedError.code),
                                     ("secret", errors.TopicAuthorizationFailedError.code)]
    kafka, through_grpc = _add_partitions_both(doors, "alice", [TOPIC])
    assert kafka == through_grpc == [(TOPIC, errors.NotCoordinatorError.code)]
    kafka, through_grpc = _add_partitions_both(doors, "bob", [TOPIC, "secret"])
    assert kafka == through_grpc == [
        (t, errors.TransactionalIdAuthorizationFailedError.code) for t in (TOPIC, "secret")]


@pytest.mark.parametrize("user, group, code", [
    ("alice", "ledger", errors.GroupAuthorizationFailedError.code),  # alice may not READ it
    ("bob", "ledger", errors.TransactionalIdAuthorizationFailedError.code),
])
def test_add_offsets_and_txn_offset_commit_alike(doors: Doors, user: str, group: str,
                                                 code: int) -> None:
    cls = load_request_schema(ADD_OFFSETS_TO_TXN, 3)
    kafka = doors.kafka(user, ADD_OFFSETS_TO_TXN, 3, make(cls, group_id=group, **TXN))
    through_grpc = doors.grpc(user, "AddOffsetsToTxn",
                              pb.AddOffsetsToTxnRequest(group_id=group, **TXN))
    assert kafka.error_code.value == through_grpc.error_code == code
    cls = load_request_schema(TXN_OFFSET_COMMIT, 3)
    kafka = doors.kafka(user, TXN_OFFSET_COMMIT, 3, make(
        cls, group_id=group, generation_id=-1, member_id="", group_instance_id=None,
        topics=(nested(cls, "TxnOffsetCommitRequestTopic")(name=TOPIC, partitions=(
            nested(cls, "TxnOffsetCommitRequestPartition")(
                partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                committed_metadata=""),)),), **TXN))
    through_grpc = doors.grpc(user, "TxnOffsetCommit", pb.TxnOffsetCommitRequest(
        group_id=group, partitions=[pb.OffsetCommitPartition(
            topic=TOPIC, partition=0, committed_offset=1)], **TXN))
    assert ([p.error_code.value for t in kafka.topics for p in t.partitions]
            == [r.error_code for r in through_grpc.results] == [code])


@pytest.mark.parametrize("user, code", [
    ("alice", errors.NotCoordinatorError.code),
    ("bob", errors.TransactionalIdAuthorizationFailedError.code),
])
def test_end_txn_and_describe_transactions_alike(doors: Doors, user: str, code: int) -> None:
    cls = load_request_schema(END_TXN, 3)
    kafka = doors.kafka(user, END_TXN, 3, make(cls, committed=True, **TXN))
    through_grpc = doors.grpc(user, "EndTxn", pb.EndTxnRequest(committed=True, **TXN))
    assert kafka.error_code.value == through_grpc.error_code == code
    cls = load_request_schema(DESCRIBE_TRANSACTIONS, 0)
    kafka = doors.kafka(user, DESCRIBE_TRANSACTIONS, 0, make(cls, transactional_ids=(TXN_ID,)))
    through_grpc = doors.grpc(user, "DescribeTransactions",
                              pb.DescribeTransactionsRequest(transactional_ids=[TXN_ID]))
    assert ([t.error_code.value for t in kafka.transaction_states]
            == [t.error_code for t in through_grpc.transactions] == [code])
    cls = load_request_schema(LIST_TRANSACTIONS, 0)
    kafka = doors.kafka(user, LIST_TRANSACTIONS, 0, make(cls, state_filters=(),
                                                        producer_id_filters=()))
    through_grpc = doors.grpc(user, "ListTransactions", pb.ListTransactionsRequest())
    assert (kafka.error_code.value, list(kafka.transaction_states)) == (0, [])
    assert list(through_grpc.transactions) == []


# ---- Groups ----------------------------------------------------------------------------------
# alice may READ and DELETE the groups named pay*; bob no group. Broker 0 of the fake cluster
# is the group coordinator.

(FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH,
 LIST_GROUPS, DESCRIBE_GROUPS, DELETE_GROUPS) = 10, 11, 14, 12, 13, 8, 9, 16, 15, 42
GROUP_AUTH = errors.GroupAuthorizationFailedError.code
TOPIC_AUTH = errors.TopicAuthorizationFailedError.code


def _commit_both(doors: Doors, user: str, group: str, offset: int
                 ) -> tuple[Outcomes, Outcomes]:
    """Each door's (topic, error code) per partition committed: `offset` on orders-0 and on
    secret-0, as an admin commits (no member)."""
    topics = (TOPIC, "secret")
    cls = load_request_schema(OFFSET_COMMIT, 8)
    kafka = doors.kafka(user, OFFSET_COMMIT, 8, make(
        cls, group_id=group, generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, topics=tuple(nested(cls, "OffsetCommitRequestTopic")(
            name=t, partitions=(nested(cls, "OffsetCommitRequestPartition")(
                partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=""),)) for t in topics)))
    through_grpc = doors.grpc(user, "OffsetCommit", pb.OffsetCommitRequest(
        group_id=group, partitions=[pb.OffsetCommitPartition(
            topic=t, partition=0, committed_offset=offset) for t in topics]))
    return (sorted((t.name, p.error_code.value) for t in kafka.topics for p in t.partitions),
            sorted((r.topic, r.error_code) for r in through_grpc.results))


def _fetch_offsets_both(doors: Doors, user: str, group: str
                        ) -> tuple[tuple[int, list[tuple[str, int]]],
                                   tuple[int, list[tuple[str, int]]]]:
    """Each door's (whole-request error code, [(topic, offset)]) for orders-0 and secret-0."""
    cls = load_request_schema(OFFSET_FETCH, 7)
    kafka = doors.kafka(user, OFFSET_FETCH, 7, make(
        cls, group_id=group, require_stable=False, topics=tuple(
            nested(cls, "OffsetFetchRequestTopic")(name=t, partition_indexes=(0,))
            for t in (TOPIC, "secret"))))
    through_grpc = doors.grpc(user, "OffsetFetch", pb.OffsetFetchRequest(
        group_id=group, topic_partitions=[pb.TopicPartitions(topic=t, partitions=[0])
                                          for t in (TOPIC, "secret")]))
    return ((kafka.error_code.value, [] if kafka.error_code.value else sorted(
                (t.name, p.committed_offset) for t in kafka.topics for p in t.partitions)),
            (through_grpc.error_code, sorted((p.topic, p.committed_offset)
                                             for p in through_grpc.partitions)))


def test_offset_commit_and_fetch_alike(doors: Doors) -> None:
    kafka, through_grpc = _commit_both(doors, "alice", "payments", 5)
    assert kafka == through_grpc == [(TOPIC, 0), ("secret", TOPIC_AUTH)]  # READ on orders only
    kafka, through_grpc = _commit_both(doors, "bob", "payments", 6)
    assert kafka == through_grpc == [(TOPIC, GROUP_AUTH), ("secret", GROUP_AUTH)]
    kafka, through_grpc = _commit_both(doors, "alice", "other", 6)
    assert kafka == through_grpc == [(TOPIC, GROUP_AUTH), ("secret", GROUP_AUTH)]
    kafka, through_grpc = _fetch_offsets_both(doors, "alice", "payments")
    assert kafka == through_grpc == (0, [(TOPIC, 5), ("secret", -1)])
    kafka, through_grpc = _fetch_offsets_both(doors, "bob", "payments")
    assert kafka == through_grpc == (GROUP_AUTH, [])


def test_the_limits_of_a_commit_come_before_the_group_refusal_through_both(
        doors: Doors) -> None:
    """A refusal names the group in every partition's answer, so a group id past its limit is
    refused for that first, through both doors (what the gRPC door did, the Kafka door not)."""
    group = "pay" + "x" * cfg.GROUP_ID_LENGTH_MAX  # longer than group ids may be
    for user in ("alice", "bob"):
        kafka, through_grpc = _commit_both(doors, user, group, 1)
        assert kafka == through_grpc == [(t, errors.InvalidGroupIdError.code)
                                         for t in (TOPIC, "secret")]


def test_member_calls_alike(doors: Doors) -> None:
    """JoinGroup, SyncGroup, Heartbeat and LeaveGroup: refused for bob, and for alice the
    coordinator's answer to a member it does not know."""
    unknown = errors.UnknownMemberIdError.code
    for user, expected in (("bob", GROUP_AUTH), ("alice", unknown)):
        cls = load_request_schema(HEARTBEAT, 4)
        kafka = doors.kafka(user, HEARTBEAT, 4, make(
            cls, group_id="pay-members", generation_id=1, member_id="m-1",
            group_instance_id=None))
        through_grpc = doors.grpc(user, "Heartbeat", pb.HeartbeatRequest(
            group_id="pay-members", generation_id=1, member_id="m-1"))
        assert kafka.error_code.value == through_grpc.error_code == expected
        cls = load_request_schema(SYNC_GROUP, 5)
        kafka = doors.kafka(user, SYNC_GROUP, 5, make(
            cls, group_id="pay-members", generation_id=1, member_id="m-1",
            group_instance_id=None, protocol_type="consumer", protocol_name="range",
            assignments=()))
        through_grpc = doors.grpc(user, "SyncGroup", pb.SyncGroupRequest(
            group_id="pay-members", generation_id=1, member_id="m-1"))
        assert kafka.error_code.value == through_grpc.error_code == expected
        cls = load_request_schema(LEAVE_GROUP, 2)
        kafka = doors.kafka(user, LEAVE_GROUP, 2, make(cls, group_id="pay-members",
                                                      member_id="m-1"))
        through_grpc = doors.grpc(user, "LeaveGroup", pb.LeaveGroupRequest(
            group_id="pay-members", member_ids=["m-1"]))
        assert kafka.error_code.value == through_grpc.error_code == expected
    cls = load_request_schema(JOIN_GROUP, 7)
    kafka = doors.kafka("bob", JOIN_GROUP, 7, make(
        cls, group_id="pay-members", session_timeout=timedelta(seconds=10),
        rebalance_timeout=timedelta(seconds=10), member_id="m-1", group_instance_id=None,
        protocol_type="consumer", protocols=()))
    through_grpc = doors.grpc("bob", "JoinGroup", pb.JoinGroupRequest(
        group_id="pay-members", member_id="m-1", protocol_type="consumer",
        session_timeout_ms=10_000, rebalance_timeout_ms=10_000))
    assert kafka.error_code.value == through_grpc.error_code == GROUP_AUTH


def test_find_coordinator_alike(doors: Doors) -> None:
    for user, key, key_type, expected in (
            ("alice", "payments", 0, 0), ("bob", "payments", 0, GROUP_AUTH),
            ("bob", TXN_ID, 1, errors.TransactionalIdAuthorizationFailedError.code),
            ("alice", "payments", 5, errors.InvalidRequestError.code)):
        cls = load_request_schema(FIND_COORDINATOR, 3)
        kafka = doors.kafka(user, FIND_COORDINATOR, 3, make(cls, key=key, key_type=key_type))
        through_grpc = doors.grpc(user, "FindCoordinator", pb.FindCoordinatorRequest(
            key=key, key_type=key_type))
        assert kafka.error_code.value == through_grpc.error_code == expected, (user, key_type)


def test_list_describe_and_delete_groups_alike(doors: Doors) -> None:
    for group in ("pay-a", "pay-b"):
        _commit_both(doors, "alice", group, 1)
    answers = []
    for user in ("alice", "bob"):
        cls = load_request_schema(LIST_GROUPS, 4)
        kafka = doors.kafka(user, LIST_GROUPS, 4, make(cls, states_filter=()))
        through_grpc = doors.grpc(user, "ListGroups", pb.ListGroupsRequest())
        listed = ({g.group_id for g in kafka.groups} & {"pay-a", "pay-b"},
                  {g.group_id for g in through_grpc.groups} & {"pay-a", "pay-b"})
        cls = load_request_schema(DESCRIBE_GROUPS, 5)
        kafka = doors.kafka(user, DESCRIBE_GROUPS, 5, make(
            cls, groups=("pay-a",), include_authorized_operations=False))
        through_grpc = doors.grpc(user, "DescribeGroups",
                                  pb.DescribeGroupsRequest(group_ids=["pay-a"]))
        described = ([(g.error_code.value, g.group_state) for g in kafka.groups],
                     [(g.error_code, g.group_state) for g in through_grpc.groups])
        answers.append((listed, described))
    (alice_listed, alice_described), (bob_listed, bob_described) = answers
    assert alice_listed == ({"pay-a", "pay-b"}, {"pay-a", "pay-b"})
    assert bob_listed == (set(), set())
    assert alice_described == ([(0, "Empty")], [(0, "Empty")])
    assert bob_described == ([(GROUP_AUTH, "")], [(GROUP_AUTH, "")])
    cls = load_request_schema(DELETE_GROUPS, 2)
    for user, expected in (("bob", GROUP_AUTH), ("alice", 0)):
        kafka = doors.kafka(user, DELETE_GROUPS, 2, make(cls, groups_names=("pay-a",)))
        through_grpc = doors.grpc(user, "DeleteGroups",
                                  pb.DeleteGroupsRequest(group_ids=["pay-b"]))
        assert ([r.error_code.value for r in kafka.results]
                == [r.error_code for r in through_grpc.results] == [expected])


# ---- Share groups (KIP-932) ------------------------------------------------------------------
# alice may READ (so DESCRIBE) and DELETE the groups named pay*, and READ the topic; bob nothing.

SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79
DESCRIBE_SHARE_OFFSETS, ALTER_SHARE_OFFSETS, DELETE_SHARE_OFFSETS = 90, 91, 92


def _topic_id(doors: Doors) -> Any:
    import uuid

    return uuid.UUID(doors.fake.image().topics[TOPIC].topic_id)


def test_share_group_membership_alike(doors: Doors) -> None:
    """ShareGroupHeartbeat needs READ on the group; ShareGroupDescribe DESCRIBE on it."""
    for user, expected in (("bob", GROUP_AUTH), ("alice", 0)):
        cls = load_request_schema(SHARE_GROUP_HEARTBEAT, 1)
        kafka = doors.kafka(user, SHARE_GROUP_HEARTBEAT, 1, make(
            cls, group_id="pay-queue", member_id=f"{user}-kafka", member_epoch=0,
            rack_id=None, subscribed_topic_names=(TOPIC,)))
        through_grpc = doors.grpc(user, "ShareGroupHeartbeat", pb.ShareGroupHeartbeatRequest(
            group_id="pay-queue", member_id=f"{user}-grpc", member_epoch=0,
            subscribed_topic_names=pb.TopicNames(names=[TOPIC])))
        assert kafka.error_code.value == through_grpc.error_code == expected, user
        cls = load_request_schema(SHARE_GROUP_DESCRIBE, 1)
        kafka = doors.kafka(user, SHARE_GROUP_DESCRIBE, 1, make(
            cls, group_ids=("pay-queue",), include_authorized_operations=False))
        through_grpc = doors.grpc(user, "ShareGroupDescribe",
                                  pb.ShareGroupDescribeRequest(group_ids=["pay-queue"]))
        assert ([(g.error_code.value, len(g.members)) for g in kafka.groups]
                == [(g.error_code, len(g.members)) for g in through_grpc.groups]
                == [(expected, 2 if expected == 0 else 0)]), user


def test_share_fetch_and_acknowledge_alike(doors: Doors) -> None:
    """ShareFetch opens a session for alice (READ on group and topic) and is refused whole
    for bob; ShareAcknowledge cannot open a session (epoch 0) through either door."""
    for user, expected in (("bob", GROUP_AUTH), ("alice", 0)):
        cls = load_request_schema(SHARE_FETCH, 1)
        kafka = doors.kafka(user, SHARE_FETCH, 1, make(
            cls, group_id="pay-queue", member_id=f"{user}-kafka", share_session_epoch=0,
            max_wait=timedelta(0), min_bytes=1, max_bytes=1 << 20, max_records=10,
            batch_size=10, forgotten_topics_data=(), topics=(nested(cls, "FetchTopic")(
                topic_id=_topic_id(doors), partitions=tuple(
                    nested(cls, "FetchPartition")(partition_index=p, acknowledgement_batches=())
                    for p in PARTITIONS)),)))
        through_grpc = doors.grpc(user, "ShareFetch", pb.ShareFetchRequest(
            group_id="pay-queue", member_id=f"{user}-grpc", share_session_epoch=0,
            max_records=10, partitions=[pb.SharePartition(topic=TOPIC, partition=p)
                                        for p in PARTITIONS]))
        assert kafka.error_code.value == through_grpc.error_code == expected, user
        assert (sorted((p.partition_index, p.error_code.value) for t in kafka.responses
                       for p in t.partitions)
                == sorted((p.partition, p.error_code) for p in through_grpc.partitions))
        cls = load_request_schema(SHARE_ACKNOWLEDGE, 1)
        kafka = doors.kafka(user, SHARE_ACKNOWLEDGE, 1, make(
            cls, group_id="pay-queue", member_id=f"{user}-other", share_session_epoch=0,
            topics=()))
        through_grpc = doors.grpc(user, "ShareAcknowledge", pb.ShareAcknowledgeRequest(
            group_id="pay-queue", member_id=f"{user}-other", share_session_epoch=0))
        assert (kafka.error_code.value, kafka.error_message) == (
            through_grpc.error_code, through_grpc.error_message), user


def test_share_group_offsets_alike(doors: Doors) -> None:
    """Describe (DESCRIBE on the group), alter (READ) and delete (DELETE) a share group's
    offsets: bob is refused through both doors, alice's group starts over at offset 0."""
    for user, expected in (("bob", GROUP_AUTH), ("alice", 0)):
        group = f"pay-offsets-{user}"
        cls = load_request_schema(ALTER_SHARE_OFFSETS, 0)
        kafka = doors.kafka(user, ALTER_SHARE_OFFSETS, 0, make(cls, group_id=group, topics=(
            nested(cls, "AlterShareGroupOffsetsRequestTopic")(topic_name=TOPIC, partitions=(
                nested(cls, "AlterShareGroupOffsetsRequestPartition")(
                    partition_index=0, start_offset=0),)),)))
        through_grpc = doors.grpc(user, "AlterShareGroupOffsets",
                                  pb.AlterShareGroupOffsetsRequest(group_id=group, offsets=[
                                      pb.ShareGroupOffset(topic=TOPIC, partition=0,
                                                          start_offset=0)]))
        assert kafka.error_code.value == through_grpc.error_code == expected, user
        cls = load_request_schema(DESCRIBE_SHARE_OFFSETS, 1)
        kafka = doors.kafka(user, DESCRIBE_SHARE_OFFSETS, 1, make(cls, groups=(
            nested(cls, "DescribeShareGroupOffsetsRequestGroup")(group_id=group, topics=None),)))
        through_grpc = doors.grpc(user, "DescribeShareGroupOffsets",
                                  pb.DescribeShareGroupOffsetsRequest(group_id=group))
        assert ([(p.partition_index, p.start_offset) for g in kafka.groups for t in g.topics
                 for p in t.partitions]
                == [(o.partition, o.start_offset) for o in through_grpc.offsets]
                == ([(0, 0)] if expected == 0 else []))
        assert kafka.groups[0].error_code.value == through_grpc.error_code == expected
        deleted = _delete_share_offsets_both(doors, user, group)
        if expected == 0:  # the first door deleted the group's only state: it is gone
            assert deleted == (0, errors.GroupIdNotFoundError.code)
            assert _delete_share_offsets_both(doors, user, group) == (
                errors.GroupIdNotFoundError.code, errors.GroupIdNotFoundError.code)
        else:
            assert deleted == (GROUP_AUTH, GROUP_AUTH)


def _delete_share_offsets_both(doors: Doors, user: str, group: str) -> tuple[int, int]:
    cls = load_request_schema(DELETE_SHARE_OFFSETS, 0)
    kafka = doors.kafka(user, DELETE_SHARE_OFFSETS, 0, make(cls, group_id=group, topics=(
        nested(cls, "DeleteShareGroupOffsetsRequestTopic")(topic_name=TOPIC),)))
    through_grpc = doors.grpc(user, "DeleteShareGroupOffsets", pb.DeleteShareGroupOffsetsRequest(
        group_id=group, topics=[TOPIC]))
    return kafka.error_code.value, through_grpc.error_code


# ---- Topics and configs ----------------------------------------------------------------------
# alice may create, delete, alter and configure the topics named adm-*; bob nothing.

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4


def test_create_grow_and_delete_topics_alike(doors: Doors) -> None:
    cls = load_request_schema(CREATE_TOPICS, 5)
    for user, expected in (("bob", TOPIC_AUTH), ("alice", 0)):
        kafka = doors.kafka(user, CREATE_TOPICS, 5, make(
            cls, timeout=timedelta(seconds=30), validate_only=False, topics=(
                nested(cls, "CreatableTopic")(name="adm-k", num_partitions=1,
                                              replication_factor=1, assignments=(),
                                              configs=()),)))
        through_grpc = doors.grpc(user, "CreateTopics", pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name="adm-g", num_partitions=1, replication_factor=1)]))
        assert ([t.error_code.value for t in kafka.topics]
                == [t.error_code for t in through_grpc.topics] == [expected]), user
    cls = load_request_schema(CREATE_PARTITIONS, 3)
    for user, expected in (("bob", TOPIC_AUTH), ("alice", 0)):
        kafka = doors.kafka(user, CREATE_PARTITIONS, 3, make(
            cls, timeout=timedelta(seconds=30), validate_only=False, topics=(
                nested(cls, "CreatePartitionsTopic")(name="adm-k", count=2, assignments=None),)))
        through_grpc = doors.grpc(user, "CreatePartitions", pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name="adm-g", count=2)]))
        assert ([t.error_code.value for t in kafka.results]
                == [t.error_code for t in through_grpc.topics] == [expected]), user
    cls = load_request_schema(DELETE_TOPICS, 5)
    for user, expected in (("bob", TOPIC_AUTH), ("alice", 0)):
        kafka = doors.kafka(user, DELETE_TOPICS, 5, make(
            cls, timeout=timedelta(seconds=30), topic_names=("adm-k",)))
        through_grpc = doors.grpc(user, "DeleteTopics", pb.DeleteTopicsRequest(topics=["adm-g"]))
        assert ([t.error_code.value for t in kafka.responses]
                == [t.error_code for t in through_grpc.topics] == [expected]), user


def _describe_configs_both(doors: Doors, user: str, resources: list[tuple[int, str]]
                           ) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    cls = load_request_schema(DESCRIBE_CONFIGS, 4)
    kafka = doors.kafka(user, DESCRIBE_CONFIGS, 4, make(
        cls, include_synonyms=False, include_documentation=False, resources=tuple(
            nested(cls, "DescribeConfigsResource")(resource_type=t, resource_name=n,
                                                   configuration_keys=None)
            for t, n in resources)))
    through_grpc = doors.grpc(user, "DescribeConfigs", pb.DescribeConfigsRequest(resources=[
        pb.DescribeConfigsResource(resource_type=t, resource_name=n) for t, n in resources]))
    return ([(r.resource_type, r.resource_name, r.error_code.value) for r in kafka.results],
            [(r.resource_type, r.resource_name, r.error_code) for r in through_grpc.results])


def _alter_configs_both(doors: Doors, user: str,
                        resources: list[tuple[int, str, list[str]]]
                        ) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """Each door's (type, name, error code) for SETs of retention.ms on each resource's
    named keys."""
    cls = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    kafka = doors.kafka(user, INCREMENTAL_ALTER_CONFIGS, 1, make(
        cls, validate_only=False, resources=tuple(
            nested(cls, "AlterConfigsResource")(resource_type=t, resource_name=n, configs=tuple(
                nested(cls, "AlterableConfig")(name=k, config_operation=0, value="60000")
                for k in keys)) for t, n, keys in resources)))
    through_grpc = doors.grpc(user, "IncrementalAlterConfigs", pb.IncrementalAlterConfigsRequest(
        resources=[pb.AlterConfigsResource(resource_type=t, resource_name=n, configs=[
            pb.AlterableConfig(name=k, value="60000") for k in keys])
            for t, n, keys in resources]))
    return (sorted((r.resource_type, r.resource_name, r.error_code.value)
                   for r in kafka.responses),
            sorted((r.resource_type, r.resource_name, r.error_code)
                   for r in through_grpc.responses))


def test_describe_and_alter_configs_alike(doors: Doors) -> None:
    doors.fake.create_topic("adm-configs", 1)
    asked = [(TOPIC_RESOURCE, "adm-configs"), (TOPIC_RESOURCE, TOPIC),
             (TOPIC_RESOURCE, "adm-none"), (BROKER_RESOURCE, "0")]
    kafka, through_grpc = _describe_configs_both(doors, "alice", asked)
    assert kafka == through_grpc == [
        (TOPIC_RESOURCE, "adm-configs", 0), (TOPIC_RESOURCE, TOPIC, TOPIC_AUTH),
        (TOPIC_RESOURCE, "adm-none", errors.UnknownTopicOrPartitionError.code),
        (BROKER_RESOURCE, "0", errors.InvalidRequestError.code)]
    retention = "retention.ms"
    kafka, through_grpc = _alter_configs_both(doors, "alice", [
        (TOPIC_RESOURCE, "adm-configs", [retention]), (TOPIC_RESOURCE, TOPIC, [retention]),
        (BROKER_RESOURCE, "0", [retention])])
    assert kafka == through_grpc == sorted([
        (TOPIC_RESOURCE, "adm-configs", 0), (TOPIC_RESOURCE, TOPIC, TOPIC_AUTH),
        (BROKER_RESOURCE, "0", errors.InvalidRequestError.code)])
    invalid = errors.InvalidRequestError.code  # a resource named twice, a key named twice
    kafka, through_grpc = _alter_configs_both(doors, "alice", [
        (TOPIC_RESOURCE, "adm-configs", [retention]), (TOPIC_RESOURCE, "adm-configs", []),
        (TOPIC_RESOURCE, "adm-other", [retention, retention])])
    assert kafka == through_grpc == [(TOPIC_RESOURCE, "adm-configs", invalid),
                                     (TOPIC_RESOURCE, "adm-other", invalid)]


# ---- Cluster-wide operations -----------------------------------------------------------------

CLUSTER_AUTH = errors.ClusterAuthorizationFailedError.code


def test_cluster_wide_operations_refused_alike(doors: Doors) -> None:
    """bob may do nothing on the cluster: each operation refuses him through both doors."""
    cls = load_request_schema(32 + 11, 2)  # ElectLeaders v2
    kafka = doors.kafka("bob", 43, 2, make(cls, election_type=0, timeout=timedelta(seconds=30),
                                          topic_partitions=None))
    through_grpc = _grpc_code(doors, "ElectLeaders", pb.ElectLeadersRequest())
    assert kafka.error_code.value == through_grpc == CLUSTER_AUTH
    cls = load_request_schema(29, 3)  # DescribeAcls v3
    kafka = doors.kafka("bob", 29, 3, make(
        cls, resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
        principal_filter=None, host_filter=None, operation=1, permission_type=1))
    through_grpc = doors.grpc("bob", "DescribeAcls", pb.DescribeAclsRequest())
    assert kafka.error_code.value == through_grpc.error_code == CLUSTER_AUTH
    cls = load_request_schema(50, 0)  # DescribeUserScramCredentials v0
    kafka = doors.kafka("bob", 50, 0, make(cls, users=None))
    through_grpc = _grpc_code(doors, "DescribeUserScramCredentials",
                              pb.DescribeUserScramCredentialsRequest())
    assert kafka.error_code.value == through_grpc == CLUSTER_AUTH
    cls = load_request_schema(48, 1)  # DescribeClientQuotas v1
    kafka = doors.kafka("bob", 48, 1, make(cls, components=(), strict=False))
    through_grpc = _grpc_code(doors, "DescribeClientQuotas", pb.DescribeClientQuotasRequest())
    assert kafka.error_code.value == through_grpc == CLUSTER_AUTH


def test_cluster_wide_changes_refused_alike(doors: Doors) -> None:
    """Reassignments, ACL changes and client quota changes need ALTER (quotas ALTER_CONFIGS)
    on the cluster: refused to bob through both doors, each entry with the refusal."""
    cls = load_request_schema(45, 0)  # AlterPartitionReassignments v0
    kafka = doors.kafka("bob", 45, 0, make(cls, timeout=timedelta(seconds=30), topics=()))
    through_grpc = _grpc_code(doors, "AlterPartitionReassignments",
                              pb.AlterPartitionReassignmentsRequest())
    assert kafka.error_code.value == through_grpc == CLUSTER_AUTH
    binding = dict(resource_type=2, resource_name=TOPIC, operation=3, permission_type=3)
    cls = load_request_schema(30, 3)  # CreateAcls v3
    kafka = doors.kafka("bob", 30, 3, make(cls, creations=(nested(cls, "AclCreation")(
        resource_pattern_type=3, principal="User:bob", host="*", **binding),)))
    through_grpc = doors.grpc("bob", "CreateAcls", pb.CreateAclsRequest(creations=[
        pb.AclBinding(pattern_type=3, principal="User:bob", host="*", **binding)]))
    assert ([r.error_code.value for r in kafka.results]
            == [r.error_code for r in through_grpc.results] == [CLUSTER_AUTH])
    cls = load_request_schema(31, 3)  # DeleteAcls v3
    kafka = doors.kafka("bob", 31, 3, make(cls, filters=(nested(cls, "DeleteAclsFilter")(
        resource_type_filter=2, resource_name_filter=TOPIC, pattern_type_filter=3,
        principal_filter=None, host_filter=None, operation=3, permission_type=3),)))
    through_grpc = doors.grpc("bob", "DeleteAcls", pb.DeleteAclsRequest(filters=[
        pb.AclBindingFilter(resource_type=2, resource_name=TOPIC, pattern_type=3,
                            operation=3, permission_type=3)]))
    assert ([r.error_code.value for r in kafka.filter_results]
            == [r.error_code for r in through_grpc.filter_results] == [CLUSTER_AUTH])


def test_credential_and_quota_changes_refused_alike(doors: Doors) -> None:
    cls = load_request_schema(51, 0)  # AlterUserScramCredentials v0
    kafka = doors.kafka("bob", 51, 0, make(cls, upsertions=(), deletions=(
        nested(cls, "ScramCredentialDeletion")(name="carol", mechanism=1),)))
    through_grpc = _grpc_code(doors, "AlterUserScramCredentials",
                              pb.AlterUserScramCredentialsRequest(deletions=[
                                  pb.ScramCredentialDeletion(name="carol", mechanism=1)]))
    assert [r.error_code.value for r in kafka.results] == [through_grpc] == [CLUSTER_AUTH]
    cls = load_request_schema(49, 1)  # AlterClientQuotas v1
    kafka = doors.kafka("bob", 49, 1, make(cls, validate_only=False, entries=(
        nested(cls, "EntryData")(
            entity=(nested(cls, "EntityData")(entity_type="user", entity_name="bob"),),
            ops=(nested(cls, "OpData")(key="producer_byte_rate", value=1024.0,
                                       remove=False),)),)))
    through_grpc = doors.grpc("bob", "AlterClientQuotas", pb.AlterClientQuotasRequest(entries=[
        pb.ClientQuotaAlteration(
            entity=[pb.ClientQuotaEntityPart(entity_type="user", entity_name="bob")],
            ops=[pb.ClientQuotaOp(key="producer_byte_rate", value=1024.0)])]))
    assert ([e.error_code.value for e in kafka.entries]
            == [e.error_code for e in through_grpc.entries] == [CLUSTER_AUTH])


def _grpc_code(doors: Doors, method: str, request: Any) -> int:
    """The error a gRPC call refused whole answers with (its status), or its response's."""
    try:
        return int(doors.grpc("bob", method, request).error_code)
    except grpc.RpcError as e:
        return error_from_rpc(e).code


# ---- Coverage --------------------------------------------------------------------------------

def test_every_operation_both_doors_serve_has_a_case_here() -> None:
    """An operation served by both doors (a gRPC method named as a Kafka API the Kafka door
    supports) is sent through both by some case above: a new shared operation without one
    fails here."""
    kafka = {load_request_schema(key, lo).__name__.removesuffix("Request")
             for key, (lo, _) in SUPPORTED.items()}
    grpc_methods = {m.name for m in pb.DESCRIPTOR.services_by_name["DeltaBus"].methods}
    shared = kafka & grpc_methods
    source = Path(__file__).read_text()
    missing = sorted(op for op in shared if f'"{op}"' not in source)
    assert len(shared) >= 30 and missing == []
