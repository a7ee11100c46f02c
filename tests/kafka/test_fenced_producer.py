"""A fenced transactional producer as Kafka answers it, API by API, over raw Kafka frames on the
shared cluster: once a second InitProducerId took its transactional id over, every request at
the old epoch gets a fencing error (PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH to a version
from before KIP-588, and always to Produce, as Kafka's broker turns its verification's
PRODUCER_FENCED into it), never an abortable one such as INVALID_TXN_STATE: clients take these
as fatal, so a zombie stops (tests/kafka/test_confluent_transactions.py has librdkafka's view)."""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic
from deltabus.rpc.kafka.frames import make, nested
from tests.kafka.raw_frames import PRODUCE, connect_to
from tests.kafka.test_kafka_transactions import (
    ADD_OFFSETS,
    END_TXN,
    INIT_PRODUCER_ID,
    TXN_OFFSET_COMMIT,
    add_partitions,
    call,
    init,
)

FENCED, OLD_EPOCH = ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch


def produce(cluster: Any, txn_id: str, topic: str, pid: int, epoch: int, sequence: int) -> Any:
    """The error of a transactional Produce (v9) of one record to `topic`-0, at its leader."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                        producer_id=pid, producer_epoch=epoch,
                                        base_sequence=sequence, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=None, value=b"v", headers=[])
    image = cluster.controller.image()
    leader = image.broker(image.partition(topic, 0).leader)
    cls = load_request_schema(PRODUCE, 9)
    data = nested(cls, "PartitionProduceData")(index=0, records=bytes(builder.build()))
    with connect_to(f"{leader.host}:{leader.kafka_port}") as sock:
        body = call(sock, PRODUCE, 9, transactional_id=txn_id, acks=-1,
                    timeout=timedelta(seconds=30), topic_data=(
                        nested(cls, "TopicProduceData")(name=topic, partition_data=(data,)),))
    return body.responses[0].partition_responses[0].error_code


def init_when_ended(sock: socket.socket, txn_id: str) -> Any:
    """InitProducerId, again while the coordinator aborts the open transaction it found."""
    deadline = time.monotonic() + 60
    while (answer := init(sock, txn_id)).error_code == ErrorCode.concurrent_transactions:
        assert time.monotonic() < deadline, "the open transaction was never aborted"
        time.sleep(0.1)
    return answer


def offsets_error(sock: socket.socket, version: int, txn_id: str, topic: str, pid: int,
                  epoch: int) -> ErrorCode:
    cls = load_request_schema(TXN_OFFSET_COMMIT, version)
    topics = (make(nested(cls, "TxnOffsetCommitRequestTopic"), name=topic, partitions=(
        make(nested(cls, "TxnOffsetCommitRequestPartition"), partition_index=0,
             committed_offset=5, committed_leader_epoch=-1, committed_metadata=None),)),)
    body = call(sock, TXN_OFFSET_COMMIT, version, transactional_id=txn_id,
                group_id=f"{txn_id}-g", producer_id=pid, producer_epoch=epoch,
                generation_id=-1, member_id="", group_instance_id=None, topics=topics)
    return body.topics[0].partitions[0].error_code


def test_every_transactional_api_answers_the_old_epoch_as_fenced(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    txn_id = f"{topic_name}-txn"
    with connect_to(cluster.kafka_bootstrap_servers) as sock:
        zombie = init(sock, txn_id)
        pid, old = zombie.producer_id, zombie.producer_epoch
        assert add_partitions(sock, txn_id, pid, old, topic_name, (0,)) == {0: ErrorCode.none}
        assert produce(cluster, txn_id, topic_name, pid, old, 0) == ErrorCode.none
        successor = init_when_ended(sock, txn_id)  # the zombie's transaction is aborted
        assert successor.error_code == ErrorCode.none and successor.producer_id == pid
        new = successor.producer_epoch
        assert new > old
        # Its transaction aborted, the zombie's next batch is fenced, not "not in a transaction".
        assert produce(cluster, txn_id, topic_name, pid, old, 1) == OLD_EPOCH
        for version, fenced in ((3, FENCED), (1, OLD_EPOCH)):
            assert add_partitions(sock, txn_id, pid, old, topic_name, (0,), version) == {
                0: fenced}
            assert call(sock, ADD_OFFSETS, version, transactional_id=txn_id, producer_id=pid,
                        producer_epoch=old, group_id=f"{txn_id}-g").error_code == fenced
            assert call(sock, END_TXN, version, transactional_id=txn_id, producer_id=pid,
                        producer_epoch=old, committed=True).error_code == fenced
        assert offsets_error(sock, 3, txn_id, topic_name, pid, old) == FENCED
        assert offsets_error(sock, 2, txn_id, topic_name, pid, old) == OLD_EPOCH
        for version, fenced in ((4, FENCED), (3, OLD_EPOCH)):  # KIP-360: "I was pid, epoch"
            again = call(sock, INIT_PRODUCER_ID, version, transactional_id=txn_id,
                         transaction_timeout=timedelta(seconds=60), producer_id=pid,
                         producer_epoch=old)
            assert (again.error_code, again.producer_id) == (fenced, -1)
        # The successor's transaction holds the partition now: the zombie is still fenced.
        assert add_partitions(sock, txn_id, pid, new, topic_name, (0,)) == {0: ErrorCode.none}
        assert produce(cluster, txn_id, topic_name, pid, new, 0) == ErrorCode.none
        assert produce(cluster, txn_id, topic_name, pid, old, 1) == OLD_EPOCH
        assert call(sock, END_TXN, 3, transactional_id=txn_id, producer_id=pid,
                    producer_epoch=new, committed=True).error_code == ErrorCode.none
