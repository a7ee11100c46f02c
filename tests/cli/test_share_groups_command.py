"""`deltabus share-groups` (kafka-share-groups.sh) against a share group that confluent-kafka's
ShareConsumer runs: Kafka's columns for offsets, members and state; offsets reset only while
the group has no members; offsets and groups deleted."""

from __future__ import annotations

from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import ShareConsumer

from deltabus import AdminClient, NewTopic
from tests.conftest import wait_until


def test_share_groups_describe_reset_and_delete(cluster, cli, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 3)])
    group = f"{topic_name}-share"
    consumers = [ShareConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                                "group.id": group, "client.id": f"worker-{i}"})
                 for i in range(2)]
    try:
        for c in consumers:
            c.subscribe([topic_name])
        store = cluster.coordinator.share_state
        wait_until(lambda: [c.poll(0.1) for c in consumers] and len(store.states(group)) == 2,
                   what="the group to start on both partitions", timeout_s=120)
        producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
        for i in range(10):
            producer.produce(topic_name, value=b"%d" % i, partition=i % 2)
        assert producer.flush(60) == 0
        read: list = []
        wait_until(lambda: [read.extend(c.poll(0.2)) for c in consumers] and len(read) >= 10,
                   what="10 records read")
        for c in consumers:
            results = c.commit_sync(30)
            assert all(e is None for e in results.values()), results

        rc, out, _ = cli("share-groups", "--list")
        assert rc == 0 and group in out.split()
        rc, out, _ = cli("share-groups", "--list", "--state")
        assert out.splitlines()[0].split() == ["GROUP", "STATE"]
        assert [group, "Stable"] in [line.split() for line in out.splitlines()]

        def described() -> list[list[str]]:
            return [line.split() for line in cli("share-groups", "--describe", "--group",
                                                  group)[1].strip().splitlines()]

        # LAG once the leaders reported their high watermarks (offsets.report.interval.ms)
        wait_until(lambda: described()[1:] == [[group, topic_name, "0", "5", "0"],
                                               [group, topic_name, "1", "5", "0"]],
                   what=f"the offsets view to show every record accepted: {described()}")
        assert described()[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]

        rc, out, _ = cli("share-groups", "--describe", "--group", group, "--members",
                         "--verbose")
        lines = [line.split() for line in out.strip().splitlines()]
        assert lines[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                            "MEMBER-EPOCH", "ASSIGNMENT"]
        assert sorted(row[3] for row in lines[1:]) == ["worker-0", "worker-1"]
        assert all(row[4] == "2" and row[6] == f"{topic_name}:0,1" for row in lines[1:])

        rc, out, _ = cli("share-groups", "--describe", "--group", group, "--state")
        lines = out.strip().splitlines()
        assert lines[0].split() == ["GROUP", "COORDINATOR", "(ID)", "STATE", "#MEMBERS"]
        assert lines[1].split()[-2:] == ["Stable", "2"]

        rc, _, err = cli("share-groups", "--reset-offsets", "--group", group, "--topic",
                         topic_name, "--to-earliest", "--execute")
        assert rc != 0 and f"Share group '{group}' is not empty." in err
    finally:
        for c in consumers:
            c.close()

    wait_until(lambda: cli("share-groups", "--describe", "--group", group, "--state")[1]
               .strip().splitlines()[1].split()[-2:] == ["Empty", "0"],
               what="the closed consumers to leave the group")
    rc, out, _ = cli("share-groups", "--reset-offsets", "--group", group, "--topic",
                     f"{topic_name}:0", "--to-earliest", "--execute")
    assert rc == 0
    assert [line.split() for line in out.strip().splitlines()] == [
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], [group, topic_name, "0", "0"]]
    with AdminClient(cluster.bootstrap_servers) as admin:
        offsets = admin.list_share_group_offsets(group)
    assert {tp: o.start_offset for tp, o in offsets.items()} == {
        (topic_name, 0): 0, (topic_name, 1): 5}

    rc, out, _ = cli("share-groups", "--delete-offsets", "--group", group, "--topic", topic_name)
    assert rc == 0 and [topic_name, "Successful"] in [line.split() for line in out.splitlines()]
    rc, out, _ = cli("share-groups", "--describe", "--group", group)
    assert f"Share group '{group}' has no offset information." in out

    rc, out, _ = cli("share-groups", "--delete", "--group", group)
    assert rc == 0 and f"Deletion of requested share groups ('{group}') was successful." in out
    rc, out, _ = cli("share-groups", "--list")
    assert group not in out.split()
    rc, _, err = cli("share-groups", "--describe", "--group", group)
    assert rc != 0 and f"Share group '{group}' does not exist." in err


def test_group_configs_set_where_a_share_group_starts_and_how_long_it_holds_a_record(
        cluster, cli, topic_name) -> None:
    """kafka-configs.sh --entity-type groups: share.auto.offset.reset=earliest makes a new group
    start at the records already there; share.record.lock.duration.ms=1000 makes a record
    nobody acknowledged go to another member after a second. confluent-kafka's admin client
    describes them through the Kafka door."""
    from confluent_kafka import AcknowledgeType
    from confluent_kafka.admin import AdminClient as KafkaAdminClient
    from confluent_kafka.admin import ConfigResource

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    producer = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    for i in range(5):
        producer.produce(topic_name, value=b"%d" % i, partition=0)
    assert producer.flush(60) == 0
    group = f"{topic_name}-share"
    rc, out, _ = cli("configs", "--alter", "--entity-type", "groups", "--entity-name", group,
                     "--add-config",
                     "share.auto.offset.reset=earliest,share.record.lock.duration.ms=1000")
    assert rc == 0 and out.strip() == f"Completed updating config for group {group}."
    rc, out, _ = cli("configs", "--describe", "--entity-type", "groups", "--entity-name", group)
    assert rc == 0 and out.splitlines() == [
        f"Dynamic configs for group {group} are:",
        "  share.auto.offset.reset=earliest sensitive=false "
        "synonyms={GROUP_CONFIG:share.auto.offset.reset=earliest}",
        "  share.record.lock.duration.ms=1000 sensitive=false "
        "synonyms={GROUP_CONFIG:share.record.lock.duration.ms=1000}"]
    rc, _, err = cli("configs", "--alter", "--entity-type", "groups", "--entity-name", group,
                     "--add-config", "share.auto.offset.reset=oldest")
    assert rc == 1 and "Invalid value `oldest` for configuration share.auto.offset.reset" in err
    resource = ConfigResource("group", group)
    kafka_admin = KafkaAdminClient({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    described = kafka_admin.describe_configs([resource])[resource].result(30)
    assert described["share.auto.offset.reset"].value == "earliest"

    def consumer() -> ShareConsumer:
        return ShareConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                              "group.id": group, "share.acknowledgement.mode": "explicit"})

    first, second = consumer(), consumer()
    try:
        first.subscribe([topic_name])
        got: list = []
        wait_until(lambda: got.extend(first.poll(0.5)) or len(got) >= 5,
                   what="the 5 records produced before the group started (earliest)")
        assert sorted(m.offset() for m in got) == list(range(5))
        for m in got[1:]:
            first.acknowledge(m, AcknowledgeType.ACCEPT)  # offset 0 stays held, unacknowledged
        first.commit_sync(30)
        second.subscribe([topic_name])
        again: list = []
        wait_until(lambda: again.extend(second.poll(0.5)) or again,
                   what="the held record, after the group's 1 s lock")
        assert [(m.offset(), m.delivery_count()) for m in again] == [(0, 2)]
        second.acknowledge(again[0], AcknowledgeType.ACCEPT)
        second.commit_sync(30)
    finally:
        first.close()
        second.close()
