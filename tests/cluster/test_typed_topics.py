"""Typed topics on the shared cluster: with `value.schema.subject`, every replica's partition
table holds each record's decoded value as typed columns (`value_fields`) beside the raw bytes,
read straight by deltalake and by Spark SQL with no parsing; a schema evolution under the
registry's rules adds a nullable field to the Delta schema without rewriting a file (on a
diskless topic's one table too); a record
its schema does not read is refused with nothing written."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from deltabus import (
    AdminClient,
    Consumer,
    NewTopic,
    Producer,
    SchemaDeserializer,
    TopicPartition,
    errors,
)
from deltabus.client.partitioner import partition_for_key
from deltabus.log_tables.layout import partition_path, replica_path
from deltabus.rpc.schema_registry_http import SchemaRegistryServer
from deltabus.schemas import split_wire, wire_header
from deltabus.spark import read_topic, register_topic_views
from tests.conftest import wait_until

PAYMENT_V1 = {"type": "record", "name": "Payment", "namespace": "shop",
              "fields": [{"name": "id", "type": "string"},
                         {"name": "amount", "type": "double"},
                         {"name": "currency", "type": "string"}]}
PAYMENT_V2 = {**PAYMENT_V1, "fields": [*PAYMENT_V1["fields"],
                                       {"name": "note", "type": ["null", "string"],
                                        "default": None}]}


@pytest.fixture(scope="module")
def registry(cluster: Any) -> Iterator[SchemaRegistryClient]:
    server = SchemaRegistryServer(cluster.controller.schema_registry, "127.0.0.1", 0).start()
    yield SchemaRegistryClient({"url": server.url})
    server.stop()


def typed_topic(cluster: Any, topic: str, keys: bool = False, diskless: bool = False) -> None:
    """One partition on 3 replicas (or, `diskless`, in one table), values typed by
    `<topic>-value` (and keys by `<topic>-key`)."""
    configs = {"value.schema.subject": f"{topic}-value",
               **({"diskless.enable": "true"} if diskless else {"min.insync.replicas": "3"})}
    if keys:
        configs["key.schema.subject"] = f"{topic}-key"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, configs=configs)])


def produce(cluster: Any, topic: str, serializer: AvroSerializer, values: list[dict]) -> None:
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "acks": "all", "linger.ms": 5})
    context = SerializationContext(topic, MessageField.VALUE)
    failed: list[Any] = []
    for value in values:
        producer.produce(topic, serializer(value, context), partition=0,
                         on_delivery=lambda e, _m: failed.append(e) if e else None)
    assert producer.flush(60) == 0 and failed == []


def replica_tables(cluster: Any, topic: str) -> list[DeltaTable]:
    """Every table of partition 0: each replica's, or a diskless partition's one."""
    partition = cluster.controller.image().partition(topic, 0)
    root = cluster.config.root
    if os.path.isdir(os.path.join(partition_path(root, topic, 0), "_delta_log")):
        return [DeltaTable(partition_path(root, topic, 0))]
    return [DeltaTable(replica_path(root, topic, 0, b)) for b in partition.replicas]


def caught_up_replicas(cluster: Any, topic: str, records: int) -> list[DeltaTable]:
    """Every replica's partition table, once each holds `records` records."""
    tables = replica_tables(cluster, topic)
    for table in tables:
        wait_until(lambda t=table: (t.update_incremental() or True)
                   and t.to_pyarrow_table(columns=["offset"]).num_rows == records,
                   f"every replica holds the {records} records")
    return tables


def test_every_replica_holds_the_decoded_values_as_typed_columns(
        cluster, registry, topic_name, spark) -> None:
    typed_topic(cluster, topic_name)
    serializer = AvroSerializer(registry, json.dumps(PAYMENT_V1))
    payments = [{"id": f"p{i}", "amount": 1.5 * i, "currency": ("EUR", "USD")[i % 2]}
                for i in range(30)]
    produce(cluster, topic_name, serializer, payments)  # acks=all, min.insync.replicas=3
    for table in caught_up_replicas(cluster, topic_name, 30):
        schema = pa.schema(table.schema().to_arrow())
        assert schema.field("value_fields").type == pa.struct([
            pa.field("id", pa.string()), pa.field("amount", pa.float64()),
            pa.field("currency", pa.string())])
        rows = table.to_pyarrow_table(columns=["offset", "value", "value_fields"]).sort_by(
            "offset")
        assert rows.column("value_fields").to_pylist() == payments
        assert all(v[:1] == b"\0" for v in rows.column("value").to_pylist())  # raw bytes kept
    views = register_topic_views(spark, cluster.bootstrap_servers, [topic_name],
                                 snapshot=True, value_fields=True)
    euros = spark.sql(f"SELECT value_fields.id, value_fields.amount FROM {views[topic_name]} "
                      "WHERE value_fields.currency = 'EUR' ORDER BY value_fields.amount")
    assert [(r.id, r.amount) for r in euros.collect()] == [
        (p["id"], p["amount"]) for p in payments if p["currency"] == "EUR"]
    assert "value" in spark.table(views[topic_name]).columns  # the Kafka columns stay


@pytest.mark.parametrize("diskless", [False, True], ids=["replicated", "diskless"])
def test_an_evolution_adds_a_nullable_field_and_rewrites_no_file(
        cluster, registry, topic_name, spark, diskless) -> None:
    typed_topic(cluster, topic_name, diskless=diskless)
    produce(cluster, topic_name, AvroSerializer(registry, json.dumps(PAYMENT_V1)),
            [{"id": "old", "amount": 1.0, "currency": "EUR"}])
    table = replica_tables(cluster, topic_name)[0]
    table.update_incremental()
    before = set(table.file_uris())
    produce(cluster, topic_name, AvroSerializer(registry, json.dumps(PAYMENT_V2)),
            [{"id": "new", "amount": 2.0, "currency": "USD", "note": "evolved"}])
    assert registry.get_versions(f"{topic_name}-value") == [1, 2]
    table.update_incremental()
    assert before <= set(table.file_uris())  # the old file is still the table's, unchanged
    schema = pa.schema(table.schema().to_arrow())
    assert schema.field("value_fields").type.get_field_index("note") == 3
    rows = table.to_pyarrow_table(columns=["offset", "value_fields"]).sort_by("offset")
    expected = [{"id": "old", "amount": 1.0, "currency": "EUR", "note": None},
                {"id": "new", "amount": 2.0, "currency": "USD", "note": "evolved"}]
    assert rows.column("value_fields").to_pylist() == expected
    read = read_topic(spark, cluster.bootstrap_servers, topic_name, value_fields=True)
    assert [r.value_fields.asDict() for r in read.orderBy("offset").collect()] == expected
    with Consumer(cluster.bootstrap_servers) as consumer:  # across both versions' commits
        tp = TopicPartition(topic_name, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[bytes] = []
        while len(got) < 2:  # the suite's timeout bounds it
            got += [r.value for r in consumer.poll(1000)]
    deserialize = AvroDeserializer(registry)
    context = SerializationContext(topic_name, MessageField.VALUE)
    assert [deserialize(v, context)["id"] for v in got] == ["old", "new"]


def test_a_promotion_from_int_to_long_lands_in_the_same_column(
        cluster, registry, topic_name) -> None:
    """Avro lets a schema promote an int field to long (BACKWARD compatible), but a Delta
    column never changes type: an int is stored as a bigint from the first record, so values
    of the promoted field land in the same column, on every replica."""
    typed_topic(cluster, topic_name)
    counted = {**PAYMENT_V1, "fields": [*PAYMENT_V1["fields"], {"name": "items", "type": "int"}]}
    promoted = {**counted, "fields": [*PAYMENT_V1["fields"], {"name": "items", "type": "long"}]}
    produce(cluster, topic_name, AvroSerializer(registry, json.dumps(counted)),
            [{"id": "small", "amount": 1.0, "currency": "EUR", "items": 7}])
    produce(cluster, topic_name, AvroSerializer(registry, json.dumps(promoted)),
            [{"id": "large", "amount": 2.0, "currency": "EUR", "items": 2**40}])
    assert registry.get_versions(f"{topic_name}-value") == [1, 2]
    for table in caught_up_replicas(cluster, topic_name, 2):
        items = pa.schema(table.schema().to_arrow()).field("value_fields").type.field("items")
        assert items.type == pa.int64()
        rows = table.to_pyarrow_table(columns=["offset", "value_fields"]).sort_by("offset")
        assert [v["items"] for v in rows.column("value_fields").to_pylist()] == [7, 2**40]


def test_a_record_its_schema_does_not_read_is_refused_and_nothing_is_written(
        cluster, registry, topic_name) -> None:
    typed_topic(cluster, topic_name)
    serializer = AvroSerializer(registry, json.dumps(PAYMENT_V1))
    produce(cluster, topic_name, serializer, [{"id": "ok", "amount": 1.0, "currency": "EUR"}])
    schema_id, _ = split_wire(serializer({"id": "x", "amount": 0.0, "currency": "EUR"},
                                         SerializationContext(topic_name, MessageField.VALUE)))
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "acks": "all", "retries": 0})
    outcome: list[Any] = []
    producer.produce(topic_name, wire_header(schema_id) + b"\xff", partition=0,
                     on_delivery=lambda e, _m: outcome.append(e))
    producer.flush(60)
    assert outcome[0] is not None and outcome[0].code() == KafkaError.INVALID_RECORD
    table = replica_tables(cluster, topic_name)[0]
    table.update_incremental()
    assert table.to_pyarrow_table(columns=["offset"]).num_rows == 1


def test_spark_writes_a_typed_dataframe_encoded_with_the_subjects_latest_schema(
        cluster, registry, topic_name, spark) -> None:
    """The sink takes a struct `value` and encodes it as Confluent's serializers would: the
    broker decodes it back into the same typed columns; a row its schema does not fit fails
    the write, and nothing of it is written."""
    typed_topic(cluster, topic_name)
    registry.register_schema(f"{topic_name}-value", Schema(json.dumps(PAYMENT_V1), "AVRO"))
    rows = [(f"s{i}", 2.5 * i, ("EUR", "USD")[i % 2]) for i in range(40)]
    frame = spark.createDataFrame(rows, "id string, amount double, currency string")
    (frame.selectExpr("struct(id, amount, currency) AS value").write.format("deltabus")
     .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
     .option("topic", topic_name).mode("append").save())
    table = replica_tables(cluster, topic_name)[0]
    table.update_incremental()
    written = table.to_pyarrow_table(columns=["value_fields"]).column("value_fields")
    assert sorted(written.to_pylist(), key=lambda v: v["id"]) == sorted(
        [{"id": i, "amount": a, "currency": c} for i, a, c in rows], key=lambda v: v["id"])
    wrong = spark.createDataFrame([("x", "not a number")], "id string, amount string")
    with pytest.raises(Exception, match="does not fit the latest schema"):
        (wrong.selectExpr("struct(id, amount) AS value").write.format("deltabus")
         .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
         .option("topic", topic_name).mode("append").save())
    table.update_incremental()
    assert table.to_pyarrow_table(columns=["offset"]).num_rows == 40


def test_the_spark_source_gives_the_typed_columns_when_asked_streaming_and_batch(
        cluster, registry, topic_name, spark, tmp_path) -> None:
    """`format("deltabus")` with valueFields=true: a stream defined on a typed topic that holds
    no record yet takes its type from the subject's latest schema, and reads the records
    produced after it as typed columns; a batch read after an evolution reads every record
    in the unified type (null where a record's version has no such field). An untyped topic
    refuses the option, saying why."""
    typed_topic(cluster, topic_name)
    registry.register_schema(f"{topic_name}-value", Schema(json.dumps(PAYMENT_V1), "AVRO"))

    def source(kind: str, topic: str = topic_name) -> Any:
        reader = spark.readStream if kind == "stream" else spark.read
        return (reader.format("deltabus")
                .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
                .option("subscribe", topic).option("startingOffsets", "earliest")
                .option("valueFields", "true").load())

    stream = source("stream")
    assert stream.schema["value_fields"].dataType.simpleString() == (
        "struct<id:string,amount:double,currency:string>")
    payments = [{"id": f"s{i}", "amount": 1.0 * i, "currency": "EUR"} for i in range(5)]
    produce(cluster, topic_name, AvroSerializer(registry, json.dumps(PAYMENT_V1)), payments)
    name = f"typed_{topic_name.replace('-', '_')}"
    query = (stream.select("offset", "value_fields").writeStream.format("memory")
             .queryName(name).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    rows = spark.sql(f"SELECT value_fields FROM {name} ORDER BY offset").collect()
    assert [r.value_fields.asDict() for r in rows] == payments

    produce(cluster, topic_name, AvroSerializer(registry, json.dumps(PAYMENT_V2)),
            [{"id": "v2", "amount": 9.0, "currency": "USD", "note": "evolved"}])
    read = source("batch").orderBy("offset").select("value_fields.id", "value_fields.note")
    assert [(r.id, r.note) for r in read.collect()] == (
        [(p["id"], None) for p in payments] + [("v2", "evolved")])

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(f"{topic_name}-plain", 1, 1)])
    with pytest.raises(Exception, match="none of the query's topics is typed"):
        source("batch", f"{topic_name}-plain").collect()


CUSTOMER_KEY = {"type": "record", "name": "CustomerKey", "namespace": "shop",
                "fields": [{"name": "region", "type": "string"},
                           {"name": "customer", "type": "long"}]}


def test_typed_keys_are_decoded_beside_the_values_and_read_by_spark(
        cluster, registry, topic_name, spark) -> None:
    """With key.schema.subject a topic's keys are checked and decoded like its values: every
    replica's table holds them as `key_fields` (null for a record without key), Spark reads
    them with read_topic(key_fields=True) and the source's keyFields option, and a key its
    schema does not read is refused with nothing written."""
    typed_topic(cluster, topic_name, keys=True)
    keys = AvroSerializer(registry, json.dumps(CUSTOMER_KEY))
    values = AvroSerializer(registry, json.dumps(PAYMENT_V1))
    key_context = SerializationContext(topic_name, MessageField.KEY)
    value_context = SerializationContext(topic_name, MessageField.VALUE)
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "acks": "all", "retries": 0})
    outcomes: list[Any] = []
    sent = [({"region": "eu", "customer": 7}, {"id": "a", "amount": 1.0, "currency": "EUR"}),
            (None, {"id": "b", "amount": 2.0, "currency": "USD"})]
    for key, value in sent:
        producer.produce(topic_name, values(value, value_context), partition=0,
                         key=None if key is None else keys(key, key_context),
                         on_delivery=lambda e, _m: outcomes.append(e))
        producer.flush(60)
    schema_id, _ = split_wire(keys({"region": "x", "customer": 1}, key_context))
    producer.produce(topic_name, values(sent[0][1], value_context), partition=0,
                     key=wire_header(schema_id) + b"\xff",
                     on_delivery=lambda e, _m: outcomes.append(e))
    producer.flush(60)
    assert outcomes[:2] == [None, None]
    assert outcomes[2] is not None and outcomes[2].code() == KafkaError.INVALID_RECORD
    expected = [k for k, _ in sent]
    for table in caught_up_replicas(cluster, topic_name, 2):
        rows = table.to_pyarrow_table(columns=["offset", "key_fields", "value_fields"]
                                      ).sort_by("offset")
        assert rows.column("key_fields").to_pylist() == expected
        assert rows.column("value_fields").to_pylist() == [v for _, v in sent]
    read = read_topic(spark, cluster.bootstrap_servers, topic_name, key_fields=True)
    assert [r.key_fields and r.key_fields.asDict()
            for r in read.orderBy("offset").collect()] == expected
    live = (spark.read.format("deltabus")
            .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
            .option("subscribe", topic_name).option("keyFields", "true").load())
    assert live.schema["key_fields"].dataType.simpleString() == (
        "struct<region:string,customer:bigint>")
    assert [r.key_fields and r.key_fields.asDict()
            for r in live.orderBy("offset").collect()] == expected


def test_spark_writes_a_typed_key_encoded_with_the_key_subject_and_partitioned_by_it(
        cluster, registry, topic_name, spark) -> None:
    """The sink encodes a struct `key` with `<topic>-key`'s latest schema, byte for byte as
    Confluent's AvroSerializer does, and partitions by those bytes as a Kafka producer does:
    the broker decodes the keys into `key_fields`; a null key stays null; a key its schema
    does not fit fails the write."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 1, configs={
            "key.schema.subject": f"{topic_name}-key",
            "value.schema.subject": f"{topic_name}-value"})])
    registry.register_schema(f"{topic_name}-key", Schema(json.dumps(CUSTOMER_KEY), "AVRO"))
    registry.register_schema(f"{topic_name}-value", Schema(json.dumps(PAYMENT_V1), "AVRO"))
    rows = [(("eu", "us")[i % 2], i % 5, f"p{i}", 1.0 * i, "EUR") for i in range(30)]
    frame = spark.createDataFrame(rows, "region string, customer long, id string, "
                                        "amount double, currency string")
    (frame.selectExpr("IF(customer = 0, NULL, struct(region, customer)) AS key",
                      "struct(id, amount, currency) AS value")
     .write.format("deltabus").option("kafka.bootstrap.servers", cluster.bootstrap_servers)
     .option("topic", topic_name).mode("append").save())

    keys = AvroSerializer(registry, json.dumps(CUSTOMER_KEY),
                          conf={"auto.register.schemas": False, "use.latest.version": True})
    context = SerializationContext(topic_name, MessageField.KEY)
    read = read_topic(spark, cluster.bootstrap_servers, topic_name, key_fields=True,
                      value_fields=True).collect()
    assert len(read) == len(rows)
    for row in read:
        region, number = rows[int(row.value_fields.id[1:])][:2]  # id p<i>: row i
        if number == 0:
            assert row.key is None and row.key_fields is None
            continue
        assert row.key == keys({"region": region, "customer": number}, context)
        assert row.key_fields.asDict() == {"region": region, "customer": number}
        assert row.partition == partition_for_key(bytes(row.key), 2)
    assert {r.partition for r in read if r.key is not None} == {0, 1}

    wrong = spark.createDataFrame([("eu", "seven", "x", 1.0, "EUR")],
                                  "region string, customer string, id string, amount double, "
                                  "currency string")
    with pytest.raises(Exception, match="row's key does not fit the latest schema"):
        (wrong.selectExpr("struct(region, customer) AS key",
                          "struct(id, amount, currency) AS value")
         .write.format("deltabus").option("kafka.bootstrap.servers", cluster.bootstrap_servers)
         .option("topic", topic_name).mode("append").save())
    assert read_topic(spark, cluster.bootstrap_servers, topic_name).count() == len(rows)


def test_a_first_record_without_key_or_value_leaves_the_typed_columns_to_later_ones(
        cluster, registry, topic_name) -> None:
    """A typed topic's first commit may hold no key (or only a tombstone): its typed columns
    must not take the null type, which no later key or value could be written into (a Spark
    write of a few null keys first once failed every keyed batch after it)."""
    typed_topic(cluster, topic_name, keys=True)
    keys = AvroSerializer(registry, json.dumps(CUSTOMER_KEY))
    values = AvroSerializer(registry, json.dumps(PAYMENT_V1))
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "acks": "all", "retries": 0})
    outcomes: list[Any] = []
    key, value = {"region": "eu", "customer": 1}, {"id": "a", "amount": 1.0, "currency": "EUR"}
    for k, v in ((None, None), (key, value)):
        producer.produce(
            topic_name, partition=0,
            key=None if k is None else keys(k, SerializationContext(topic_name, MessageField.KEY)),
            value=None if v is None else values(v, SerializationContext(topic_name,
                                                                        MessageField.VALUE)),
            on_delivery=lambda e, _m: outcomes.append(e))
        producer.flush(60)
    assert outcomes == [None, None]
    for table in caught_up_replicas(cluster, topic_name, 2):
        rows = table.to_pyarrow_table(columns=["offset", "key_fields", "value_fields"]
                                      ).sort_by("offset")
        assert rows.column("key_fields").to_pylist() == [None, key]
        assert rows.column("value_fields").to_pylist() == [None, value]


def test_deltabus_consumer_decodes_typed_records_with_the_schema_deserializer(
        cluster, registry, topic_name) -> None:
    """deltabus's Consumer takes kafka-python's key_deserializer and value_deserializer, and
    SchemaDeserializer decodes the registry's wire format as confluent-kafka's deserializers
    do (a tombstone stays None). A record it cannot decode is raised, naming its offset, once
    the records before it are returned; the position stays at it until the consumer seeks
    past it, as Kafka's consumer does."""
    with AdminClient(cluster.bootstrap_servers) as admin:  # untyped: any bytes are written
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    keys = AvroSerializer(registry, json.dumps(CUSTOMER_KEY))
    values = AvroSerializer(registry, json.dumps(PAYMENT_V1))
    key_context = SerializationContext(topic_name, MessageField.KEY)
    value_context = SerializationContext(topic_name, MessageField.VALUE)
    key = {"region": "eu", "customer": 3}
    first, last = ({"id": i, "amount": 2.0, "currency": "EUR"} for i in ("a", "d"))
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        producer.send(topic_name, values(first, value_context), key=keys(key, key_context),
                      partition=0).get(30)
        producer.send(topic_name, None, key=keys(key, key_context), partition=0).get(30)
        producer.send(topic_name, b"not the wire format", partition=0).get(30)
        producer.send(topic_name, values(last, value_context), partition=0).get(30)
    tp = TopicPartition(topic_name, 0)
    with SchemaDeserializer(cluster.bootstrap_servers) as decode:
        consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest",
                            key_deserializer=decode, value_deserializer=decode)
        consumer.assign([tp])
        got: list[Any] = []
        wait_until(lambda: got.extend(consumer.poll(500)) or len(got) >= 2,
                   "the records before the one that does not decode")
        assert [(r.offset, r.key, r.value) for r in got] == [(0, key, first), (1, key, None)]
        for _ in range(2):
            with pytest.raises(errors.ClientError, match=f"{topic_name}-0 at offset 2"):
                consumer.poll(10_000)
            assert consumer.position(tp) == 2
        consumer.seek(tp, 3)
        rest: list[Any] = []
        wait_until(lambda: rest.extend(consumer.poll(500)) or bool(rest), "the record after it")
        assert [(r.offset, r.key, r.value) for r in rest] == [(3, None, last)]
        consumer.close()
