"""confluent-kafka's own serializers, unchanged, pointed at deltabus's schema registry: Avro, JSON
Schema and Protobuf records produced through the Kafka door and consumed back, each serializer
registering its schema itself (auto.register.schemas) under Confluent's TopicNameStrategy, and
each deserializer fetching the writer's schema by the id in the record (Protobuf in its
serialized form). The registry is the shared cluster's controller's, behind the REST door
`Cluster` serves (`schema_registry_port`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from deltabus import AdminClient, NewTopic
from deltabus.rpc.schema_registry_http import SchemaRegistryServer
from deltabus.schemas import split_wire, wire_header

PAYMENT_AVRO = json.dumps({
    "type": "record", "name": "Payment", "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"},
               {"name": "currency", "type": {"type": "enum", "name": "Currency",
                                             "symbols": ["EUR", "USD"]}}]})
PAYMENT_JSON = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Payment", "type": "object",
    "properties": {"id": {"type": "string"}, "amount": {"type": "number"},
                   "currency": {"enum": ["EUR", "USD"]}},
    "required": ["id", "amount"], "additionalProperties": False})
PAYMENTS = [{"id": f"p{i}", "amount": 10.5 * i, "currency": "EUR" if i % 2 else "USD"}
            for i in range(20)]


def payment_message_class() -> Any:
    """A Protobuf message class made at run time from its descriptor, as generated code would
    register it (package shop, message Payment)."""
    proto = descriptor_pb2.FileDescriptorProto(name="shop/payment.proto", package="shop",
                                               syntax="proto3")
    message = proto.message_type.add(name="Payment")
    for number, (name, kind) in enumerate((
            ("id", descriptor_pb2.FieldDescriptorProto.TYPE_STRING),
            ("amount", descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE),
            ("currency", descriptor_pb2.FieldDescriptorProto.TYPE_STRING)), 1):
        message.field.add(name=name, number=number, type=kind,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Payment"))


@pytest.fixture(scope="module")
def registry_url(cluster: Any) -> Iterator[str]:
    server = SchemaRegistryServer(cluster.controller.schema_registry, "127.0.0.1", 0).start()
    yield server.url
    server.stop()


def round_trip(cluster: Any, topic: str, serializer: Callable[[Any, Any], bytes],
               deserializer: Callable[[Any, Any], Any], values: list[Any]) -> list[Any]:
    """Produce `values` through the Kafka door with `serializer` and read them back with
    `deserializer`; returns what the consumer got, and checks every record carries the
    registry's wire header."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "acks": "all", "linger.ms": 5})
    context = SerializationContext(topic, MessageField.VALUE)
    for value in values:
        producer.produce(topic, serializer(value, context), partition=0)
    assert producer.flush(60) == 0
    consumer = KafkaConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": f"{topic}-reader", "auto.offset.reset": "earliest"})
    got: list[Any] = []
    try:
        consumer.subscribe([topic])
        while len(got) < len(values):  # the suite's timeout bounds it
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            schema_id, _ = split_wire(message.value())
            assert schema_id > 0
            got.append(deserializer(message.value(), context))
    finally:
        consumer.close()
    return got


def test_avro_serializer_registers_and_the_deserializer_reads_by_id(
        cluster, registry_url, topic_name) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    got = round_trip(cluster, topic_name, AvroSerializer(client, PAYMENT_AVRO),
                     AvroDeserializer(client), PAYMENTS)
    assert got == PAYMENTS
    registered = client.get_latest_version(f"{topic_name}-value")
    assert registered.version == 1 and registered.schema.schema_type == "AVRO"


def test_json_serializer_registers_validates_and_the_deserializer_reads_by_id(
        cluster, registry_url, topic_name) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    serializer = JSONSerializer(PAYMENT_JSON, client)
    deserializer = JSONDeserializer(None, schema_registry_client=client)
    got = round_trip(cluster, topic_name, serializer, deserializer, PAYMENTS)
    assert got == PAYMENTS
    assert client.get_latest_version(f"{topic_name}-value").schema.schema_type == "JSON"


def test_protobuf_serializer_registers_and_the_deserializer_reads_by_id(
        cluster, registry_url, topic_name) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    payment = payment_message_class()
    values = [payment(**p) for p in PAYMENTS]
    serializer = ProtobufSerializer(payment, client, {"use.deprecated.format": False})
    deserializer = ProtobufDeserializer(payment, {"use.deprecated.format": False})
    got = round_trip(cluster, topic_name, serializer, deserializer, values)
    assert [(m.id, m.amount, m.currency) for m in got] == [
        (p["id"], p["amount"], p["currency"]) for p in PAYMENTS]
    registered = client.get_latest_version(f"{topic_name}-value")
    assert registered.schema.schema_type == "PROTOBUF"
    assert "message Payment" in registered.schema.schema_str  # the .proto text, by default


def test_a_validating_topic_refuses_a_record_its_schema_does_not_read_and_writes_nothing(
        cluster, registry_url, topic_name) -> None:
    """confluent.value.schema.validation=true, as on Confluent Server: a record whose value is
    not in the wire format, names a schema id of another subject, or does not decode with its
    schema is refused INVALID_RECORD with nothing of its batch written; serializer output is
    taken, including a schema registered the moment before (the broker's metadata catches up)."""
    client = SchemaRegistryClient({"url": registry_url})
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, configs={
            "confluent.value.schema.validation": "true"})])
    other = client.register_schema(f"{topic_name}-other-value", Schema(
        json.dumps({"type": "record", "name": "Other", "fields": []}), "AVRO"))
    context = SerializationContext(topic_name, MessageField.VALUE)
    good = AvroSerializer(client, PAYMENT_AVRO)(PAYMENTS[0], context)  # registers it now
    schema_id, _ = split_wire(good)
    refused = {
        "no wire header": b"plain text",
        "another subject's id": wire_header(other) + b"",
        "a body its schema cannot read": wire_header(schema_id) + b"\x01",
    }
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "acks": "all", "retries": 0})
    errors: dict[str, Any] = {}
    for why, value in refused.items():
        producer.produce(topic_name, value, partition=0,
                         on_delivery=lambda e, _m, why=why: errors.__setitem__(why, e))
        producer.flush(60)
    assert {why: e.code() for why, e in errors.items()} == {
        why: KafkaError.INVALID_RECORD for why in refused}
    delivered: list[Any] = []
    producer.produce(topic_name, good, partition=0,
                     on_delivery=lambda e, m: delivered.append((e, m.offset())))
    producer.flush(60)
    assert delivered == [(None, 0)]  # the first record written: nothing refused was
