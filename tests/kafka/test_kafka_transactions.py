"""The transaction coordinator's Kafka door on a real cluster: raw Kafka frames (kio) where no
client would send a request out of order, kafka-python's admin client for ListTransactions and
DescribeTransactions. The tests check what the coordinator records and answers; where a state
between EndTxn and its markers is looked at, the leaders are kept from answering the markers
(tests/kafka/test_confluent_transactions.py has transactions with real markers and records)."""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kafka.admin import KafkaAdminClient
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic, errors
from deltabus.rpc.kafka.frames import make, nested
from tests.conftest import wait_until
from tests.kafka.raw_frames import connect_to, frame, read_response

FIND_COORDINATOR, INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN = 10, 22, 24, 25, 26
TXN_OFFSET_COMMIT, OFFSET_FETCH = 28, 9


def call(sock: socket.socket, api: int, version: int, **fields: Any) -> Any:
    sock.sendall(frame(api, version, make(load_request_schema(api, version), **fields)))
    return read_response(sock, api, version)[1]


def init(sock: socket.socket, txn_id: str, timeout_ms: int = 60_000, version: int = 4) -> Any:
    return call(sock, INIT_PRODUCER_ID, version, transactional_id=txn_id,
                transaction_timeout=timedelta(milliseconds=timeout_ms), producer_id=-1,
                producer_epoch=-1)


def add_partitions(sock: socket.socket, txn_id: str, pid: int, epoch: int, topic: str,
                   partitions: tuple[int, ...], version: int = 3) -> dict[int, ErrorCode]:
    cls = load_request_schema(ADD_PARTITIONS, version)
    body = call(sock, ADD_PARTITIONS, version, v3_and_below_transactional_id=txn_id,
                v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=(make(nested(cls, "AddPartitionsToTxnTopic"), name=topic,
                                          partitions=partitions),))
    return {p.partition_index: p.partition_error_code
            for t in body.results_by_topic_v3_and_below for p in t.results_by_partition}


def end_txn(sock: socket.socket, txn_id: str, pid: int, epoch: int, committed: bool) -> Any:
    return call(sock, END_TXN, 3, transactional_id=txn_id, producer_id=pid,
                producer_epoch=epoch, committed=committed).error_code


def describe(admin: KafkaAdminClient, txn_id: str) -> Any:
    return admin.describe_transactions([txn_id])[txn_id]


def test_a_transaction_is_coordinated_and_its_producer_fenced_over_kafkas_protocol(
        cluster, topic_name, monkeypatch) -> None:
    unanswered = errors.NotLeaderOrFollowerError("the leaders hold the markers back")
    monkeypatch.setattr(cluster.controller.markers, "send", lambda broker_id, markers: {
        (m.producer_id, t, p): unanswered for m in markers for t, p in m.partitions})
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 1)])
    broker = cluster.controller.image().broker(0)
    with socket.create_connection((broker.host, broker.kafka_port), timeout=30) as at_broker:
        found = call(at_broker, FIND_COORDINATOR, 3, key="txn-a", key_type=1)
        assert found.error_code == ErrorCode.none
        # Every broker passes the coordinator's requests on: the coordinator's answer.
        assert add_partitions(at_broker, "txn-a", 1, 0, topic_name, (0,)) == {
            0: ErrorCode.invalid_producer_id_mapping}
    kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    with connect_to(f"{found.host}:{found.port}") as sock:
        first = init(sock, "txn-a")
        assert (first.error_code, first.producer_epoch) == (ErrorCode.none, 0)
        pid = first.producer_id
        second = init(sock, "txn-a")
        assert (second.producer_id, second.producer_epoch) == (pid, 1)
        # The first producer is fenced: PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH to a
        # version from before KIP-588.
        assert add_partitions(sock, "txn-a", pid, 0, topic_name, (0,)) == {
            0: ErrorCode.producer_fenced}
        assert add_partitions(sock, "txn-a", pid, 0, topic_name, (0,), version=1) == {
            0: ErrorCode.invalid_producer_epoch}
        assert add_partitions(sock, "txn-a", pid + 1, 1, topic_name, (0,)) == {
            0: ErrorCode.invalid_producer_id_mapping}
        assert end_txn(sock, "txn-a", pid, 1, True) == ErrorCode.invalid_txn_state
        assert add_partitions(sock, "txn-a", pid, 1, topic_name, (0, 1)) == {
            0: ErrorCode.none, 1: ErrorCode.none}
        assert cluster.controller.image().open_transactions[(topic_name, 0)] == {pid}
        assert call(sock, ADD_OFFSETS, 3, transactional_id="txn-a", producer_id=pid,
                    producer_epoch=1, group_id="g-a").error_code == ErrorCode.none
        ongoing = describe(kafka_admin, "txn-a")
        assert (ongoing.state, ongoing.producer_id, ongoing.producer_epoch) == (
            "Ongoing", pid, 1)
        assert {(tp.topic, tp.partition) for tp in ongoing.topic_partitions} == {
            (topic_name, 0), (topic_name, 1)}
        assert end_txn(sock, "txn-a", pid, 1, True) == ErrorCode.none
        assert describe(kafka_admin, "txn-a").state == "PrepareCommit"
        assert end_txn(sock, "txn-a", pid, 1, False) == ErrorCode.invalid_txn_state
        # The markers are not written yet: a new producer waits for the end, and is told
        # CONCURRENT_TRANSACTIONS when they still are not after a while.
        assert init(sock, "txn-a").error_code == ErrorCode.concurrent_transactions
    listed = {t.transactional_id: t for listing in kafka_admin.list_transactions().values()
              for t in listing}
    assert listed["txn-a"].state == "PrepareCommit" and listed["txn-a"].producer_id == pid
    kafka_admin.close()


def test_the_next_transaction_waits_for_the_markers_of_the_last(cluster, topic_name,
                                                                monkeypatch) -> None:
    """AddPartitionsToTxn sent right after EndTxn, while the markers are still being written,
    is answered once they are, not with CONCURRENT_TRANSACTIONS: a client would try again on
    a backoff, and a producer with a transaction a record (librdkafka's latency check) would
    pay it each time."""
    write_markers = cluster.controller.markers.send

    def slow(broker_id: int, markers: Any) -> Any:
        time.sleep(0.5)
        return write_markers(broker_id, markers)

    monkeypatch.setattr(cluster.controller.markers, "send", slow)
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    txn_id = f"{topic_name}-txn"
    with connect_to(cluster.kafka_bootstrap_servers) as sock:
        first = init(sock, txn_id)
        pid, epoch = first.producer_id, first.producer_epoch
        assert add_partitions(sock, txn_id, pid, epoch, topic_name, (0,)) == {
            0: ErrorCode.none}
        assert end_txn(sock, txn_id, pid, epoch, True) == ErrorCode.none
        [ending] = cluster.controller.describe_transactions([txn_id]).values()
        assert ending is not None and ending.state == "PrepareCommit"
        assert add_partitions(sock, txn_id, pid, epoch, topic_name, (0,)) == {
            0: ErrorCode.none}
    [next_txn] = cluster.controller.describe_transactions([txn_id]).values()
    assert next_txn is not None and next_txn.state == "Ongoing"
    assert next_txn.partitions == {(topic_name, 0)}


def test_txn_offset_commit_needs_the_group_in_the_transaction(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    cls = load_request_schema(TXN_OFFSET_COMMIT, 3)
    topics = (make(nested(cls, "TxnOffsetCommitRequestTopic"), name=topic_name, partitions=(
        make(nested(cls, "TxnOffsetCommitRequestPartition"), partition_index=0,
             committed_offset=5, committed_leader_epoch=-1, committed_metadata=None),)),)

    def commit(sock: socket.socket, pid: int, member_id: str = "") -> ErrorCode:
        body = call(sock, TXN_OFFSET_COMMIT, 3, transactional_id="txn-o", group_id="g-o",
                    producer_id=pid, producer_epoch=0, generation_id=-1, member_id=member_id,
                    group_instance_id=None, topics=topics)
        return body.topics[0].partitions[0].error_code

    def fetch(sock: socket.socket, require_stable: bool) -> tuple[int, ErrorCode]:
        cls = load_request_schema(OFFSET_FETCH, 7)
        body = call(sock, OFFSET_FETCH, 7, group_id="g-o", require_stable=require_stable,
                    topics=(make(nested(cls, "OffsetFetchRequestTopic"), name=topic_name,
                                 partition_indexes=(0,)),))
        p = body.topics[0].partitions[0]
        return p.committed_offset, p.error_code

    with connect_to(cluster.kafka_bootstrap_servers) as sock:
        pid = init(sock, "txn-o").producer_id
        assert add_partitions(sock, "txn-o", pid, 0, topic_name, (0,)) == {0: ErrorCode.none}
        assert commit(sock, pid) == ErrorCode.invalid_txn_state
        assert call(sock, ADD_OFFSETS, 3, transactional_id="txn-o", producer_id=pid,
                    producer_epoch=0, group_id="g-o").error_code == ErrorCode.none
        # KIP-447: a consumer the group does not have cannot commit through a transaction.
        assert commit(sock, pid, member_id="zombie") == ErrorCode.unknown_member_id
        assert commit(sock, pid) == ErrorCode.none
        # KIP-447: a consumer asking for stable offsets waits for the transaction's end.
        assert fetch(sock, require_stable=True) == (-1, ErrorCode.unstable_offset_commit)
        assert fetch(sock, require_stable=False) == (-1, ErrorCode.none)
    assert cluster.controller.describe_transactions(["txn-o"])["txn-o"].groups == {"g-o"}


def test_a_transaction_open_past_its_timeout_is_aborted_under_a_new_epoch(
        cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    kafka_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    with connect_to(cluster.kafka_bootstrap_servers) as sock:
        pid = init(sock, "txn-t", timeout_ms=1_000).producer_id
        assert add_partitions(sock, "txn-t", pid, 0, topic_name, (0,)) == {0: ErrorCode.none}
        wait_until(lambda: describe(kafka_admin, "txn-t").state in (
            "PrepareAbort", "CompleteAbort"),
                   "the coordinator to abort the timed-out transaction")
        assert describe(kafka_admin, "txn-t").producer_epoch == 1
        assert end_txn(sock, "txn-t", pid, 0, True) == ErrorCode.producer_fenced
    kafka_admin.close()


def test_a_committed_transactions_offsets_become_the_groups(cluster, topic_name,
                                                            monkeypatch) -> None:
    """With markers answered (the seam replaced by one that acknowledges every partition, as
    the partition leaders will), EndTxn's commit completes and the offsets TxnOffsetCommit
    held are the group's committed offsets, through the real group coordinator."""
    monkeypatch.setattr(cluster.controller.markers, "send", lambda broker_id, markers: {
        (m.producer_id, t, p): None for m in markers for t, p in m.partitions})
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    cls = load_request_schema(TXN_OFFSET_COMMIT, 3)
    topics = (make(nested(cls, "TxnOffsetCommitRequestTopic"), name=topic_name, partitions=(
        make(nested(cls, "TxnOffsetCommitRequestPartition"), partition_index=0,
             committed_offset=42, committed_leader_epoch=-1, committed_metadata="m"),)),)
    with connect_to(cluster.kafka_bootstrap_servers) as sock:
        pid = init(sock, "txn-c").producer_id
        assert add_partitions(sock, "txn-c", pid, 0, topic_name, (0,)) == {0: ErrorCode.none}
        assert call(sock, ADD_OFFSETS, 3, transactional_id="txn-c", producer_id=pid,
                    producer_epoch=0, group_id="g-c").error_code == ErrorCode.none
        committed = call(sock, TXN_OFFSET_COMMIT, 3, transactional_id="txn-c", group_id="g-c",
                         producer_id=pid, producer_epoch=0, generation_id=-1, member_id="",
                         group_instance_id=None, topics=topics)
        assert committed.topics[0].partitions[0].error_code == ErrorCode.none
        assert end_txn(sock, "txn-c", pid, 0, True) == ErrorCode.none
    wait_until(lambda: cluster.controller.describe_transactions(["txn-c"])["txn-c"].state
               == "CompleteCommit", "the commit to complete")
    assert cluster.controller.image().open_transactions.get((topic_name, 0)) is None
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets("g-c") == {(topic_name, 0): 42}


def test_confluent_kafkas_transactional_producer_commits_offsets_and_is_fenced(
        cluster, topic_name, monkeypatch) -> None:
    """librdkafka's own transaction calls, unmodified (no records produced: transactional
    batches are the partition side's): init_transactions, send_offsets_to_transaction and
    commit_transaction commit the group's offsets; a second producer with the same
    transactional.id fences the first, whose next transaction fails fatally."""
    monkeypatch.setattr(cluster.controller.markers, "send", lambda broker_id, markers: {
        (m.producer_id, t, p): None for m in markers for t, p in m.partitions})
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    boot = cluster.kafka_bootstrap_servers
    first = Producer({"bootstrap.servers": boot, "transactional.id": "ck-1"})
    first.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": boot, "group.id": "ck-g"})
    group = consumer.consumer_group_metadata()
    first.begin_transaction()
    first.send_offsets_to_transaction([TopicPartition(topic_name, 0, 7)], group, 30)
    first.commit_transaction(30)  # answered once PrepareCommit is durable; markers follow
    with AdminClient(cluster.bootstrap_servers) as admin:
        wait_until(lambda: admin.list_consumer_group_offsets("ck-g") == {(topic_name, 0): 7},
                   "the committed offsets")
    second = Producer({"bootstrap.servers": boot, "transactional.id": "ck-1"})
    second.init_transactions(30)
    with pytest.raises(KafkaException) as fenced:
        first.begin_transaction()
        first.send_offsets_to_transaction([TopicPartition(topic_name, 0, 9)], group, 30)
        first.commit_transaction(30)
    assert fenced.value.args[0].fatal()
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets("ck-g") == {(topic_name, 0): 7}
    described = cluster.controller.describe_transactions(["ck-1"])["ck-1"]
    assert described.producer_epoch == 1
    consumer.close()
