"""DeleteRecords through Kafka's protocol, as kafka-delete-records.sh and Kafka's admin clients
send it (kafka-python's and librdkafka's, unmodified): the leader moves the log start offset up,
answers with the low watermark once the ISR holds it, and from then on nothing below it is
served: consumers from the beginning start at it, ListOffsets earliest answers it, and that
stays so after the leader restarts or a follower takes over."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from tests.cluster.test_replication import kill_and_hold, state
from tests.conftest import wait_until


def produce(cluster, topic: str, batches: int, size: int = 5) -> None:
    """`batches` commits of `size` records to partition 0 (a flush each: a file each)."""
    with Producer(cluster.bootstrap_servers) as producer:
        for b in range(batches):
            for i in range(size):
                producer.send(topic, f"{b}-{i}".encode(), partition=0)
            producer.flush()


def create(cluster, topic: str, rf: int = 3, **configs: str) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, rf, configs or None)])


def first_offset_from_the_beginning(cluster, topic: str) -> int:
    """What a kafka-python consumer with auto.offset.reset=earliest reads first."""
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        records: list = []
        wait_until(lambda: records.extend(consumer.poll(200).get(tp, [])) or bool(records),
                   f"a record of {topic}")
        return records[0].offset
    finally:
        consumer.close()


def earliest(cluster, topic: str) -> int:
    """ListOffsets EARLIEST, through kafka-python."""
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        tp = KafkaTopicPartition(topic, 0)
        return consumer.beginning_offsets([tp])[tp]
    finally:
        consumer.close()


def test_kafka_python_deletes_records_below_an_offset(cluster, topic_name) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError

    create(cluster, topic_name)
    produce(cluster, topic_name, 2)  # offsets 0-9 in two files
    tp = KafkaTopicPartition(topic_name, 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        answered = admin.delete_records({tp: 3}, timeout_ms=30_000)
        assert answered[tp]["low_watermark"] == 3
        assert answered[tp]["error_code"] == 0
        assert earliest(cluster, topic_name) == 3
        assert first_offset_from_the_beginning(cluster, topic_name) == 3
        # never down: an offset below the log start answers the log start
        assert admin.delete_records({tp: 1}, timeout_ms=30_000)[tp]["low_watermark"] == 3
        with pytest.raises(OffsetOutOfRangeError):  # past the high watermark
            admin.delete_records({tp: 11}, timeout_ms=30_000)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_records({KafkaTopicPartition(topic_name, 7): 1}, timeout_ms=30_000)
    finally:
        admin.close()
    # a fetch below it is OFFSET_OUT_OF_RANGE: a consumer with no reset policy is told so
    with Consumer(cluster.bootstrap_servers, group_id=f"{topic_name}-g",
                  auto_offset_reset="none", enable_auto_commit=False) as consumer:
        consumer.commit({TopicPartition(topic_name, 0): 1})
        consumer.assign([TopicPartition(topic_name, 0)])
        with pytest.raises(errors.OffsetOutOfRangeError):
            for _ in range(20):
                consumer.poll(200)


def test_librdkafka_deletes_records_up_to_the_high_watermark(cluster, topic_name) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka import TopicPartition as RdTopicPartition
    from confluent_kafka.admin import AdminClient as ConfluentAdmin

    create(cluster, topic_name)
    produce(cluster, topic_name, 1, size=10)  # offsets 0-9 in one file
    librdkafka = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    deleted = librdkafka.delete_records([RdTopicPartition(topic_name, 0, 4)],
                                        request_timeout=30, operation_timeout=30)
    assert next(iter(deleted.values())).result(30).low_watermark == 4
    assert first_offset_from_the_beginning(cluster, topic_name) == 4  # the file straddles it
    deleted = librdkafka.delete_records([RdTopicPartition(topic_name, 0, -1)],  # OFFSET_END
                                        request_timeout=30, operation_timeout=30)
    assert next(iter(deleted.values())).result(30).low_watermark == 10
    assert earliest(cluster, topic_name) == 10
    deleted = librdkafka.delete_records([RdTopicPartition(topic_name, 0, 50)],
                                        request_timeout=30, operation_timeout=30)
    with pytest.raises(KafkaException) as refused:
        next(iter(deleted.values())).result(30)
    assert refused.value.args[0].name() == "OFFSET_OUT_OF_RANGE"
    produce(cluster, topic_name, 1)
    assert first_offset_from_the_beginning(cluster, topic_name) == 10
    # the cleaner's next run takes the file wholly below the log start from every replica
    result = cluster.log_cleaner.run([topic_name])[0]
    assert result.error == ""
    assert {b: r.records for b, r in result.removed.items()} == {0: 10, 1: 10, 2: 10}
    assert first_offset_from_the_beginning(cluster, topic_name) == 10


def delete_with_kafka_python(cluster, topic: str, offset: int) -> int:
    from kafka.admin import KafkaAdminClient

    tp = KafkaTopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        return admin.delete_records({tp: offset}, timeout_ms=30_000)[tp]["low_watermark"]
    finally:
        admin.close()


def test_the_log_start_survives_a_restart_of_the_leader(
        cluster, topic_name, all_brokers_back) -> None:
    create(cluster, topic_name, rf=1)  # no other replica could tell it the log start
    produce(cluster, topic_name, 2)
    assert delete_with_kafka_python(cluster, topic_name, 7) == 7
    leader = state(cluster, topic_name).leader
    cluster.restart_broker(leader, timeout_s=120)
    wait_until(lambda: state(cluster, topic_name).leader == leader, "the leader to be back")
    wait_until(lambda: _answers(lambda: earliest(cluster, topic_name)) == 7,
               "ListOffsets earliest from the restarted leader")
    assert first_offset_from_the_beginning(cluster, topic_name) == 7


def test_a_follower_that_becomes_leader_serves_nothing_below_the_log_start(
        cluster, topic_name, all_brokers_back) -> None:
    create(cluster, topic_name)
    produce(cluster, topic_name, 1, size=10)  # one file: it straddles the new log start
    assert delete_with_kafka_python(cluster, topic_name, 6) == 6  # the ISR holds it now
    old = state(cluster, topic_name).leader
    kill_and_hold(cluster, old)
    wait_until(lambda: state(cluster, topic_name).leader not in (-1, old), "a new leader")
    wait_until(lambda: _answers(lambda: earliest(cluster, topic_name)) == 6,
               "ListOffsets earliest from the new leader")
    assert first_offset_from_the_beginning(cluster, topic_name) == 6
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="none") as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        consumer.seek(TopicPartition(topic_name, 0), 2)
        with pytest.raises(errors.OffsetOutOfRangeError):
            for _ in range(20):
                consumer.poll(200)


def _answers(call) -> object:
    """`call()`, or None while the partition moves (a retriable error)."""
    try:
        return call()
    except Exception:  # the leader is moving: ask again
        return None
