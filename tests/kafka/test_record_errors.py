"""Per-record produce errors (KIP-467) through the Kafka door, on the shared cluster: a batch
holding invalid records is refused as a whole with INVALID_RECORD, and Produce v8+ names each
offending record (its index in the record batch as the client sent it, and why) in
`record_errors`, with the batch's `error_message`. The other records of the batch are not
written either. kafka-python reads `record_errors` as Kafka's Java client does: each named
record fails with INVALID_RECORD, its batch-mates with a plain KafkaError, so an application can
tell which records to fix and which to send again."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka import errors as kafka_errors
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic
from deltabus.rpc.kafka.frames import make, nested
from deltabus.schemas import wire_header
from deltabus.schemas.avro import encode_avro, parse_avro
from tests.kafka.raw_frames import PRODUCE, call

KEYS = [b"k0", None, b"k2", None, b"k4"]  # records 1 and 3 have no key
COMPACTED = {"cleanup.policy": "compact"}
NO_KEY = "Compacted topic cannot accept message without key in topic partition {}-0."


PAYMENT = json.dumps({"type": "record", "name": "Payment",
                      "fields": [{"name": "id", "type": "string"}]})


def keyed_batch(keys: list[bytes | None], values: list[bytes] | None = None) -> bytes:
    """One record batch of a record per key (values v0, v1, ... unless given)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i, key in enumerate(keys):
        value = values[i] if values is not None else f"v{i}".encode()
        builder.append(i, timestamp=None, key=key, value=value, headers=[])
    return bytes(builder.build())


def produce(cluster: Any, topic: str, records: bytes, version: int) -> Any:
    """The partition answer of a Produce (acks=1) of `records` to `topic`-0, at its leader."""
    image = cluster.controller.image()
    leader = image.broker(image.partition(topic, 0).leader)
    cls = load_request_schema(PRODUCE, version)
    data = nested(cls, "PartitionProduceData")(index=0, records=records)
    answer = call(f"{leader.host}:{leader.kafka_port}", PRODUCE, version, make(
        cls, transactional_id=None, acks=1, timeout=timedelta(seconds=30),
        topic_data=(nested(cls, "TopicProduceData")(name=topic, partition_data=(data,)),)))
    (topic_answer,) = answer.responses
    (partition,) = topic_answer.partition_responses
    return partition


def create(cluster: Any, topic: str, configs: dict[str, str]) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, configs=configs)])


@pytest.mark.parametrize("version", [8, 9])
def test_a_batch_with_keyless_records_to_a_compacted_topic_names_them(
        cluster, topic_name, version) -> None:
    create(cluster, topic_name, COMPACTED)
    refused = produce(cluster, topic_name, keyed_batch(KEYS), version)
    assert refused.error_code == ErrorCode.invalid_record
    assert [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors] == [
        (1, NO_KEY.format(topic_name)), (3, NO_KEY.format(topic_name))]
    assert refused.error_message and NO_KEY.format(topic_name) in refused.error_message
    assert refused.base_offset == -1
    # Nothing of the refused batch was written: the next batch starts the log.
    taken = produce(cluster, topic_name, keyed_batch([b"a", b"b"]), version)
    assert (taken.error_code, taken.base_offset, taken.record_errors) == (ErrorCode.none, 0, ())


def test_a_version_before_kip_467_gets_invalid_record_alone(cluster, topic_name) -> None:
    create(cluster, topic_name, COMPACTED)
    refused = produce(cluster, topic_name, keyed_batch(KEYS), 7)
    assert refused.error_code == ErrorCode.invalid_record
    assert not hasattr(refused, "record_errors")


def sent_apart(cluster: Any, topic: str, records: list[tuple[bytes | None, bytes]]
               ) -> list[Exception | None]:
    """What kafka-python's future of each record (key, value) sent to `topic`-0 in one batch
    failed with (None: it was written)."""
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks=1,
                             linger_ms=500, retries=0)
    try:
        futures = [producer.send(topic, key=key, value=value, partition=0)
                   for key, value in records]
        producer.flush(60)
        return [f.exception for f in futures]
    finally:
        producer.close(5)


def test_kafka_python_fails_the_keyless_records_and_their_batch_mates_apart(
        cluster, topic_name) -> None:
    """kafka-python sends the five records in one batch (linger) and maps the answer to each
    record's future, as Kafka's Java client: INVALID_RECORD with the broker's message for
    records 1 and 3, the generic "part of a batch" error for the others; none is written."""
    create(cluster, topic_name, COMPACTED)
    failures = sent_apart(cluster, topic_name, [(key, f"v{i}".encode())
                                                for i, key in enumerate(KEYS)])
    assert [type(e) for e in failures] == [
        kafka_errors.KafkaError, kafka_errors.InvalidRecordError,
        kafka_errors.KafkaError, kafka_errors.InvalidRecordError, kafka_errors.KafkaError]
    assert NO_KEY.format(topic_name) in str(failures[1])
    assert "part of a batch" in str(failures[0])
    assert sent_apart(cluster, topic_name, [(b"k", b"v")]) == [None]
    assert produce(cluster, topic_name, keyed_batch([b"a"]), 9).base_offset == 1


def test_records_a_validating_topic_cannot_read_are_named_apart_from_the_others(
        cluster, topic_name) -> None:
    """confluent.value.schema.validation=true: a value not in the registry's wire format and
    one its schema cannot read refuse their batch, each named with its own reason."""
    create(cluster, topic_name, {"confluent.value.schema.validation": "true"})
    schema_id = cluster.controller.schema_registry.register_schema(
        f"{topic_name}-value", "AVRO", PAYMENT, ()).schema_id
    good = wire_header(schema_id) + encode_avro(parse_avro(PAYMENT, {}), [{"id": "p"}])[0]
    values = [good, b"plain text", good, wire_header(schema_id) + b"\x01", good]
    failures = sent_apart(cluster, topic_name, [(None, v) for v in values])
    assert [type(e) for e in failures] == [
        kafka_errors.KafkaError, kafka_errors.InvalidRecordError,
        kafka_errors.KafkaError, kafka_errors.InvalidRecordError, kafka_errors.KafkaError]
    assert "magic byte" in str(failures[1])
    assert f"does not match schema id {schema_id}" in str(failures[3])
    # Nothing of the refused batch was written: the next batch starts the log.
    assert produce(cluster, topic_name, keyed_batch([None], [good]), 9).base_offset == 0
