"""Kafka transactions (KIP-98) through deltabus's own gRPC door: the Producer's transactional API
(init_transactions, begin_transaction, send_offsets_to_transaction, commit_transaction,
abort_transaction, as confluent-kafka names it) against the real cluster. Committed records are
read once and aborted ones never, by deltabus's read_committed Consumer and by confluent-kafka's;
consumed offsets become the group's only when the transaction commits; a second producer with
the same transactional id fences the first."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer

from deltabus import AdminClient, Consumer, NewTopic, Producer, errors
from deltabus.client.consumer import TopicPartition


def values_read(cluster, topic: str, partitions: int, isolation: str, count: int) -> list[bytes]:
    """What deltabus's Consumer reads from the beginning of `topic` with `isolation`: `count`
    values, then one more second of nothing."""
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest",
                  isolation_level=isolation) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        got: list[bytes] = []
        deadline, settle = time.monotonic() + 60, None
        while time.monotonic() < deadline and (settle is None or time.monotonic() < settle):
            got += [r.value for r in consumer.poll(200)]
            if len(got) >= count and settle is None:
                settle = time.monotonic() + 1
        return got


def confluent_read(cluster, topic: str, count: int) -> list[bytes]:
    consumer = KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": f"reader-{time.monotonic_ns()}",
                              "auto.offset.reset": "earliest", "enable.auto.commit": False,
                              "isolation.level": "read_committed"})
    got: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline, settle = time.monotonic() + 60, None
        while time.monotonic() < deadline and (settle is None or time.monotonic() < settle):
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
            if len(got) >= count and settle is None:
                settle = time.monotonic() + 1
    finally:
        consumer.close()
    return got


def send_all(producer: Producer, topic: str, values: list[str]) -> None:
    for i, v in enumerate(values):
        producer.send(topic, v.encode(), partition=i % 2)


def test_committed_records_are_read_once_and_aborted_never(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 3)])
    committed = [f"kept-{i}" for i in range(20)]
    aborted = [f"dropped-{i}" for i in range(20)]
    later = [f"later-{i}" for i in range(6)]
    with Producer(cluster.bootstrap_servers, transactional_id=f"{topic_name}-tx") as p:
        p.init_transactions()
        with pytest.raises(errors.InvalidTxnStateError):
            p.send(topic_name, b"outside")  # a transactional producer sends in a transaction
        p.begin_transaction()
        send_all(p, topic_name, committed)
        p.commit_transaction()
        p.begin_transaction()
        send_all(p, topic_name, aborted)
        p.abort_transaction()
        p.begin_transaction()
        send_all(p, topic_name, later)
        p.commit_transaction()
    wanted = sorted(v.encode() for v in committed + later)
    assert sorted(values_read(cluster, topic_name, 2, "read_committed", 26)) == wanted
    assert sorted(confluent_read(cluster, topic_name, 26)) == wanted
    everything = values_read(cluster, topic_name, 2, "read_uncommitted", 46)
    assert sorted(everything) == sorted(v.encode() for v in committed + aborted + later)


def test_sent_offsets_become_the_groups_only_on_commit(cluster, topic_name) -> None:
    source, sink, group = f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-g"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(source, 1, 3), NewTopic(sink, 2, 3)])
    with Producer(cluster.bootstrap_servers) as plain:
        for i in range(10):
            plain.send(source, f"in-{i}".encode(), partition=0)
    tp = TopicPartition(source, 0)
    with Consumer(cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False, isolation_level="read_committed") as consumer, \
            Producer(cluster.bootstrap_servers, transactional_id=f"{topic_name}-tx") as p:
        consumer.subscribe([source])
        inputs: list = []
        deadline = time.monotonic() + 60
        while len(inputs) < 10 and time.monotonic() < deadline:
            inputs += consumer.poll(500)
        assert len(inputs) == 10
        p.init_transactions()
        p.begin_transaction()
        send_all(p, sink, [f"out-abort-{r.offset}" for r in inputs[:5]])
        p.send_offsets_to_transaction({tp: 5}, consumer.consumer_group_metadata())
        p.abort_transaction()
        assert consumer.committed(tp) is None  # the aborted transaction's offsets are dropped
        p.begin_transaction()
        send_all(p, sink, [f"out-commit-{r.offset}" for r in inputs])
        p.send_offsets_to_transaction({tp: 10}, consumer.consumer_group_metadata())
        p.commit_transaction()
        deadline = time.monotonic() + 60
        while (consumer.committed(tp) is None or consumer.committed(tp).offset != 10) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert consumer.committed(tp).offset == 10
    got = values_read(cluster, sink, 2, "read_committed", 10)
    assert sorted(got) == sorted(f"out-commit-{i}".encode() for i in range(10))


def test_a_second_producer_fences_the_first(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 3)])
    first = Producer(cluster.bootstrap_servers, transactional_id=f"{topic_name}-tx")
    second = Producer(cluster.bootstrap_servers, transactional_id=f"{topic_name}-tx")
    try:
        first.init_transactions()
        first.begin_transaction()
        send_all(first, topic_name, [f"zombie-{i}" for i in range(4)])
        first.flush()
        second.init_transactions()  # aborts the first's open transaction
        second.begin_transaction()
        send_all(second, topic_name, [f"alive-{i}" for i in range(4)])
        second.commit_transaction()
        with pytest.raises(errors.ProducerFencedError):
            first.commit_transaction()
        with pytest.raises(errors.ProducerFencedError):
            first.begin_transaction()  # fenced is fatal
    finally:
        first.close()
        second.close()
    got = values_read(cluster, topic_name, 2, "read_committed", 4)
    assert sorted(got) == sorted(f"alive-{i}".encode() for i in range(4))


def test_a_fenced_producers_next_batch_is_refused_as_fenced(cluster, topic_name) -> None:
    """The zombie's batch after its successor's init_transactions gets INVALID_PRODUCER_EPOCH
    (as from Kafka's broker), not INVALID_TXN_STATE: a fatal error, so every later call of the
    zombie raises it; the successor commits and readers see its records alone."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    zombie = Producer(cluster.bootstrap_servers, transactional_id=f"{topic_name}-tx")
    alive = Producer(cluster.bootstrap_servers, transactional_id=f"{topic_name}-tx")
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic_name, b"zombie-0", partition=0).get(30)
        alive.init_transactions()  # aborts the zombie's transaction under a new epoch
        with pytest.raises(errors.InvalidProducerEpochError):
            zombie.send(topic_name, b"zombie-1", partition=0).get(30)
        with pytest.raises(errors.InvalidProducerEpochError):
            zombie.commit_transaction()  # fatal: not abortable
        with pytest.raises(errors.InvalidProducerEpochError):
            zombie.abort_transaction()
        alive.begin_transaction()
        alive.send(topic_name, b"alive-0", partition=0)
        alive.commit_transaction()
    finally:
        zombie.close()
        alive.close()
    assert values_read(cluster, topic_name, 1, "read_committed", 1) == [b"alive-0"]
