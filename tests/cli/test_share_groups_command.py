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
