"""Bench step (l): Kafka's producer and consumer perf workload shape (kafka-producer-perf-test:
N records of a fixed size, as fast as the client goes, acks=1; kafka-consumer-perf-test: read them
all back) through a Kafka client, librdkafka by confluent-kafka, side by side with deltabus's own
gRPC clients doing the same in the same run, each on a topic of its own; step (e)'s
produce-to-consume latency through the Kafka door with confluent-kafka; and librdkafka's own
latency check (linger.ms=35, one record at a time), plain and with each record in a transaction
of its own.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from bench.produce_fetch import IDLE_MS_MAX, LATENCY_INTERVAL_S, WARM_UP, gathered
from deltabus.client.admin import AdminClient
from deltabus.client.consumer import Consumer, TopicPartition
from deltabus.client.producer import Producer
from deltabus.metadata import NewTopic

IDLE_S_MAX = 10.0  # a consume giving up after this long with nothing new


def kafka_vs_grpc(bootstrap: str, kafka_bootstrap: str, records: int, value: bytes,
                  latency_run_s: float) -> dict[str, Any]:
    """records/s of produce and consume through each door, and the Kafka door's latency."""
    run_id = uuid.uuid4().hex[:8]
    kafka_topic, grpc_topic = f"bench-kafka-{run_id}", f"bench-grpc-{run_id}"
    latency_topic = f"bench-kafka-latency-{run_id}"
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(kafka_topic, 1, 1), NewTopic(grpc_topic, 1, 1),
                             NewTopic(latency_topic, 1, 1)])
        try:
            figures = {
                "kafka_produce_rps": records / kafka_produce(kafka_bootstrap, kafka_topic,
                                                             records, value),
                "grpc_produce_rps": records / grpc_produce(bootstrap, grpc_topic, records,
                                                           value),
                "kafka_consume_rps": records / kafka_consume(kafka_bootstrap, kafka_topic,
                                                             records),
                "grpc_consume_rps": records / grpc_consume(bootstrap, grpc_topic, records),
                "kafka_latency_ms": kafka_latency(kafka_bootstrap, latency_topic,
                                                  latency_run_s),
                # librdkafka's latency check, plain and in transactions, the same run
                "kafka_delivery_ms": delivery_latency(kafka_bootstrap, latency_topic),
                "kafka_txn_delivery_ms": delivery_latency(
                    kafka_bootstrap, latency_topic, transactional_id=f"bench-txn-{run_id}"),
            }
        finally:
            admin.delete_topics([kafka_topic, grpc_topic, latency_topic])
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


def kafka_latency(kafka_bootstrap: str, topic: str, run_s: float) -> dict[str, float]:
    """Step (e) through the Kafka door: confluent-kafka sends one 16-byte record every ~2 ms for
    `run_s` (acks=1, linger.ms=0) while a confluent-kafka consumer (its defaults) polls in a
    thread; latency is the consume time minus the record's CreateTime, set at produce()."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    producer = KafkaProducer({"bootstrap.servers": kafka_bootstrap, "acks": 1, "linger.ms": 0,
                              "enable.idempotence": False})
    warm_up: list[int | None] = []
    producer.produce(topic, WARM_UP, partition=0,
                     on_delivery=lambda _error, message: warm_up.append(message.offset()))
    producer.flush(30)
    if not warm_up or warm_up[0] is None:
        raise RuntimeError("latency: confluent-kafka could not deliver its warm-up record")
    consumer = KafkaConsumer({"bootstrap.servers": kafka_bootstrap, "group.id": "bench-latency",
                              "enable.auto.commit": False})
    consumer.assign([KafkaTopicPartition(topic, 0, warm_up[0])])
    while (message := consumer.poll(1.0)) is None or message.value() != WARM_UP:
        pass  # the consumer is fetching where the records will come
    latencies: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                latencies.append(time.time() * 1000 - message.timestamp()[1])

    reader = threading.Thread(target=consume, name="deltabus-bench-kafka-consumer", daemon=True)
    reader.start()
    sent = 0
    start = next_at = time.monotonic()
    while time.monotonic() - start < run_s:
        producer.produce(topic, b"x" * 16, partition=0, timestamp=int(time.time() * 1000))
        producer.poll(0)
        sent += 1
        next_at += LATENCY_INTERVAL_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    producer.flush(IDLE_MS_MAX / 1000)
    return gathered(latencies, sent, stop, reader, consumer.close)


# librdkafka's own latency check (its test 0055): linger.ms=35, one record at a time to one
# partition, each awaited; with a transactional.id, each record in a transaction of its own.
# librdkafka accepts an average of 35-85 ms from produce() to the delivery report for the
# transactional case (linger.ms plus AddPartitionsToTxn), plus the round trip and 5 ms.
DELIVERY_LINGER_MS = 35
DELIVERY_ROUNDS = 10


def delivery_latency(kafka_bootstrap: str, topic: str, rounds: int = DELIVERY_ROUNDS, *,
                     transactional_id: str | None = None) -> dict[str, float]:
    """ms from confluent-kafka's produce() to its delivery report, as librdkafka's latency
    check measures it (mean, min, max of `rounds` records); with `transactional_id`, each
    record in a transaction of its own, and the mean time commit_transaction() took."""
    from confluent_kafka import Producer as KafkaProducer

    settings: dict[str, Any] = {"bootstrap.servers": kafka_bootstrap,
                                "linger.ms": DELIVERY_LINGER_MS}
    if transactional_id is not None:
        settings["transactional.id"] = transactional_id
    producer = KafkaProducer(settings)
    delivered: list[float] = []

    def report(error: Any, _message: Any) -> None:
        if error is not None:
            raise RuntimeError(f"delivery failed: {error}")
        delivered.append(time.perf_counter())

    if transactional_id is not None:
        producer.init_transactions(30)
        producer.begin_transaction()
    producer.produce(topic, b"priming", partition=0, on_delivery=report)  # all up and warm
    if transactional_id is not None:
        producer.commit_transaction(30)
    producer.flush(30)
    latencies, commits = [], []
    for _ in range(rounds):
        if transactional_id is not None:
            producer.begin_transaction()
        count, sent = len(delivered), time.perf_counter()
        producer.produce(topic, b"hi", partition=0, on_delivery=report)
        while len(delivered) == count:
            producer.poll(5.0)
        latencies.append((delivered[-1] - sent) * 1000)
        if transactional_id is not None:
            started = time.perf_counter()
            producer.commit_transaction(30)
            commits.append((time.perf_counter() - started) * 1000)
    producer.flush(30)
    figures = {"mean_ms": sum(latencies) / rounds, "min_ms": min(latencies),
               "max_ms": max(latencies)}
    if commits:
        figures["commit_mean_ms"] = sum(commits) / len(commits)
    return figures
