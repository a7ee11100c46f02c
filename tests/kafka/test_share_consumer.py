"""Share groups (KIP-932) with an unmodified client: confluent-kafka's ShareConsumer (librdkafka)
against the real cluster. Several consumers read one partition at once, each record acquired by
one of them at a time; a released record, or one whose lock timed out, goes to another with its
delivery count raised; a rejected one never comes back; a record delivered as often as
group.share.delivery.count.limit allows is archived."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka import Producer as KafkaProducer
from kio.index import load_request_schema

from deltabus import AdminClient, NewTopic
from tests.conftest import wait_until
from tests.kafka.raw_frames import call

SHARE_GROUP_DESCRIBE = 77
DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS = 90, 91, 92


def share_consumer(cluster, group: str, explicit: bool = False,
                   max_poll_records: int = 500) -> ShareConsumer:
    config = {"bootstrap.servers": cluster.kafka_bootstrap_servers, "group.id": group,
              "max.poll.records": max_poll_records}
    if explicit:
        config["share.acknowledgement.mode"] = "explicit"
    return ShareConsumer(config)


@pytest.fixture
def share_topic(cluster, topic_name) -> str:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    return topic_name


@pytest.fixture
def closing() -> Iterator[list[ShareConsumer]]:
    opened: list[ShareConsumer] = []
    yield opened
    for c in opened:
        c.close()


def started(cluster, group: str, topic: str, consumers: list[ShareConsumer]) -> None:
    """Poll until the partition's leader has started the group on it (at the latest offset,
    share.auto.offset.reset's default): records produced after this are the group's."""
    store = cluster.coordinator.share_state

    def ready() -> bool:
        for c in consumers:
            assert not c.poll(0.1), "nothing was produced yet"
        return store.read(group, topic, 0) is not None

    wait_until(ready, what=f"share group {group} to start on {topic}-0", timeout_s=120)


def produce(cluster, topic: str, count: int) -> None:
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    for i in range(count):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(60) == 0


def test_three_share_consumers_on_one_partition_get_different_records(
        cluster, share_topic, closing) -> None:
    group = f"{share_topic}-share"
    consumers = [share_consumer(cluster, group, max_poll_records=20) for _ in range(3)]
    closing += consumers
    for c in consumers:
        c.subscribe([share_topic])
    started(cluster, group, share_topic, consumers)
    produce(cluster, share_topic, 300)
    read: dict[int, list[int]] = {0: [], 1: [], 2: []}

    def all_read() -> bool:
        for i, c in enumerate(consumers):
            for m in c.poll(0.2):  # implicit mode: accepted on the next poll
                assert m.error() is None, m.error()
                assert m.delivery_count() == 1
                read[i].append(m.offset())
        return sum(len(offsets) for offsets in read.values()) >= 300

    try:
        wait_until(all_read, what="300 records read by the share group", timeout_s=120)
    except AssertionError as e:
        state = cluster.coordinator.share_state.read(group, share_topic, 0)
        raise AssertionError(f"{e}: read {[len(v) for v in read.values()]}, the group's "
                             f"durable state {state}") from None
    offsets = [o for i in read for o in read[i]]
    assert sorted(offsets) == list(range(300))  # every record once, over all three
    assert sum(1 for i in read if read[i]) >= 2  # the partition's records were shared

    # ShareGroupDescribe: every member is given the partition (KIP-932's assignment).
    request = load_request_schema(SHARE_GROUP_DESCRIBE, 1)(
        group_ids=(group,), include_authorized_operations=False)
    described = call(cluster.kafka_bootstrap_servers, SHARE_GROUP_DESCRIBE, 1, request).groups[0]
    assert (described.error_code.value, described.group_state) == (0, "Stable")
    assert described.assignor_name == "simple" and len(described.members) == 3
    for member in described.members:
        assert [(tp.topic_name, tp.partitions) for tp in member.assignment.topic_partitions] \
            == [(share_topic, (0,))]
        assert member.subscribed_topic_names == (share_topic,)

    # Accepted records are done: the group's start offset moves past all of them.
    for c in consumers:
        c.poll(0.2)
    wait_until(lambda: cluster.coordinator.share_state.read(group, share_topic, 0)
               .start_offset == 300, what="every record accepted")

    # The console lists the share group: its members, and its start offset as its progress.
    with urllib.request.urlopen(cluster.console_url + "/api/overview", timeout=30) as answer:
        listed = [g for g in json.load(answer)["groups"] if g["group"] == group]
    assert [(g["protocol"], g["members"]) for g in listed] == [("share", 3)]
    assert [(p["topic"], p["committed"]) for p in listed[0]["partitions"]] == [
        (share_topic, 300)]


def test_released_and_rejected_records(cluster, share_topic, closing) -> None:
    group = f"{share_topic}-share"
    first, second = share_consumer(cluster, group, explicit=True), \
        share_consumer(cluster, group, explicit=True)
    closing += [first, second]
    first.subscribe([share_topic])
    started(cluster, group, share_topic, [first])
    produce(cluster, share_topic, 4)
    got: list = []
    wait_until(lambda: got.extend(first.poll(0.5)) or len(got) >= 4,
               what="the first consumer to get the 4 records")
    by_offset = {m.offset(): m for m in got}
    first.acknowledge(by_offset[0], AcknowledgeType.ACCEPT)
    first.acknowledge(by_offset[1], AcknowledgeType.RELEASE)
    first.acknowledge(by_offset[2], AcknowledgeType.REJECT)
    first.acknowledge(by_offset[3], AcknowledgeType.RELEASE)
    results = first.commit_sync(30)
    assert all(e is None for e in results.values()), results

    second.subscribe([share_topic])
    again: list = []
    wait_until(lambda: again.extend(second.poll(0.5)) or len(again) >= 2,
               what="the released records to reach the second consumer")
    assert sorted((m.offset(), m.delivery_count()) for m in again) == [(1, 2), (3, 2)]
    for m in again:
        second.acknowledge(m, AcknowledgeType.ACCEPT)
    assert all(e is None for e in second.commit_sync(30).values())
    time.sleep(1)  # nothing more comes: 0 and 1, 3 are accepted, 2 was rejected
    assert len(second.poll(0.5)) == 0 and len(first.poll(0.5)) == 0
    state = cluster.coordinator.share_state.read(group, share_topic, 0)
    assert state.start_offset == 4


def test_share_group_offsets_through_the_kafka_door(cluster, share_topic) -> None:
    """DescribeShareGroupOffsets, AlterShareGroupOffsets and DeleteShareGroupOffsets as a Kafka
    admin client sends them (kio's frames): altered only while the group has no members."""
    group = f"{share_topic}-share"
    consumer = share_consumer(cluster, group)
    consumer.subscribe([share_topic])
    started(cluster, group, share_topic, [consumer])
    produce(cluster, share_topic, 3)
    got: list = []
    wait_until(lambda: got.extend(consumer.poll(0.5)) or len(got) >= 3, what="3 records read")
    consumer.commit_sync(30)
    bootstrap = cluster.kafka_bootstrap_servers

    def alter(offset: int):
        cls = load_request_schema(ALTER_SHARE_GROUP_OFFSETS, 0)
        module = sys.modules[cls.__module__]  # kio's nested classes of this version
        return call(bootstrap, ALTER_SHARE_GROUP_OFFSETS, 0, cls(
            group_id=group, topics=(module.AlterShareGroupOffsetsRequestTopic(
                topic_name=share_topic, partitions=(
                    module.AlterShareGroupOffsetsRequestPartition(
                        partition_index=0, start_offset=offset),)),)))

    def described():
        cls = load_request_schema(DESCRIBE_SHARE_GROUP_OFFSETS, 1)
        module = sys.modules[cls.__module__]
        answer = call(bootstrap, DESCRIBE_SHARE_GROUP_OFFSETS, 1, cls(groups=(
            module.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=None),)))
        return answer.groups[0]

    partition = described().topics[0].partitions[0]
    assert (partition.partition_index, partition.start_offset) == (0, 3)
    assert alter(0).error_code.value == 68  # NON_EMPTY_GROUP: a member is still there
    consumer.close()
    wait_until(lambda: alter(1).error_code.value == 0, what="the closed consumer to leave")
    assert described().topics[0].partitions[0].start_offset == 1

    again = share_consumer(cluster, group)  # the group resumes at the new start offset
    again.subscribe([share_topic])
    redelivered: list = []
    try:
        wait_until(lambda: redelivered.extend(again.poll(0.5)) or len(redelivered) >= 2,
                   what="offsets 1 and 2 delivered again")
        assert sorted(m.offset() for m in redelivered) == [1, 2]
    finally:
        again.close()

    cls = load_request_schema(DELETE_SHARE_GROUP_OFFSETS, 0)
    module = sys.modules[cls.__module__]
    request = cls(group_id=group, topics=(
        module.DeleteShareGroupOffsetsRequestTopic(topic_name=share_topic),))
    wait_until(lambda: call(bootstrap, DELETE_SHARE_GROUP_OFFSETS, 0, request)
               .error_code.value == 0, what="the second consumer to leave, its offsets deleted")
    assert described().topics == ()


def test_read_committed_share_groups_skip_aborted_transactions(cluster, share_topic,
                                                              closing) -> None:
    """share.isolation.level=read_committed (a group config): records of an aborted
    transaction are never delivered; a committed one's are, once committed."""
    from deltabus import config as cfg

    group = f"{share_topic}-share"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.incremental_alter_configs({group: [
            cfg.AlterConfigOp("share.isolation.level", cfg.SET, "read_committed"),
            cfg.AlterConfigOp("share.auto.offset.reset", cfg.SET, "earliest")]}, groups=True)
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "transactional.id": f"{share_topic}-tx"})
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(share_topic, value=b"aborted %d" % i, partition=0)
    producer.abort_transaction(60)
    producer.begin_transaction()
    producer.produce(share_topic, value=b"committed", partition=0)
    producer.commit_transaction(60)
    consumer = share_consumer(cluster, group)
    closing.append(consumer)
    consumer.subscribe([share_topic])
    got: list = []
    wait_until(lambda: got.extend(consumer.poll(0.5)) or got, what="the committed record")
    time.sleep(1)
    got.extend(consumer.poll(0.5))
    assert [m.value() for m in got] == [b"committed"]
