"""Fetch v13+ and incremental fetch sessions (KIP-227, KIP-516) through the Kafka door:
kafka-python, unmodified, consumes a topic spread over every broker in incremental sessions, by
topic id, every record once and in order, while its assignment changes; raw Fetch v17 requests
read by topic id, open a session and continue it, and get Kafka's errors for an unknown topic
id, an unknown session and a stale epoch."""

from __future__ import annotations

import socket
import uuid
from datetime import timedelta
from typing import Any

from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic, Producer
from deltabus.rpc.kafka.apis import FETCH
from deltabus.rpc.kafka.frames import make, nested
from tests.conftest import wait_until
from tests.kafka.raw_frames import frame, read_response

PARTITIONS = 6
VERSION = 17


def produce(cluster, topic: str, start: int, count: int, partitions: int = PARTITIONS) -> None:
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(start, start + count):
            producer.send(topic, f"v{i}".encode(), partition=i % partitions)
        producer.flush()


def test_kafka_python_consumes_in_incremental_sessions_by_topic_id(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    produce(cluster, topic_name, 0, 60)
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             fetch_max_wait_ms=100)
    seen: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}

    def poll_until(count: int) -> None:
        def polled() -> bool:
            for tp, records in consumer.poll(200).items():
                seen[tp.partition] += [r.value.decode() for r in records]
            return sum(map(len, seen.values())) >= count
        wait_until(polled, f"{count} records consumed")

    try:
        consumer.assign([KafkaTopicPartition(topic_name, p) for p in range(PARTITIONS)])
        poll_until(60)
        produce(cluster, topic_name, 60, 60)  # more while the sessions are open
        poll_until(120)
        sessions = consumer._fetcher._session_handlers
        assert len(sessions) == 3  # one per broker, each continued epoch after epoch
        assert all(s.next_metadata.session_id != 0 and s.next_metadata.epoch > 1
                   for s in sessions.values())
        kept = [p for p in range(PARTITIONS) if p % 2 == 0]  # the others leave the sessions
        consumer.assign([KafkaTopicPartition(topic_name, p) for p in kept])
        produce(cluster, topic_name, 120, 60)
        poll_until(150)
    finally:
        consumer.close()
    for p, values in seen.items():
        expected = [f"v{i}" for i in range(p, 180 if p in kept else 120, PARTITIONS)]
        assert values == expected  # each record once, in order


def raw_fetch(address: tuple[str, int], topic_id: uuid.UUID, offsets: dict[int, int], *,
              session_id: int = 0, epoch: int = -1, forget: tuple[int, ...] = ()) -> Any:
    cls = load_request_schema(FETCH, VERSION)
    topic_cls, partition_cls, forgotten_cls = (nested(cls, n) for n in (
        "FetchTopic", "FetchPartition", "ForgottenTopic"))
    request = make(cls, max_wait=timedelta(0), min_bytes=0, max_bytes=1 << 20,
                   isolation_level=0, session_id=session_id, session_epoch=epoch, rack_id="",
                   forgotten_topics_data=(make(forgotten_cls, topic_id=topic_id,
                                               partitions=forget),) if forget else (),
                   topics=(make(topic_cls, topic_id=topic_id, partitions=tuple(
                       make(partition_cls, partition=p, fetch_offset=o,
                            partition_max_bytes=1 << 20) for p, o in offsets.items())),)
                   if offsets else ())
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(frame(FETCH, VERSION, request))
        return read_response(sock, FETCH, VERSION)[1]


def values(records: bytes | None) -> list[bytes]:
    batches, out = MemoryRecords(records or b""), []
    while batches.has_next():
        out += [r.value for r in batches.next_batch()]
    return out


def test_raw_fetches_by_topic_id_in_a_session(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, replica_assignment={0: [0], 1: [0]})])
    produce(cluster, topic_name, 0, 4, 2)  # v0, v2 to partition 0; v1, v3 to partition 1
    image = cluster.controller.image()
    leader = image.broker(0)
    address = (leader.host, leader.kafka_port)
    topic_id = uuid.UUID(image.topics[topic_name].topic_id)

    opened = raw_fetch(address, topic_id, {0: 0, 1: 0}, epoch=0)
    assert opened.error_code == ErrorCode.none and opened.session_id != 0
    (answer,) = opened.responses
    assert answer.topic_id == topic_id
    assert [values(p.records) for p in answer.partitions] == [[b"v0", b"v2"], [b"v1", b"v3"]]

    # incremental: partition 0 moves on, partition 1 is forgotten; nothing new: nothing said
    quiet = raw_fetch(address, topic_id, {0: 2}, session_id=opened.session_id, epoch=1,
                      forget=(1,))
    assert quiet.error_code == ErrorCode.none and quiet.session_id == opened.session_id
    assert quiet.responses == ()
    produce(cluster, topic_name, 4, 2, 2)
    news = raw_fetch(address, topic_id, {}, session_id=opened.session_id, epoch=2)
    (answer,) = news.responses
    assert [(p.partition_index, values(p.records)) for p in answer.partitions] == [
        (0, [b"v4"])]

    stale = raw_fetch(address, topic_id, {}, session_id=opened.session_id, epoch=2)
    assert stale.error_code == ErrorCode.invalid_fetch_session_epoch
    unknown = raw_fetch(address, topic_id, {}, session_id=opened.session_id + 1, epoch=1)
    assert unknown.error_code == ErrorCode.fetch_session_id_not_found
    nobody = raw_fetch(address, uuid.uuid4(), {0: 0})
    assert [p.error_code for t in nobody.responses for p in t.partitions] == [
        ErrorCode.unknown_topic_id]
