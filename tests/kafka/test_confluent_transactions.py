"""Kafka transactions (KIP-98) through the Kafka door with confluent-kafka (librdkafka),
unmodified: a transactional producer's committed records are read once by a read_committed
consumer and its aborted ones never; consumed offsets commit with the output; a second producer
with the same transactional.id fences the first and aborts its open transaction; a producer killed
mid-transaction has it aborted when transaction.timeout.ms runs out, so readers move on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as KafkaProducer

from deltabus import AdminClient, NewTopic
from tests.cluster.test_replication import state
from tests.conftest import wait_until


def transactional_producer(cluster, transactional_id: str, **extra: object) -> KafkaProducer:
    return KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                          "transactional.id": transactional_id, "linger.ms": 5, **extra})


def read(cluster, topic: str, isolation: str, until: set[bytes] | None = None,
         count: int | None = None, group: str | None = None) -> list[bytes]:
    """Values read from the beginning of `topic` by a consumer with `isolation`, until it has
    `count` records or every value of `until`; then for one more second (nothing else comes)."""
    consumer = KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": group or f"reader-{time.monotonic_ns()}",
                              "auto.offset.reset": "earliest", "enable.auto.commit": False,
                              "isolation.level": isolation})
    got: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 90
        settled_at = None
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
            done = ((count is not None and len(got) >= count)
                    or (until is not None and until <= set(got)))
            if done and settled_at is None:
                settled_at = time.monotonic() + 1
            if settled_at is not None and time.monotonic() > settled_at:
                break
    finally:
        consumer.close()
    return got


def produce_all(producer: KafkaProducer, topic: str, values: list[str]) -> None:
    for v in values:
        producer.produce(topic, value=v.encode(), partition=int(v.split("-")[-1]) % 2)
    assert producer.flush(60) == 0


def test_read_committed_sees_committed_records_once_and_aborted_never(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 3)])
    p = transactional_producer(cluster, f"{topic_name}-tx")
    p.init_transactions(60)
    committed = [f"kept-{i}" for i in range(20)]
    aborted = [f"dropped-{i}" for i in range(20)]
    later = [f"later-{i}" for i in range(6)]
    p.begin_transaction()
    produce_all(p, topic_name, committed)
    p.commit_transaction(60)
    p.begin_transaction()
    produce_all(p, topic_name, aborted)
    p.abort_transaction(60)
    p.begin_transaction()
    produce_all(p, topic_name, later)
    p.commit_transaction(60)

    wanted = {v.encode() for v in committed + later}
    got = read(cluster, topic_name, "read_committed", until=wanted)
    assert sorted(got) == sorted(wanted)  # each once, none aborted
    everything = read(cluster, topic_name, "read_uncommitted", count=46)
    assert sorted(everything) == sorted(v.encode() for v in committed + aborted + later)


def committed_offset(cluster, group: str, topic: str, partition: int) -> int:
    consumer = KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, partition)], timeout=30)
        return tp.offset
    finally:
        consumer.close()


def test_consumed_offsets_commit_with_the_output_and_not_on_abort(cluster, topic_name) -> None:
    """send_offsets_to_transaction (AddOffsetsToTxn, TxnOffsetCommit): the group's offset moves
    only when the transaction commits, as a consume-transform-produce loop needs."""
    source, sink, group = f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-g"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(source, 1, 3), NewTopic(sink, 2, 3)])
    plain = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    for i in range(10):
        plain.produce(source, value=f"in-{i}".encode(), partition=0)
    assert plain.flush(60) == 0
    consumer = KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": group, "auto.offset.reset": "earliest",
                              "enable.auto.commit": False, "isolation.level": "read_committed"})
    p = transactional_producer(cluster, f"{topic_name}-tx")
    try:
        consumer.subscribe([source])
        p.init_transactions(60)
        inputs = []
        while len(inputs) < 10:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                inputs.append(message)
        for attempt, end in (("abort", 5), ("commit", 10)):
            p.begin_transaction()
            produce_all(p, sink, [f"out-{attempt}-{m.offset()}" for m in inputs[:end]])
            p.send_offsets_to_transaction([TopicPartition(source, 0, end)],
                                          consumer.consumer_group_metadata(), 60)
            if attempt == "abort":
                p.abort_transaction(60)
                assert committed_offset(cluster, group, source, 0) < 0  # nothing committed
            else:
                p.commit_transaction(60)
    finally:
        consumer.close()
    wait_until(lambda: committed_offset(cluster, group, source, 0) == 10,
               "the transaction's offset to be the group's")
    got = read(cluster, sink, "read_committed", count=10)
    assert sorted(got) == sorted(f"out-commit-{i}".encode() for i in range(10))


def test_a_second_producer_fences_the_first_and_aborts_its_transaction(cluster,
                                                                       topic_name) -> None:
    """InitProducerId with the same transactional.id bumps the epoch: the open transaction of
    the first producer is aborted and its commit fails as fenced; readers move past it."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 3)])
    first = transactional_producer(cluster, f"{topic_name}-tx")
    first.init_transactions(60)
    first.begin_transaction()
    produce_all(first, topic_name, [f"zombie-{i}" for i in range(4)])
    second = transactional_producer(cluster, f"{topic_name}-tx")
    second.init_transactions(60)
    second.begin_transaction()
    produce_all(second, topic_name, [f"alive-{i}" for i in range(4)])
    second.commit_transaction(60)
    try:
        first.commit_transaction(30)
        raise AssertionError("the fenced producer committed")
    except KafkaException as e:
        assert e.args[0].fatal() or "fenced" in str(e).lower(), e
    got = read(cluster, topic_name, "read_committed", until={f"alive-{i}".encode()
                                                               for i in range(4)})
    assert sorted(got) == sorted(f"alive-{i}".encode() for i in range(4))


FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def test_a_fenced_producers_next_produce_is_a_fatal_error(cluster, topic_name) -> None:
    """The zombie's next batch after a second producer took its transactional.id over (to a
    partition its aborted transaction held) is answered INVALID_PRODUCER_EPOCH, as Kafka's
    broker answers it, which librdkafka takes as fenced: a fatal error, so the zombie stops
    rather than aborting and going on. The new producer's transaction commits, and
    read_committed readers see its records alone."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    zombie = transactional_producer(cluster, f"{topic_name}-tx")
    zombie.init_transactions(60)
    zombie.begin_transaction()
    for i in range(3):
        zombie.produce(topic_name, value=f"zombie-{i}".encode(), partition=0)
    assert zombie.flush(60) == 0
    alive = transactional_producer(cluster, f"{topic_name}-tx")
    alive.init_transactions(60)  # aborts the zombie's transaction under a new epoch
    with pytest.raises(KafkaException) as fenced:  # librdkafka raises a fatal error at once
        zombie.produce(topic_name, value=b"zombie-late", partition=0)
        zombie.flush(60)
    with pytest.raises(KafkaException) as at_commit:
        zombie.commit_transaction(30)
    for error in (fenced.value.args[0], at_commit.value.args[0]):
        assert error.fatal() and not error.txn_requires_abort(), error
        assert error.code() in FENCED, error
    assert "old epoch" in fenced.value.args[0].str()  # INVALID_PRODUCER_EPOCH's description
    alive.begin_transaction()
    for i in range(3):
        alive.produce(topic_name, value=f"alive-{i}".encode(), partition=0)
    alive.commit_transaction(60)
    wanted = {f"alive-{i}".encode() for i in range(3)}
    assert sorted(read(cluster, topic_name, "read_committed", until=wanted)) == sorted(wanted)


CRASHING_PRODUCER = """
import os, sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2],
              "transaction.timeout.ms": 3000})
p.init_transactions(60)
p.begin_transaction()
for i in range(5):
    p.produce(sys.argv[3], value=f"crashed-{i}".encode(), partition=0)
assert p.flush(60) == 0
print("open", flush=True)
os._exit(0)  # no abort, no close: the process is gone mid-transaction
"""


def test_a_crashed_producers_transaction_is_aborted_when_it_times_out(cluster,
                                                                      topic_name) -> None:
    """transaction.timeout.ms: the coordinator aborts a transaction its producer left open, so
    read_committed readers stop waiting at it and never see its records."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    done = subprocess.run([sys.executable, "-c", CRASHING_PRODUCER,
                           cluster.kafka_bootstrap_servers, f"{topic_name}-tx", topic_name],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "open", done.stderr
    after = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    after.produce(topic_name, value=b"after", partition=0)
    assert after.flush(60) == 0
    got = read(cluster, topic_name, "read_committed", until={b"after"})
    assert got == [b"after"]


def test_a_transaction_commits_through_a_leader_kill(cluster, topic_name,
                                                      all_brokers_back) -> None:
    """The leader of a transaction's partition is killed between the records and the commit:
    the coordinator writes the marker on the new leader, and read_committed consumers get every
    record of the transaction once, and the open transaction's records before that never."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"min.insync.replicas": "2"})])
    p = transactional_producer(cluster, f"{topic_name}-tx", **{"acks": "all"})
    p.init_transactions(60)
    p.begin_transaction()
    values = [f"through-{i}" for i in range(30)]
    for v in values:
        p.produce(topic_name, value=v.encode(), partition=0)
    assert p.flush(60) == 0
    leader = state(cluster, topic_name).leader
    cluster.kill_broker(leader)
    wait_until(lambda: state(cluster, topic_name).leader not in (leader, -1), "a new leader")
    p.commit_transaction(120)
    got = read(cluster, topic_name, "read_committed", count=30)
    assert sorted(got) == sorted(v.encode() for v in values)
