"""Kafka allows a null header value, and it is not an empty one. Both travel through every door
unchanged: the Python producer (Arrow) and proto records in, the partition's Delta table, and
out again through the Python consumer, proto records and the Kafka door (kafka-python reads them;
librdkafka writes them, as kafka-python's producer refuses a null header value)."""

from __future__ import annotations

import grpc
from confluent_kafka import Producer as KafkaProducer
from deltalake import DeltaTable
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from deltabus import AdminClient, NewTopic, Producer
from deltabus.log_tables.layout import replica_path
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.conftest import read_records

HEADERS = [("null", None), ("empty", b""), ("set", b"1")]


def create(cluster, topic: str) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])


def proto_fetch(cluster, topic: str) -> list[pb.Record]:
    leader = cluster.controller.image().partition(topic, 0).leader
    with grpc.insecure_channel(cluster.controller.image().broker(leader).address) as channel:
        response = pb_grpc.DeltaBusStub(channel).Fetch(pb.FetchRequest(
            format=pb.PROTO, max_wait_ms=0, partitions=[
                pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)]), timeout=30)
    return list(response.partitions[0].records)


def proto_headers(record: pb.Record) -> list[tuple[str, bytes | None]]:
    return [(h.key, h.value if h.HasField("value") else None) for h in record.headers]


def kafka_door_headers(cluster, topic: str, count: int) -> list[list[tuple[str, bytes | None]]]:
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap_servers,
                             enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = []
        for record in consumer:
            got.append(list(record.headers))
            if len(got) == count:
                break
    finally:
        consumer.close()
    return got


def table_headers(cluster, topic: str) -> list:
    leader = cluster.controller.image().partition(topic, 0).leader
    table = DeltaTable(replica_path(cluster.config.root, topic, 0, leader)).to_pyarrow_table()
    return [[(h["key"], h["value"]) for h in row or ()]
            for row in table.sort_by("offset").column("headers").to_pylist()]


def test_null_header_values_round_trip_through_every_door(cluster, topic_name):
    create(cluster, topic_name)
    with Producer(cluster.bootstrap_servers) as producer:  # Arrow, from the Python client
        producer.send(topic_name, b"arrow", headers=HEADERS).get(30)
    leader = cluster.controller.image().partition(topic_name, 0).leader
    with grpc.insecure_channel(cluster.controller.image().broker(leader).address) as channel:
        (answer,) = pb_grpc.DeltaBusStub(channel).Produce(pb.ProduceRequest(partitions=[
            pb.PartitionProduceData(topic=topic_name, partition=0, records=[pb.Record(
                value=b"proto", headers=[pb.Header(key=k, value=v) for k, v in HEADERS])])]),
            timeout=30).partitions
    assert answer.error_code == 0, answer.error_message
    assert table_headers(cluster, topic_name) == [HEADERS, HEADERS]
    records = read_records(cluster.bootstrap_servers, topic_name, 1, 2)
    assert [(r.value, r.headers) for r in records] == [(b"arrow", HEADERS), (b"proto", HEADERS)]
    assert [proto_headers(r) for r in proto_fetch(cluster, topic_name)] == [HEADERS, HEADERS]
    assert kafka_door_headers(cluster, topic_name, 2) == [HEADERS, HEADERS]


def test_null_header_values_from_the_kafka_door_read_as_null_over_grpc(cluster, topic_name):
    create(cluster, topic_name)
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "acks": "all"})
    delivered: list = []
    producer.produce(topic_name, value=b"kafka", headers=HEADERS,
                     on_delivery=lambda error, _: delivered.append(error))
    assert producer.flush(30) == 0 and delivered == [None]
    assert table_headers(cluster, topic_name) == [HEADERS]
    assert [proto_headers(r) for r in proto_fetch(cluster, topic_name)] == [HEADERS]
    (record,) = read_records(cluster.bootstrap_servers, topic_name, 1, 1)
    assert record.headers == HEADERS
