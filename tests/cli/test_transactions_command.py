"""`deltabus transactions` as kafka-transactions.sh: `list` and `describe --transactional-id`
with Kafka's columns, over deltabus's AdminClient (gRPC), for a transaction a Kafka producer
opened on the shared cluster (raw InitProducerId and AddPartitionsToTxn frames)."""

from __future__ import annotations

import pytest

from deltabus import AdminClient, NewTopic, errors
from deltabus.metadata import coordinator_node
from tests.kafka.raw_frames import connect_to
from tests.kafka.test_kafka_transactions import add_partitions, init


def test_list_and_describe_show_an_open_transaction(cli, cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 1)])
        with connect_to(cluster.kafka_bootstrap_servers) as sock:
            pid = init(sock, "txn-cli", timeout_ms=300_000).producer_id
            add_partitions(sock, "txn-cli", pid, 0, topic_name, (1, 0))
        described = admin.describe_transactions(["txn-cli"])["txn-cli"]
        assert (described.state, described.producer_id, described.timeout_ms) == (
            "Ongoing", pid, 300_000)
        assert described.partitions == {(topic_name, 0), (topic_name, 1)}
        assert ("txn-cli", pid, "Ongoing") in admin.list_transactions(states=["Ongoing"])
        assert all(t != "txn-cli" for t, _, _ in admin.list_transactions(states=["Empty"]))
        with pytest.raises(errors.TransactionalIdNotFoundError):
            admin.describe_transactions(["txn-nobody"])

    rc, out, _ = cli("transactions", "list")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == [
        "TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    # the coordinator is the broker FindCoordinator names for the id, as on Kafka
    coordinator = str(coordinator_node("txn-cli", range(cluster.config.brokers)))
    assert ["txn-cli", coordinator, str(pid), "Ongoing"] in [line.split() for line in lines]

    rc, out, _ = cli("transactions", "describe", "--transactional-id", "txn-cli")
    header, row = (line.split() for line in out.splitlines())
    assert rc == 0 and header == [
        "CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
        "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
        "TopicPartitions"]
    fields = dict(zip(header, row, strict=True))
    assert fields["CoordinatorId"] == coordinator
    assert fields["TransactionState"] == "Ongoing" and fields["ProducerEpoch"] == "0"
    assert fields["TransactionTimeoutMs"] == "300000"
    assert int(fields["TransactionDurationMs"]) >= 0
    assert fields["TopicPartitions"] == f"{topic_name}-0,{topic_name}-1"

    rc, _, err = cli("transactions", "describe", "--transactional-id", "txn-nobody")
    assert rc == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in err
