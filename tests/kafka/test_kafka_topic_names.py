"""Kafka's rules for topic names at the Kafka door: a name no topic may have ("bad name!", "..",
250 characters) is INVALID_TOPIC_EXCEPTION in Metadata (with auto-creation or without), in
CreateTopics and in Produce: an error clients give up on at once, where UNKNOWN_TOPIC_OR_PARTITION
has them wait for the topic until they time out. Driven by confluent-kafka and kafka-python,
unmodified, against the shared cluster; the Produce no client sends for such a name (Metadata
refused it first) goes as a raw frame."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from confluent_kafka.admin import NewTopic as ConfluentNewTopic
from kafka.admin import KafkaAdminClient

from deltabus import AdminClient, NewTopic
from tests.kafka import raw_frames

ILLEGAL = ["bad name!", "..", "x" * 250]
INVALID_TOPIC_EXCEPTION = 17


def test_librdkafka_fails_a_record_for_an_illegal_topic_at_once(cluster) -> None:
    """The producer's Metadata may auto-create the topic; the name cannot be one, so the record
    fails with TOPIC_EXCEPTION within seconds rather than waiting out message.timeout.ms."""
    failed: list[KafkaError] = []
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "message.timeout.ms": 60_000})
    started = time.monotonic()
    for name in ILLEGAL:
        producer.produce(name, b"never stored", on_delivery=lambda e, _: failed.append(e))
    assert producer.flush(30) == 0
    assert [e.code() for e in failed] == [KafkaError.TOPIC_EXCEPTION] * len(ILLEGAL)
    assert time.monotonic() - started < 10
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert not set(ILLEGAL) & set(admin.list_topics())


def test_create_topics_and_metadata_answer_invalid_topic_exception(cluster, topic_name) -> None:
    """librdkafka's CreateTopics gets TOPIC_EXCEPTION (17) for each illegal name, with Kafka's
    message, whatever the topics' folder holds ("..", taken for a path, named the folder above
    it, which holds a topic: TOPIC_ALREADY_EXISTS); kafka-python's Metadata without
    auto-creation gets 17 per topic, not 3."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    librdkafka = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    futures = librdkafka.create_topics([ConfluentNewTopic(name, 1, 1) for name in ILLEGAL])
    for name, future in futures.items():
        with pytest.raises(KafkaException) as refused:
            future.result(30)
        error = refused.value.args[0]
        assert error.code() == KafkaError.TOPIC_EXCEPTION, (name, error)
        assert "illegal" in error.str() or '"."' in error.str(), error.str()
    theirs = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        described = theirs.describe_topics(ILLEGAL)
    finally:
        theirs.close()
    assert {t["name"]: t["error_code"] for t in described} == dict.fromkeys(
        ILLEGAL, INVALID_TOPIC_EXCEPTION)


def test_produce_to_an_illegal_topic_is_invalid_topic_exception(cluster) -> None:
    """A Produce naming an illegal topic gets INVALID_TOPIC_EXCEPTION for its partition, on a
    broker's listener and on the bootstrap's (the driver's, which leads no partition)."""
    node = cluster.controller.image().broker(0)
    assert node is not None
    for address in (cluster.kafka_bootstrap_servers, f"{node.host}:{node.kafka_port}"):
        with raw_frames.connect_to(address, timeout_s=30) as sock:
            sock.sendall(raw_frames.produce("bad name!", [b"never stored"]))
            _, answer = raw_frames.read_response(sock, raw_frames.PRODUCE, 9)
        (topic,) = answer.responses
        assert [p.error_code for p in topic.partition_responses] == [INVALID_TOPIC_EXCEPTION]
