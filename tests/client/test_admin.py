"""AdminClient against the FakeCluster (real gRPC, no Spark): topics created, listed, described
and deleted; per-topic errors raised as their classes, after the other topics were done; topic
configs; consumer groups and their offsets. The controller's own rules are tested in
tests/cluster; what is tested here is what the client makes of the answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deltabus import AdminClient, AlterConfigOp, Consumer, NewTopic, TopicPartition, errors
from tests.client.fake_cluster import FakeCluster


@pytest.fixture
def admin(fake: FakeCluster) -> Iterator[AdminClient]:
    with AdminClient(fake.bootstrap_servers) as client:
        yield client


def test_topics_are_created_listed_described_and_deleted(fake, admin) -> None:
    created = admin.create_topics([NewTopic("a", 3, 2), NewTopic("b", 1)])
    assert set(created) == {"a", "b"} and all(len(i) == 32 for i in created.values())
    fake.create_topic("__internal", 1)
    assert admin.list_topics() == ["a", "b"]
    assert admin.list_topics(include_internal=True) == ["__internal", "a", "b"]
    [a] = admin.describe_topics(["a"])
    assert (a.name, a.topic_id, len(a.partitions), a.replication_factor) == (
        "a", created["a"], 3, 2)
    assert [p.leader for p in a.partitions] == [0, 1, 0]  # the leaders the cluster chose
    assert [p.isr for p in a.partitions] == [(0, 1), (1, 0), (0, 1)]
    assert {t.name for t in admin.describe_topics()} == {"__internal", "a", "b"}
    assert admin.delete_topics(["a"]) == {"a": created["a"]}
    assert admin.list_topics() == ["b"]


def test_an_existing_topic_raises_after_the_others_were_created(fake, admin) -> None:
    fake.create_topic("taken", 1)
    with pytest.raises(errors.TopicAlreadyExistsError, match="'taken' already exists"):
        admin.create_topics([NewTopic("new-1", 1), NewTopic("taken", 2), NewTopic("new-2", 1)])
    assert admin.list_topics() == ["new-1", "new-2", "taken"]
    [taken] = admin.describe_topics(["taken"])
    assert len(taken.partitions) == 1  # untouched


@pytest.mark.parametrize(("topic", "error"), [
    (NewTopic("bad name!", 1), errors.InvalidTopicError),
    (NewTopic("t", 0), errors.InvalidPartitionsError),
    (NewTopic("t", 1, 3), errors.InvalidReplicationFactorError),  # two brokers
    (NewTopic("t", 1, 1, {"no.such.config": "1"}), errors.InvalidConfigError),
])
def test_a_refused_topic_raises_its_kafka_error_and_nothing_is_created(
        admin, topic: NewTopic, error: type[errors.DeltaBusError]) -> None:
    with pytest.raises(error):
        admin.create_topics([topic])
    assert admin.list_topics() == []


def test_validate_only_checks_and_creates_nothing(admin) -> None:
    assert set(admin.create_topics([NewTopic("t", 2)], validate_only=True)) == {"t"}
    assert admin.list_topics() == []
    with pytest.raises(errors.InvalidPartitionsError):
        admin.create_topics([NewTopic("t", 0)], validate_only=True)


def test_unknown_topics_raise_unknown_topic_or_partition(admin) -> None:
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="'missing'"):
        admin.describe_topics(["missing"])
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="'missing'"):
        admin.delete_topics(["missing"])
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.describe_configs(["missing"])


def test_partitions_can_be_added_but_never_taken_away(fake, admin) -> None:
    fake.create_topic("t", 2)
    admin.create_partitions({"t": 5})
    [t] = admin.describe_topics(["t"])
    assert [p.partition for p in t.partitions] == [0, 1, 2, 3, 4]
    with pytest.raises(errors.InvalidPartitionsError, match="5 partitions"):
        admin.create_partitions({"t": 3})


def test_topic_configs_are_described_and_altered(fake, admin) -> None:
    fake.create_topic("t", 1, {"retention.ms": "1000"})
    entries = {e.name: e for e in admin.describe_configs(["t"])["t"]}
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == (
        "1000", "DYNAMIC_TOPIC_CONFIG")
    assert entries["max.message.bytes"].source == "DEFAULT_CONFIG"
    admin.incremental_alter_configs({"t": [AlterConfigOp("max.message.bytes", "SET", "2048"),
                                           AlterConfigOp("retention.ms", "DELETE")]})
    entries = {e.name: e for e in admin.describe_configs(["t"])["t"]}
    assert (entries["max.message.bytes"].value, entries["max.message.bytes"].source) == (
        "2048", "DYNAMIC_TOPIC_CONFIG")
    assert entries["retention.ms"].source == "DEFAULT_CONFIG"
    with pytest.raises(errors.InvalidConfigError, match="no.such.config"):
        admin.incremental_alter_configs({"t": [AlterConfigOp("no.such.config", "SET", "1")]})


def test_a_request_level_refusal_raises_its_class(admin) -> None:
    """The fake holds no elections: the whole call fails with a gRPC status, and the Kafka code
    in its trailers becomes the error class."""
    with pytest.raises(errors.UnsupportedVersionError, match="no elections"):
        admin.elect_leaders("preferred")
    with pytest.raises(errors.InvalidRequestError, match="election type"):
        admin.elect_leaders("sometimes")  # refused by the client before sending


def test_consumer_group_offsets_are_listed_reset_and_deleted(fake, admin) -> None:
    fake.create_topic("t", 2)
    for p in range(2):
        fake.write("t", p, [b"v"] * 10)
    tps = [TopicPartition("t", p) for p in range(2)]
    with Consumer(fake.bootstrap_servers, group_id="g") as consumer:
        consumer.assign(tps)
        consumer.commit({tps[0]: 4, tps[1]: 7})
    assert admin.list_consumer_groups() == [("g", "Empty")]
    assert admin.list_consumer_group_offsets("g") == {("t", 0): 4, ("t", 1): 7}
    admin.alter_consumer_group_offsets("g", {("t", 0): 1})
    with Consumer(fake.bootstrap_servers, group_id="g") as consumer:
        consumer.assign(tps)
        assert [consumer.position(tp) for tp in tps] == [1, 7]
    assert admin.delete_consumer_groups(["g"]) == {"g": None}
    assert admin.list_consumer_group_offsets("g") == {}
    result = admin.delete_consumer_groups(["g"])
    assert isinstance(result["g"], errors.GroupIdNotFoundError)


def test_an_active_groups_offsets_cannot_be_reset_nor_the_group_deleted(fake, admin) -> None:
    fake.create_topic("t", 1)
    with Consumer(fake.bootstrap_servers, group_id="g", session_timeout_ms=1000,
                  heartbeat_interval_ms=50) as member:
        member.subscribe(["t"])
        while not member.assignment():
            member.poll(50)
        [group] = admin.describe_consumer_groups(["g"])
        assert (group.state, group.protocol, len(group.members)) == ("Stable", "range", 1)
        assert group.members[0].client_id == "deltabus-consumer"
        with pytest.raises(errors.UnknownMemberIdError, match="active members"):
            admin.alter_consumer_group_offsets("g", {("t", 0): 0})
        assert isinstance(admin.delete_consumer_groups(["g"])["g"], errors.NonEmptyGroupError)
