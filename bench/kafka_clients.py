"""Bench step (l): Kafka's producer and consumer perf workload shape (kafka-producer-perf-test:
N records of a fixed size, as fast as the client goes, acks=1; kafka-consumer-perf-test: read them
all back) through a Kafka client, librdkafka by confluent-kafka, side by side with deltabus's own
gRPC clients doing the same in the same run, each on a topic of its own.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from deltabus.client.admin import AdminClient
from deltabus.client.consumer import Consumer, TopicPartition
from deltabus.client.producer import Producer
from deltabus.metadata import NewTopic

IDLE_S_MAX = 10.0  # a consume giving up after this long with nothing new


def kafka_vs_grpc(bootstrap: str, kafka_bootstrap: str, records: int,
                  value: bytes) -> dict[str, float]:
    """records/s of produce and consume through each door."""
    run_id = uuid.uuid4().hex[:8]
    kafka_topic, grpc_topic = f"bench-kafka-{run_id}", f"bench-grpc-{run_id}"
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(kafka_topic, 1, 1), NewTopic(grpc_topic, 1, 1)])
        try:
            figures = {
                "kafka_produce_rps": records / kafka_produce(kafka_bootstrap, kafka_topic,
                                                             records, value),
                "grpc_produce_rps": records / grpc_produce(bootstrap, grpc_topic, records,
                                                           value),
                "kafka_consume_rps": records / kafka_consume(kafka_bootstrap, kafka_topic,
                                                             records),
                "grpc_consume_rps": records / grpc_consume(bootstrap, grpc_topic, records),
            }
        finally:
            admin.delete_topics([kafka_topic, grpc_topic])
    return {"records": records, **figures}


def kafka_produce(kafka_bootstrap: str, topic: str, records: int, value: bytes) -> float:
    """Seconds for confluent-kafka to send `records` records and have them acknowledged."""
    from confluent_kafka import Producer as KafkaProducer

    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    producer = KafkaProducer({"bootstrap.servers": kafka_bootstrap, "acks": 1,
                              "linger.ms": 5, "enable.idempotence": False})
    producer.produce(topic, b"warm-up", partition=0)
    producer.flush(30)
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=0, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(120) or failed:
        raise RuntimeError(f"confluent-kafka could not deliver every record: {failed[:1]}")
    return time.perf_counter() - start


def grpc_produce(bootstrap: str, topic: str, records: int, value: bytes) -> float:
    """Seconds for deltabus's Producer to do the same per record (send(), acks=1)."""
    with Producer(bootstrap, acks=1) as producer:
        producer.send(topic, b"warm-up", partition=0).get(30)
        start = time.perf_counter()
        last = None
        for _ in range(records):
            last = producer.send(topic, value, partition=0)
        producer.flush()
        elapsed = time.perf_counter() - start
        if last is not None:
            last.get(0)
    return elapsed


def kafka_consume(kafka_bootstrap: str, topic: str, records: int) -> float:
    """Seconds for confluent-kafka to read the topic's records from the beginning."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = KafkaConsumer({"bootstrap.servers": kafka_bootstrap, "group.id": "bench",
                              "enable.auto.commit": False})
    try:
        consumer.assign([KafkaTopicPartition(topic, 0, 0)])
        count, last = 0, time.monotonic()
        start = time.perf_counter()
        while count < records + 1 and time.monotonic() - last < IDLE_S_MAX:
            got = consumer.consume(10_000, 1.0)
            if got:
                count, last = count + len(got), time.monotonic()
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    if count < records + 1:
        raise RuntimeError(f"confluent-kafka read {count} of {records + 1} records")
    return elapsed


def grpc_consume(bootstrap: str, topic: str, records: int) -> float:
    """Seconds for deltabus's Consumer to read them with poll() (records, as a Kafka client)."""
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        count, last = 0, time.monotonic()
        start = time.perf_counter()
        while count < records + 1 and time.monotonic() - last < IDLE_S_MAX:
            got = len(consumer.poll(1000, max_records=100_000))
            if got:
                count, last = count + got, time.monotonic()
        elapsed = time.perf_counter() - start
    if count < records + 1:
        raise RuntimeError(f"deltabus's Consumer read {count} of {records + 1} records")
    return elapsed
