"""Static membership (KIP-345) through the Kafka door: librdkafka consumers with
`group.instance.id`, unmodified. A consumer restarted with its instance id within its session
gets its old partitions back and the rest of the group never rebalances (the generation stays);
DescribeGroups shows the instance ids; an admin (kafka-python) removes a static member by its
instance id and the group rebalances to the member left."""

from __future__ import annotations

import threading

from confluent_kafka import Consumer as KafkaConsumer
from kafka import errors as kafka_errors
from kafka.admin import KafkaAdminClient, MemberToRemove

from deltabus import AdminClient, NewTopic
from tests.conftest import wait_until

PARTITIONS = 4


class StaticMember:
    """A librdkafka consumer with a group.instance.id, polling on its own thread; `assigned` is
    the partitions it holds, `rebalances` how many assignments it has been handed."""

    def __init__(self, cluster, topic: str, group: str, instance: str) -> None:
        self.consumer = KafkaConsumer({
            "bootstrap.servers": cluster.kafka_bootstrap_servers, "group.id": group,
            "group.instance.id": instance, "session.timeout.ms": 30_000,
            "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "range", "enable.auto.commit": False})
        self.assigned: set[int] = set()
        self.rebalances = 0
        self.errors: list[object] = []
        self._stop = threading.Event()
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _on_assign(self, _consumer, partitions) -> None:
        self.assigned = {p.partition for p in partitions}
        self.rebalances += 1

    def _on_revoke(self, _consumer, _partitions) -> None:
        self.assigned = set()

    def _poll(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is not None:
                self.errors.append(message.error())

    def close(self) -> None:
        """Stop polling and close: a static member sends no LeaveGroup (KIP-345)."""
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(
        cluster, topic_name) -> None:
    group = f"{topic_name}-g"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    a = StaticMember(cluster, topic_name, group, "instance-a")
    b = StaticMember(cluster, topic_name, group, "instance-b")
    restarted = None
    try:
        wait_until(lambda: len(a.assigned) == len(b.assigned) == PARTITIONS // 2
                   and not a.assigned & b.assigned, "both static members hold two partitions")
        generation = cluster.coordinator.describe_group(group).generation_id
        held_by_b, rebalances_of_a = set(b.assigned), a.rebalances
        described = cluster.coordinator.describe_group(group).members
        assert sorted(m.group_instance_id for m in described) == ["instance-a", "instance-b"]

        b.close()
        restarted = StaticMember(cluster, topic_name, group, "instance-b")
        wait_until(lambda: restarted.assigned, "the restarted member is assigned")
        assert restarted.assigned == held_by_b
        assert cluster.coordinator.describe_group(group).generation_id == generation
        assert a.rebalances == rebalances_of_a and a.assigned | held_by_b == set(
            range(PARTITIONS))
        assert not a.errors and not restarted.errors
    finally:
        for member in (a, b, restarted):
            if member is not None and not member._stop.is_set():
                member.close()


def test_an_admin_removes_a_static_member_by_its_instance_id(cluster, topic_name) -> None:
    group = f"{topic_name}-g"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    a = StaticMember(cluster, topic_name, group, "instance-a")
    b = StaticMember(cluster, topic_name, group, "instance-b")
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        wait_until(lambda: len(a.assigned) == len(b.assigned) == PARTITIONS // 2,
                   "both static members hold two partitions")
        b.close()  # gone without a LeaveGroup: the group waits for its session...
        removed = admin.remove_group_members(group, [
            MemberToRemove(group_instance_id="instance-b"),
            MemberToRemove(group_instance_id="instance-x")])
        assert removed["instance-b"] is kafka_errors.NoError
        assert removed["instance-x"] is kafka_errors.UnknownMemberIdError
        # ...unless an admin removes it: its partitions move to the member left at once
        wait_until(lambda: a.assigned == set(range(PARTITIONS)),
                   "the member left holds every partition")
        members = cluster.coordinator.describe_group(group).members
        assert [m.group_instance_id for m in members] == ["instance-a"]
    finally:
        admin.close()
        a.close()
