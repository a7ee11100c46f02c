"""Kafka's admin APIs that change configs, leaders and replicas (IncrementalAlterConfigs,
AlterConfigs, ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments), driven by
kafka-python's and librdkafka's admin clients unmodified against the shared 3-broker cluster
(elections: a cluster of their own without auto rebalance); each effect is read back through
deltabus's own AdminClient. What no client library sends goes as raw frames to an in-memory
broker's door."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from kio.index import load_request_schema
from kio.static.primitive import i8, i32

from deltabus import AdminClient, Cluster, NewTopic
from deltabus.log_tables.layout import replica_path
from deltabus.rpc.kafka.config_apis import INCREMENTAL_ALTER_CONFIGS
from deltabus.rpc.kafka.frames import nested
from deltabus.rpc.kafka.partition_admin import ALTER_PARTITION_REASSIGNMENTS, ELECT_LEADERS
from tests.client.fake_cluster import FakeCluster
from tests.conftest import wait_until
from tests.kafka import raw_frames


def kafka_python_admin(cluster):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)


def librdkafka_admin(cluster):
    from confluent_kafka.admin import AdminClient as ConfluentAdmin

    return ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap_servers})


def overrides(cluster, topic: str) -> dict[str, str]:
    """The topic's dynamic configs, as deltabus's controller holds them."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        entries = admin.describe_configs([topic])[topic]
    return {e.name: e.value for e in entries if e.source == "DYNAMIC_TOPIC_CONFIG"}


def partitions(cluster, topic: str) -> list:
    with AdminClient(cluster.bootstrap_servers) as admin:
        return sorted(admin.describe_topics([topic])[0].partitions, key=lambda p: p.partition)


def test_kafka_python_alters_topic_configs(cluster, topic_name) -> None:
    """kafka-python's alter_configs (IncrementalAlterConfigs): retention.ms really changes and
    the other override stays; validate_only changes nothing; a bad value is INVALID_CONFIG with
    a message, an unknown topic UNKNOWN_TOPIC_OR_PARTITION, a broker INVALID_REQUEST."""
    from kafka.admin import ConfigResource, ConfigResourceType

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {"max.message.bytes": "100000"})])
    theirs = kafka_python_admin(cluster)
    try:
        def alter(configs, name=topic_name, kind=ConfigResourceType.TOPIC, **options):
            answered = theirs.alter_configs([ConfigResource(kind, name, configs=configs)],
                                            **options)
            return next(iter(answered.values()))[name]

        assert alter({"retention.ms": "3600000"}) == "OK"
        assert overrides(cluster, topic_name) == {
            "max.message.bytes": "100000", "retention.ms": "3600000"}
        assert alter({"retention.ms": "60000"}, validate_only=True) == "OK"
        assert overrides(cluster, topic_name)["retention.ms"] == "3600000"
        bad = alter({"retention.ms": "soon"})
        assert "InvalidConfigurationError" in bad and "retention.ms" in bad
        unknown = alter({"retention.ms": "1"}, name=f"{topic_name}-none", raise_on_unknown=False)
        assert "UnknownTopicOrPartitionError" in unknown
        broker = alter({"log.retention.ms": "1"}, name="1", kind=ConfigResourceType.BROKER,
                       raise_on_unknown=False)
        assert "InvalidRequestError" in broker and "only topics" in broker
        assert overrides(cluster, topic_name) == {
            "max.message.bytes": "100000", "retention.ms": "3600000"}
    finally:
        theirs.close()


def test_librdkafka_alters_configs_incrementally_and_as_a_whole(cluster, topic_name) -> None:
    """librdkafka's incremental_alter_configs (SET, APPEND, DELETE) and its legacy
    alter_configs, which replaces the whole set: overrides it does not name go back to their
    defaults, as Kafka's AlterConfigs does."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {"retention.ms": "3600000"})])
    librdkafka = librdkafka_admin(cluster)
    changes = [ConfigEntry("max.message.bytes", "200000",
                           incremental_operation=AlterConfigOpType.SET),
               ConfigEntry("cleanup.policy", "compact",
                           incremental_operation=AlterConfigOpType.APPEND),
               ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)]
    resource = ConfigResource("topic", topic_name, incremental_configs=changes)
    librdkafka.incremental_alter_configs([resource])[resource].result(30)
    assert overrides(cluster, topic_name) == {
        "max.message.bytes": "200000", "cleanup.policy": "delete,compact"}

    whole = ConfigResource("topic", topic_name, set_config={"retention.bytes": "1000000"})
    librdkafka.alter_configs([whole])[whole].result(30)
    assert overrides(cluster, topic_name) == {"retention.bytes": "1000000"}

    bad = ConfigResource("topic", topic_name, set_config={"retention.bytes": "lots"})
    try:
        librdkafka.alter_configs([bad])[bad].result(30)
        raise AssertionError("retention.bytes=lots was taken")
    except KafkaException as e:
        assert e.args[0].name() == "INVALID_CONFIG"
    assert overrides(cluster, topic_name) == {"retention.bytes": "1000000"}


def test_kafka_3_deprecated_topic_configs_are_taken_and_described(cluster, topic_name) -> None:
    """message.format.version and message.downconversion.enable, deprecated in Kafka 3 and gone
    in 4.0, are taken as a Kafka 3 broker takes them, so tools written for 3.x clusters work:
    in librdkafka's CreateTopics, IncrementalAlterConfigs and legacy AlterConfigs, and in
    kafka-python's IncrementalAlterConfigs. DescribeConfigs shows the value set, or Kafka 3's
    default with its broker synonym (log.message.format.version), and documents the config as
    deprecated. A value no Kafka version names is still INVALID_CONFIG."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    from confluent_kafka.admin import NewTopic as ConfluentNewTopic
    from kafka.admin import ConfigResource as PythonConfigResource
    from kafka.admin import ConfigResourceType

    librdkafka = librdkafka_admin(cluster)
    librdkafka.create_topics([ConfluentNewTopic(
        topic_name, 1, 1, config={"message.format.version": "2.8"})])[topic_name].result(30)
    resource = ConfigResource("topic", topic_name)
    described = librdkafka.describe_configs([resource])[resource].result(30)
    assert described["message.format.version"].value == "2.8"
    assert (described["message.downconversion.enable"].value,
            described["message.downconversion.enable"].is_default) == ("true", True)

    changes = [ConfigEntry("message.downconversion.enable", "false",
                           incremental_operation=AlterConfigOpType.SET)]
    incremental = ConfigResource("topic", topic_name, incremental_configs=changes)
    librdkafka.incremental_alter_configs([incremental])[incremental].result(30)
    assert overrides(cluster, topic_name) == {
        "message.format.version": "2.8", "message.downconversion.enable": "false"}
    whole = ConfigResource("topic", topic_name, set_config={"message.format.version": "3.0-IV1"})
    librdkafka.alter_configs([whole])[whole].result(30)
    assert overrides(cluster, topic_name) == {"message.format.version": "3.0-IV1"}
    theirs = kafka_python_admin(cluster)
    try:
        answered = theirs.alter_configs([PythonConfigResource(
            ConfigResourceType.TOPIC, topic_name, configs={"message.format.version": "0.10.2"})])
    finally:
        theirs.close()
    assert next(iter(answered.values()))[topic_name] == "OK"
    assert overrides(cluster, topic_name) == {"message.format.version": "0.10.2"}

    bad = ConfigResource("topic", topic_name, set_config={"message.format.version": "soon"})
    with pytest.raises(KafkaException) as refused:
        librdkafka.alter_configs([bad])[bad].result(30)
    assert refused.value.args[0].name() == "INVALID_CONFIG"
    with AdminClient(cluster.bootstrap_servers) as admin:
        entries = {e.name: e for e in admin.describe_configs([topic_name])[topic_name]}
    downconversion = entries["message.downconversion.enable"]
    assert (downconversion.value, downconversion.source) == ("true", "DEFAULT_CONFIG")
    assert downconversion.synonyms == (
        ("DEFAULT_CONFIG", "log.message.downconversion.enable", "true"),)
    assert entries["message.format.version"].synonyms == (
        ("DYNAMIC_TOPIC_CONFIG", "message.format.version", "0.10.2"),
        ("DEFAULT_CONFIG", "log.message.format.version", "3.0-IV1"))
    assert all(entries[name].doc.startswith("[DEPRECATED]")
               for name in ("message.format.version", "message.downconversion.enable"))


@pytest.fixture
def cluster_without_rebalance(spark, tmp_path) -> Iterator[Cluster]:
    """A 2-broker cluster of the test's own whose controller never hands leadership back by
    itself (the shared cluster's does every second: tests/conftest.py), so only an
    ElectLeaders request can."""
    c = Cluster(spark, root=str(tmp_path / "no-rebalance"), brokers=2, port=0,
                auto_leader_rebalance_enable=False).start()
    yield c
    c.stop()


def test_kafka_admin_clients_elect_preferred_leaders_after_a_restart(
        cluster_without_rebalance) -> None:
    """A broker's restart moves its partitions' leadership away; ElectLeaders (PREFERRED, all
    partitions, through librdkafka) hands it back to the preferred replica. Then kafka-python
    asks again: ELECTION_NOT_NEEDED, and UNKNOWN_TOPIC_OR_PARTITION for a partition that is not
    there; an UNCLEAN election of partitions that have a leader is not needed either; an empty
    list of partitions (not null) elects none."""
    from confluent_kafka import ElectionType, TopicPartition

    cluster, topic = cluster_without_rebalance, "elected"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, replica_assignment={0: [0, 1], 1: [1, 0]})])
    cluster.restart_broker(1)
    wait_until(lambda: all(1 in p.isr for p in partitions(cluster, topic)), "broker 1 in sync")
    assert [p.leader for p in partitions(cluster, topic)] == [0, 0]

    librdkafka = librdkafka_admin(cluster)
    elected = librdkafka.elect_leaders(ElectionType.PREFERRED, None).result(60)
    assert elected == {TopicPartition(topic, 1): None}  # only the partition that moved
    wait_until(lambda: [p.leader for p in partitions(cluster, topic)] == [0, 1],
               "partition 1 led by its preferred replica again")

    theirs = kafka_python_admin(cluster)
    try:
        response = theirs.elect_leaders(0, {topic: [0, 1, 9]}, raise_errors=False)
        unclean = theirs.elect_leaders(1, {topic: [0]}, raise_errors=False)
        nothing = theirs.elect_leaders(0, {}, raise_errors=False)  # names no partition
    finally:
        theirs.close()
    codes = {p.partition_id: p.error_code for r in response.replica_election_results
             for p in r.partition_result}
    assert codes == {0: 84, 1: 84, 9: 3}  # ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION
    assert [p.error_code for r in unclean.replica_election_results
            for p in r.partition_result] == [84]
    assert (nothing.error_code, list(nothing.replica_election_results)) == (0, [])


def test_kafka_python_reassigns_replicas_lists_and_cancels_the_reassignment(
        cluster, topic_name, all_brokers_back) -> None:
    """AlterPartitionReassignments moves a partition's replica to another broker. While the
    new replica cannot catch up (its broker is down), ListPartitionReassignments shows the move
    in progress, and cancelling it (null replicas) puts the old replica back alone and drops
    the new one's table. A move to a live broker completes: it is the only replica and leads,
    nothing is listed, and cancelling is NO_REASSIGNMENT_IN_PROGRESS."""
    from kafka import TopicPartition

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    old = partitions(cluster, topic_name)[0].replicas[0]
    new = 2 if old != 2 else 1  # not broker 0, which kafka-python takes for the controller
    (last,) = {0, 1, 2} - {old, new}
    tp = TopicPartition(topic_name, 0)
    new_table = Path(replica_path(cluster.config.root, topic_name, 0, new))
    theirs = kafka_python_admin(cluster)
    try:
        assert tp not in theirs.list_partition_reassignments()
        assert theirs.alter_partition_reassignments({tp: [new]}) == {tp: None}
        cluster.kill_broker(new, relaunch=False)
        wait_until(lambda: tp in theirs.list_partition_reassignments([tp]),
                   "the reassignment listed in progress")
        assert theirs.list_partition_reassignments([tp])[tp] == {
            "replicas": [new, old], "adding_replicas": [new], "removing_replicas": [old]}
        assert theirs.alter_partition_reassignments({tp: None}) == {tp: None}
        assert tp not in theirs.list_partition_reassignments()
        back = partitions(cluster, topic_name)[0]
        assert (back.replicas, back.leader, back.adding_replicas) == ((old,), old, ())
        cluster.start_broker(new)
        wait_until(lambda: not new_table.exists(), "the cancelled replica's table to go")

        assert theirs.alter_partition_reassignments({tp: [last]}) == {tp: None}
        wait_until(lambda: partitions(cluster, topic_name)[0].replicas == (last,),
                   "the reassignment to complete", timeout_s=120)
        assert not theirs.list_partition_reassignments([tp])
        wait_until(lambda: partitions(cluster, topic_name)[0].leader == last,
                   "the moved replica to lead")
        gone = TopicPartition(topic_name, 7)
        answered = theirs.alter_partition_reassignments({tp: None, gone: [old]})
        assert {t: e.__name__ for t, e in answered.items()} == {
            tp: "NoReassignmentInProgressError", gone: "UnknownTopicOrPartitionError"}
    finally:
        theirs.close()


@pytest.fixture
def fake_door() -> Iterator[tuple[FakeCluster, str]]:
    """An in-memory broker's Kafka door (no Spark), for requests no client library sends."""
    fake = FakeCluster(brokers=1)
    fake.create_topic("orders", 1)
    fake.create_topic("audit", 1)
    yield fake, fake.serve_kafka(0)
    fake.close()


def test_malformed_admin_requests_get_kafkas_error_codes(fake_door) -> None:
    """What a client library would refuse before sending, sent as raw frames: a topic or a
    key named twice, an unknown operation or resource type (INVALID_REQUEST), an unknown
    election type (INVALID_REQUEST for the whole request) and an empty replica list
    (INVALID_REPLICA_ASSIGNMENT); nothing changes."""
    fake, address = fake_door
    cls = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    resource_cls, config_cls = (nested(cls, n) for n in ("AlterConfigsResource",
                                                          "AlterableConfig"))

    def resource(kind: int, name: str, *ops: tuple[str, int, str]) -> object:
        return resource_cls(resource_type=i8(kind), resource_name=name, configs=tuple(
            config_cls(name=k, config_operation=i8(op), value=v) for k, op, v in ops))

    answer = raw_frames.call(address, INCREMENTAL_ALTER_CONFIGS, 1, cls(resources=(
        resource(2, "orders", ("retention.ms", 0, "1"), ("retention.ms", 0, "2")),
        resource(2, "twice", ("retention.ms", 0, "1")), resource(2, "twice"),
        resource(8, "kafka.server", ("retention.ms", 0, "1")),
        resource(2, "audit", ("retention.ms", 9, "1"))), validate_only=False))
    assert {r.resource_name: int(r.error_code) for r in answer.responses} == {
        "orders": 42, "twice": 42, "kafka.server": 42, "audit": 42}
    assert not fake.image().topics["orders"].configs and not fake.image().topics[
        "audit"].configs

    elect_cls = load_request_schema(ELECT_LEADERS, 2)
    answer = raw_frames.call(address, ELECT_LEADERS, 2, elect_cls(
        election_type=i8(7), topic_partitions=None, timeout=timedelta(seconds=5)))
    assert int(answer.error_code) == 42

    alter_cls = load_request_schema(ALTER_PARTITION_REASSIGNMENTS, 0)
    topic_cls, partition_cls = (nested(alter_cls, n) for n in ("ReassignableTopic",
                                                               "ReassignablePartition"))
    answer = raw_frames.call(address, ALTER_PARTITION_REASSIGNMENTS, 0, alter_cls(
        timeout=timedelta(seconds=5), topics=(topic_cls(name="orders", partitions=(
            partition_cls(partition_index=i32(0), replicas=()),)),)))
    assert [int(p.error_code) for t in answer.responses for p in t.partitions] == [39]
