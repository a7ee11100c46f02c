"""What one Fetch or ListOffsets may name, on the Kafka door: at most REQUEST_PARTITIONS_MAX
partitions, none twice. A Fetch breaking either is answered INVALID_REQUEST as a whole (no
partition read); a ListOffsets entry of a partition named twice gets INVALID_REQUEST, as Kafka
answers it. The connection stays open and serves the next request. No Spark: the real Kafka
listener in front of in-memory brokers (tests/client/fake_cluster.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus.rpc.kafka.apis import FETCH, LIST_OFFSETS
from deltabus.rpc.kafka.frames import make, nested
from tests.client.fake_cluster import FakeCluster
from tests.kafka.test_listener import frame, read_response

TOPIC = "t"
FETCH_VERSION, LIST_OFFSETS_VERSION = 12, 7


@pytest.fixture
def door() -> Iterator[socket.socket]:
    """A connection to broker 0's Kafka listener; partitions 0 and 1 of TOPIC, 0 holds 2."""
    fake = FakeCluster(brokers=1)
    fake.create_topic(TOPIC, 2)
    fake.write(TOPIC, 0, [b"a", b"b"])
    host, port = fake.serve_kafka(0).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        yield sock
    fake.close()


def fetch(sock: socket.socket, partitions: list[tuple[str, int]]) -> Any:
    cls = load_request_schema(FETCH, FETCH_VERSION)
    topic_cls, partition_cls = nested(cls, "FetchTopic"), nested(cls, "FetchPartition")
    topics = tuple(make(topic_cls, topic=topic, partitions=(make(
        partition_cls, partition=p, current_leader_epoch=-1, fetch_offset=0,
        log_start_offset=-1, partition_max_bytes=1 << 20),)) for topic, p in partitions)
    sock.sendall(frame(FETCH, FETCH_VERSION, make(
        cls, replica_id=-1, max_wait=timedelta(0), min_bytes=0, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(),
        rack_id="", topics=topics)))
    return read_response(sock, FETCH, FETCH_VERSION)[1]


def list_offsets(sock: socket.socket, partitions: list[tuple[str, int]]) -> Any:
    cls = load_request_schema(LIST_OFFSETS, LIST_OFFSETS_VERSION)
    topic_cls, partition_cls = (nested(cls, "ListOffsetsTopic"),
                                nested(cls, "ListOffsetsPartition"))
    topics = tuple(make(topic_cls, name=topic, partitions=(make(
        partition_cls, partition_index=p, current_leader_epoch=-1, timestamp=-1),))
        for topic, p in partitions)
    sock.sendall(frame(LIST_OFFSETS, LIST_OFFSETS_VERSION, make(
        cls, replica_id=-1, isolation_level=0, topics=topics)))
    return read_response(sock, LIST_OFFSETS, LIST_OFFSETS_VERSION)[1]


def test_a_fetch_naming_a_partition_twice_is_refused_whole_and_the_next_one_served(
        door) -> None:
    body = fetch(door, [(TOPIC, 0)] * 1000 + [(TOPIC, 1)])
    assert body.error_code == ErrorCode.invalid_request
    answered = [p for t in body.responses for p in t.partitions]
    assert len(answered) == 1001
    assert all(p.error_code == ErrorCode.invalid_request and not p.records for p in answered)
    body = fetch(door, [(TOPIC, 0), (TOPIC, 1)])
    assert body.error_code == ErrorCode.none
    assert [p.error_code for t in body.responses for p in t.partitions] == [ErrorCode.none] * 2
    assert body.responses[0].partitions[0].records


def test_a_fetch_naming_more_partitions_than_the_limit_is_refused(door) -> None:
    body = fetch(door, [(f"t{i}", 0) for i in range(cfg.REQUEST_PARTITIONS_MAX + 1)])
    assert body.error_code == ErrorCode.invalid_request
    assert fetch(door, [(TOPIC, 0)]).error_code == ErrorCode.none


def test_list_offsets_answers_each_entry_of_a_partition_named_twice_with_invalid_request(
        door) -> None:
    body = list_offsets(door, [(TOPIC, 0), (TOPIC, 1), (TOPIC, 0)])
    entries = [(p.partition_index, p.error_code, p.offset)
               for t in body.topics for p in t.partitions]
    assert entries == [(0, ErrorCode.invalid_request, -1), (1, ErrorCode.none, 0),
                       (0, ErrorCode.invalid_request, -1)]


def test_list_offsets_naming_more_partitions_than_the_limit_is_refused(door) -> None:
    body = list_offsets(door, [(f"t{i}", 0) for i in range(cfg.REQUEST_PARTITIONS_MAX + 1)])
    assert {p.error_code for t in body.topics for p in t.partitions} == {
        ErrorCode.invalid_request}
    (latest,) = list_offsets(door, [(TOPIC, 0)]).topics[0].partitions
    assert (latest.error_code, latest.offset) == (ErrorCode.none, 2)
