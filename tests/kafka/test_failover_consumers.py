"""Kafka's own consumers through leader failovers: librdkafka (confluent-kafka) and kafka-python
members with auto.offset.reset=latest read a partition whose leader is SIGKILLed again and again
under an acks=all producer. A failover must never move their positions: a new leader whose high
watermark lags answers with no records (never OFFSET_OUT_OF_RANGE, which makes a consumer with
"latest" skip records silently), so each reads every acknowledged record from where it started,
in offset order, and none twice.

One broker is down at a time: each kill waits for the last one's relaunch and for its replica to
be back in the ISR, so every kill is a failover to an in-sync replica. Killing leaders faster than
the supervisor relaunches them (9-13 s each on a loaded two-core machine) takes the whole
partition, and then every broker, down; kafka-python 3.0's poll() then raises
KafkaConnectionError (a FindCoordinator and the metadata refresh it waits for both refused), which
is an outage, not a failover."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer as RdKafkaConsumer
from kafka import KafkaConsumer

from deltabus import AdminClient, NewTopic, Producer
from tests.cluster.test_replication import state
from tests.conftest import wait_until

KILLS = 3


class Reader(threading.Thread):
    """Polls one Kafka consumer until stopped; keeps every offset it got, in order."""

    def __init__(self, name: str, poll: Callable[[], list[int]], close: Callable[[], None]):
        super().__init__(name=name, daemon=True)
        self.offsets: list[int] = []
        self.error: BaseException | None = None
        self._poll, self._close = poll, close
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.offsets.extend(self._poll())
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self._close()


def rdkafka_reader(cluster, topic: str) -> Reader:
    consumer = RdKafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                                "group.id": f"{topic}-rdkafka", "auto.offset.reset": "latest",
                                "enable.auto.commit": False, "session.timeout.ms": 30_000})
    consumer.subscribe([topic])

    def poll() -> list[int]:
        out = []
        for message in consumer.consume(500, 0.2):
            if message.error() is None:
                out.append(message.offset())
        return out
    return Reader("rdkafka", poll, consumer.close)


def kafka_python_reader(cluster, topic: str) -> Reader:
    consumer = KafkaConsumer(topic, bootstrap_servers=cluster.kafka_bootstrap_servers,
                             group_id=f"{topic}-kafka-python", auto_offset_reset="latest",
                             enable_auto_commit=False, session_timeout_ms=30_000,
                             heartbeat_interval_ms=1000, max_poll_interval_ms=300_000)

    def poll() -> list[int]:
        return [r.offset for records in consumer.poll(200).values() for r in records]
    return Reader("kafka-python", poll, consumer.close)


def all_in_sync(cluster, topic: str) -> bool:
    """Every broker live and every replica of the partition in its ISR: a kill now takes the
    leader alone, and an in-sync replica takes over."""
    s = state(cluster, topic)
    return (len(cluster.controller.live_brokers()) == cluster.config.brokers and s.leader >= 0
            and sorted(s.isr) == sorted(s.replicas))


def reading(readers: list[Reader]) -> int:
    """The fewest records a reader has; a reader that stopped on an error fails the test at
    once, with its error (its count would only stand still until a wait timed out)."""
    for reader in readers:
        assert reader.error is None, (reader.name, reader.error)
    return min(len(r.offsets) for r in readers)


def test_kafka_consumers_with_latest_keep_their_positions_through_leader_kills(
        cluster, topic_name, all_brokers_back) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"min.insync.replicas": "2"})])
    acked: list[int] = []
    stop = threading.Event()

    def keep_producing() -> None:
        with Producer(cluster.bootstrap_servers, acks="all", linger_ms=2) as producer:
            i = 0
            while not stop.is_set():
                future = producer.send(topic_name, f"v{i}".encode(), partition=0)
                future.add_done_callback(
                    lambda f: f.exception() is None and acked.append(f.get().offset))
                i += 1
                time.sleep(0.003)
            producer.flush()

    readers = [rdkafka_reader(cluster, topic_name), kafka_python_reader(cluster, topic_name)]
    for reader in readers:
        reader.start()
    writer = threading.Thread(target=keep_producing)
    writer.start()
    try:
        # Each reader has started ("latest" resolved) once it reads a record.
        wait_until(lambda: all(r.offsets for r in readers), "both consumers reading")
        for _ in range(KILLS):
            wait_until(lambda: all_in_sync(cluster, topic_name),
                       "every broker back and every replica in the ISR", timeout_s=90)
            leader = state(cluster, topic_name).leader
            count = min(len(r.offsets) for r in readers)
            cluster.kill_broker(leader)
            wait_until(lambda old=leader: state(cluster, topic_name).leader not in (old, -1),
                       "a new leader", timeout_s=90)
            wait_until(lambda c=count: reading(readers) > c + 100,
                       "both consumers reading from the new leader", timeout_s=90)
    finally:
        stop.set()
        writer.join(90)
    end = max(acked) + 1
    wait_until(lambda: all(r.error or (r.offsets and r.offsets[-1] >= end - 1) for r in readers),
               "both consumers reading every acknowledged record", timeout_s=90)
    for reader in readers:
        reader.stop.set()
        reader.join(30)
        assert reader.error is None, (reader.name, reader.error)
        start = reader.offsets[0]
        # In offset order and never back: no reset; none missing: nothing skipped.
        assert reader.offsets == sorted(set(reader.offsets)), reader.name
        missing = sorted(set(o for o in acked if o >= start) - set(reader.offsets))
        assert not missing, (reader.name, missing[:10], len(missing))
