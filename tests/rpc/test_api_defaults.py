"""A client written from deltabus.proto alone leaves fields out; the server then applies Kafka's
defaults, never proto3's zeros. Each test sends raw gRPC requests, as a Node or Go client would,
to the shared cluster, and checks what a user sees: an absent acks waits for the in-sync
replicas, a fetch without a format gets `records`, a topic without counts gets the cluster's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from deltabus import AdminClient, NewTopic, errors
from deltabus.records import produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc

DEADLINE_S = 30


@pytest.fixture
def stubs(cluster) -> Iterator[dict[int | str, pb_grpc.DeltaBusStub]]:
    """A raw stub per broker id, and "controller" for the bootstrap address."""
    channels = {"controller": grpc.insecure_channel(cluster.bootstrap_servers)}
    for broker in cluster.controller.image().brokers:
        channels[broker.broker_id] = grpc.insecure_channel(broker.address)
    yield {k: pb_grpc.DeltaBusStub(c) for k, c in channels.items()}
    for channel in channels.values():
        channel.close()


def create(cluster, name: str, partitions: int = 1, rf: int = 1, **configs: str) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(name, partitions, rf, configs or None)])


def leader(cluster, stubs, topic: str) -> pb_grpc.DeltaBusStub:
    return stubs[cluster.controller.image().partition(topic, 0).leader]


def produce_data(topic: str, *values: bytes) -> pb.PartitionProduceData:
    return pb.PartitionProduceData(topic=topic, partition=0,
                                   arrow_records=to_ipc(produce_batch(list(values))))


def test_produce_without_acks_waits_for_every_in_sync_replica(cluster, stubs, topic_name):
    create(cluster, topic_name, rf=3)
    response = leader(cluster, stubs, topic_name).Produce(
        pb.ProduceRequest(partitions=[produce_data(topic_name, b"a", b"b", b"c")]),
        timeout=DEADLINE_S)
    (answer,) = response.partitions
    assert (answer.error_code, answer.base_offset) == (0, 0)  # acks=0 would answer offset -1
    # acks=all answers once the high watermark passed the records: readable at once.
    fetched = leader(cluster, stubs, topic_name).Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=topic_name, partition=0, fetch_offset=0)]), timeout=DEADLINE_S)
    assert fetched.partitions[0].high_watermark == 3
    assert [r.value for r in fetched.partitions[0].records] == [b"a", b"b", b"c"]


def test_produce_without_acks_is_refused_below_min_insync_replicas(cluster, stubs, topic_name):
    """acks=all checks min.insync.replicas before appending; acks=1 does not."""
    create(cluster, topic_name, rf=1, **{"min.insync.replicas": "2"})
    stub = leader(cluster, stubs, topic_name)
    (refused,) = stub.Produce(pb.ProduceRequest(partitions=[produce_data(topic_name, b"x")]),
                              timeout=DEADLINE_S).partitions
    assert refused.error_code == pb.NOT_ENOUGH_REPLICAS == errors.NotEnoughReplicasError.code
    (written,) = stub.Produce(pb.ProduceRequest(acks=pb.ACKS_LEADER, partitions=[
        produce_data(topic_name, b"y")]), timeout=DEADLINE_S).partitions
    assert (written.error_code, written.base_offset) == (0, 0)  # nothing before it


def test_produce_with_acks_zero_set_is_fire_and_forget(cluster, stubs, topic_name):
    create(cluster, topic_name)
    (answer,) = leader(cluster, stubs, topic_name).Produce(pb.ProduceRequest(
        acks=pb.ACKS_NONE, partitions=[produce_data(topic_name, b"x")]),
        timeout=DEADLINE_S).partitions
    assert (answer.error_code, answer.base_offset) == (0, -1)


def test_fetch_without_options_long_polls_and_answers_proto_records(cluster, stubs, topic_name):
    create(cluster, topic_name)
    stub = leader(cluster, stubs, topic_name)
    empty = pb.FetchRequest(partitions=[
        pb.FetchPartition(topic=topic_name, partition=0, fetch_offset=0)])
    started = time.monotonic()
    fetched = stub.Fetch(empty, timeout=DEADLINE_S)
    # Kafka's fetch.max.wait.ms (500) at an empty log, where a max_wait_ms of 0 answers at once.
    assert time.monotonic() - started >= 0.45
    assert fetched.partitions[0].error_code == 0 and not fetched.partitions[0].records
    stub.Produce(pb.ProduceRequest(partitions=[pb.PartitionProduceData(
        topic=topic_name, partition=0, records=[pb.Record(key=b"k", value=b"v")])]),
        timeout=DEADLINE_S)
    (answer,) = stub.Fetch(empty, timeout=DEADLINE_S).partitions
    assert answer.arrow_records == b""
    assert [(r.offset, r.key, r.value, r.timestamp_type) for r in answer.records] == [
        (0, b"k", b"v", pb.CREATE_TIME)]
    assert answer.records[0].timestamp_ms > 1_600_000_000_000  # absent on produce: now
    (arrow,) = stub.Fetch(pb.FetchRequest(format=pb.ARROW, partitions=empty.partitions),
                          timeout=DEADLINE_S).partitions
    assert arrow.arrow_records and not arrow.records


def test_list_offsets_without_a_timestamp_is_the_latest_offset(cluster, stubs, topic_name):
    create(cluster, topic_name)
    stub = leader(cluster, stubs, topic_name)
    stub.Produce(pb.ProduceRequest(partitions=[produce_data(topic_name, b"a", b"b")]),
                 timeout=DEADLINE_S)

    def offset(**fields: int) -> int:
        (answer,) = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
            pb.ListOffsetsPartition(topic=topic_name, partition=0, **fields)]),
            timeout=DEADLINE_S).partitions
        assert answer.error_code == 0
        return answer.offset

    assert offset() == 2 == offset(timestamp=pb.LATEST_TIMESTAMP)
    assert offset(timestamp=pb.EARLIEST_TIMESTAMP) == 0
    assert offset(timestamp=0) == 0  # set to 0: the first record at or after 0 ms


def test_create_topics_without_counts_uses_the_cluster_defaults(cluster, stubs, topic_name):
    response = stubs["controller"].CreateTopics(pb.CreateTopicsRequest(topics=[
        pb.CreatableTopic(name=topic_name)]), timeout=DEADLINE_S)
    (result,) = response.topics
    assert result.error_code == 0, result.error_message
    assert (result.num_partitions, result.replication_factor) == (
        cluster.config.num_partitions, cluster.config.default_replication_factor)
    topic = cluster.controller.image().topics[topic_name]
    assert len(topic.partitions) == cluster.config.num_partitions
    assert {len(p.replicas) for p in topic.partitions} == {
        cluster.config.default_replication_factor}
    (again,) = stubs["controller"].CreateTopics(pb.CreateTopicsRequest(topics=[
        pb.CreatableTopic(name=topic_name + "-zero", num_partitions=0)]),
        timeout=DEADLINE_S).topics
    assert again.error_code == pb.INVALID_PARTITIONS  # 0 set is 0, and refused as in Kafka


def test_metadata_without_the_flag_creates_a_missing_topic_as_kafka_does(
        cluster, stubs, topic_name):
    response = stubs["controller"].Metadata(pb.MetadataRequest(topics=[topic_name]),
                                            timeout=DEADLINE_S)
    assert [(t.name, t.error_code) for t in response.topics] == [(topic_name, 0)]
    missing = topic_name + "-not-created"
    response = stubs["controller"].Metadata(pb.MetadataRequest(
        topics=[missing], allow_auto_topic_creation=False), timeout=DEADLINE_S)
    assert response.topics[0].error_code == pb.UNKNOWN_TOPIC_OR_PARTITION


def test_group_calls_without_generation_epoch_or_session_timeout(cluster, stubs, topic_name):
    """A consumer outside group management commits with no generation (Kafka's -1) and no
    leader epoch; a member joins with no session timeout (the consumer's 45 s)."""
    coordinator = stubs["controller"]
    group = f"g-{topic_name}"
    create(cluster, topic_name)  # offsets are committed for partitions that exist, as in Kafka
    (committed,) = coordinator.OffsetCommit(pb.OffsetCommitRequest(group_id=group, partitions=[
        pb.OffsetCommitPartition(topic=topic_name, partition=0, committed_offset=5)]),
        timeout=DEADLINE_S).results
    assert committed.error_code == 0, committed.error_message
    (fetched,) = coordinator.OffsetFetch(pb.OffsetFetchRequest(group_id=group),
                                         timeout=DEADLINE_S).partitions
    assert (fetched.committed_offset, fetched.committed_leader_epoch) == (5, -1)

    join = pb.JoinGroupRequest(group_id=group, protocol_type="consumer",
                               protocols=[pb.JoinGroupProtocol(name="range")])
    first = coordinator.JoinGroup(join, timeout=DEADLINE_S)
    assert first.error_code == pb.MEMBER_ID_REQUIRED, first.error_message
    join.member_id = first.member_id
    joined = coordinator.JoinGroup(join, timeout=DEADLINE_S)
    assert (joined.error_code, joined.leader) == (0, first.member_id), joined.error_message
    left = coordinator.LeaveGroup(pb.LeaveGroupRequest(group_id=group,
                                                       member_ids=[first.member_id]),
                                  timeout=DEADLINE_S)
    assert left.error_code == 0
