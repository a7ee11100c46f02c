"""OffsetCommit from a hostile or broken client, on both doors (gRPC and Kafka's protocol) of
the real group coordinator, in front of in-memory brokers (no Spark).

What the coordinator keeps for ever (`__consumer_offsets`, and its copy in driver memory) must be
bounded by what the cluster has: a partition of a topic that does not exist is answered
UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers it, and not stored; a request with more entries than
`offset.commit.partitions.max` is refused whole (INVALID_REQUEST); a refusal never echoes a
hostile name back once per partition. After each, the coordinator serves the next commit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus.rpc.channel import open_channel
from deltabus.rpc.kafka.frames import make, nested
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.security.acls import Authorizer
from tests.client.fake_cluster import FakeCluster
from tests.kafka import raw_frames

OFFSET_COMMIT, OFFSET_COMMIT_VERSION = 8, 8
TopicPartition = tuple[str, int]


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    fake = FakeCluster(brokers=1)
    fake.create_topic("orders", 2)
    fake.serve_kafka(0)  # opens the coordinator's Kafka door too
    yield fake
    fake.close()


@pytest.fixture
def stub(fake: FakeCluster) -> Iterator[pb_grpc.DeltaBusStub]:
    """The gRPC door of the broker that serves the group calls."""
    channel = open_channel(fake.brokers[0].address, "test")
    yield pb_grpc.DeltaBusStub(channel)
    channel.close()


def grpc_commit(stub: pb_grpc.DeltaBusStub, group: str, offsets: dict[TopicPartition, int]
                ) -> tuple[dict[TopicPartition, tuple[int, str]], int]:
    """Each partition's (error code, message), and the answer's size in bytes."""
    response = stub.OffsetCommit(pb.OffsetCommitRequest(group_id=group, partitions=[
        pb.OffsetCommitPartition(topic=t, partition=p, committed_offset=o)
        for (t, p), o in offsets.items()]), timeout=60)
    answers = {(r.topic, r.partition): (r.error_code, r.error_message) for r in response.results}
    return answers, response.ByteSize()


def kafka_commit(fake: FakeCluster, group: str, offsets: dict[TopicPartition, int]
                 ) -> dict[TopicPartition, int]:
    """OffsetCommit v8 as raw frames to the coordinator's Kafka door: each partition's code."""
    cls = load_request_schema(OFFSET_COMMIT, OFFSET_COMMIT_VERSION)
    topic_cls, partition_cls = (nested(cls, n) for n in ("OffsetCommitRequestTopic",
                                                          "OffsetCommitRequestPartition"))
    by_topic: dict[str, list[object]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(partition_cls(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
            committed_metadata=""))
    body = make(cls, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                group_instance_id=None, topics=tuple(
                    topic_cls(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
    assert fake.kafka_coordinator is not None
    answer = raw_frames.call(fake.kafka_coordinator, OFFSET_COMMIT, OFFSET_COMMIT_VERSION, body)
    return {(t.name, p.partition_index): int(p.error_code)
            for t in answer.topics for p in t.partitions}


def committed(fake: FakeCluster, group: str) -> dict[TopicPartition, int]:
    return {tp: om.offset for tp, om in fake.coordinator.fetch_offsets(group).items()}


def test_grpc_answers_unknown_topics_and_partitions_and_stores_only_the_rest(fake, stub):
    answers, _ = grpc_commit(stub, "g", {("orders", 0): 5, ("orders", 2): 5, ("nope", 0): 5})
    assert {tp: code for tp, (code, _) in answers.items()} == {
        ("orders", 0): 0, ("orders", 2): pb.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert committed(fake, "g") == {("orders", 0): 5}
    only_unknown, _ = grpc_commit(stub, "ghost", {("nope", 0): 1})
    assert only_unknown[("nope", 0)][0] == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert fake.coordinator.describe_group("ghost").state == "Dead"  # no group was made


def test_kafka_door_answers_unknown_topics_and_partitions_and_stores_only_the_rest(fake):
    answers = kafka_commit(fake, "g", {("orders", 1): 7, ("orders", 9): 7, ("nope", 0): 7})
    assert answers == {("orders", 1): ErrorCode.none,
                       ("orders", 9): ErrorCode.unknown_topic_or_partition,
                       ("nope", 0): ErrorCode.unknown_topic_or_partition}
    assert committed(fake, "g") == {("orders", 1): 7}


def test_a_commit_of_more_partitions_than_the_limit_is_refused_whole(fake, stub):
    limit = cfg.GroupConfig().offset_commit_partitions_max
    many = {("orders", 0): 1} | {("nope", p): 1 for p in range(limit)}
    answers, _ = grpc_commit(stub, "g", many)
    assert {code for code, _ in answers.values()} == {pb.INVALID_REQUEST}
    assert f"{limit}" in answers[("orders", 0)][1]
    assert "offset.commit.partitions.max" in answers[("orders", 0)][1]
    assert set(kafka_commit(fake, "g", many).values()) == {ErrorCode.invalid_request}
    assert committed(fake, "g") == {}
    assert grpc_commit(stub, "g", {("orders", 0): 3})[0][("orders", 0)][0] == 0  # still serves
    assert committed(fake, "g") == {("orders", 0): 3}


def test_a_topic_name_past_kafkas_limit_is_unknown_and_not_echoed_per_partition(fake, stub):
    huge = "t" * 1_000_000
    offsets = {(huge, p): 1 for p in range(3)} | {("orders", 0): 2}
    answers, size = grpc_commit(stub, "g", offsets)
    code, message = answers[(huge, 0)]
    assert code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert str(cfg.TOPIC_NAME_LENGTH_MAX) in message and len(message) < 1000
    assert size < 3 * len(huge) + 10_000  # the topic field per partition, no more
    assert kafka_commit(fake, "g", offsets)[(huge, 1)] == ErrorCode.unknown_topic_or_partition
    assert committed(fake, "g") == {("orders", 0): 2}


def test_a_group_id_past_the_limit_is_refused_without_echoing_it_per_partition(fake, stub):
    group = "g" * 100_000
    offsets = {("orders", p % 2): 1 for p in range(2)} | {("nope", p): 1 for p in range(200)}
    answers, size = grpc_commit(stub, group, offsets)
    code, message = answers[("orders", 0)]
    assert code == pb.INVALID_GROUP_ID
    assert str(cfg.GROUP_ID_LENGTH_MAX) in message and len(message) < 1000
    assert size < 100_000  # 202 partitions: an echoed group id would make it 20 MB
    assert set(kafka_commit(fake, group, offsets).values()) == {ErrorCode.invalid_group_id}
    assert fake.coordinator.list_groups() == []  # nothing stored, no group made
    assert grpc_commit(stub, "g", {("orders", 1): 4})[0][("orders", 1)][0] == 0



def test_limits_come_before_the_acl_check_whose_refusal_names_the_group(fake, stub):
    """With an authorizer, a refusal names the group: the group id's limit is checked first,
    so a refusal is never 200 copies of a 100 KB group id."""
    fake.authorizer = Authorizer([])  # nobody may do anything
    offsets = {("nope", p): 1 for p in range(200)}
    answers, size = grpc_commit(stub, "g" * 100_000, offsets)
    assert {code for code, _ in answers.values()} == {pb.INVALID_GROUP_ID}
    assert size < 100_000
    answers, _ = grpc_commit(stub, "g", offsets)
    assert {code for code, _ in answers.values()} == {pb.GROUP_AUTHORIZATION_FAILED}
