"""Key compaction (cleanup.policy=compact) on the shared 3-broker cluster: a compacted topic read
from the beginning, by a consumer or by Spark, yields the latest value of every key at its
original offset; a follower that was down while the leader compacted catches up from the gapped
log; keyless records are refused."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from deltabus.log_tables.layout import replica_path
from tests.cluster.test_replication import kill_and_hold, wait_for_identical_replicas
from tests.cluster.test_retention import earliest
from tests.conftest import wait_until

KEYS = 20
COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
             "file.delete.delay.ms": "0"}


def produce_rounds(producer: Producer, topic: str, first: int, rounds: int) -> None:
    """Each round updates every key once, and is flushed: a commit (a file) per round."""
    for r in range(first, first + rounds):
        for k in range(KEYS):
            producer.send(topic, f"v{r}".encode(), key=f"k{k}".encode(), partition=0)
        producer.flush()


def read_all(cluster, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from the beginning to the high watermark."""
    tp = TopicPartition(topic, 0)
    with Consumer(cluster.bootstrap_servers) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        out: list[tuple[int, bytes, bytes | None]] = []
        while not out or out[-1][0] < end - 1:
            out += [(r.offset, r.key, r.value) for r in consumer.poll(500)]
        return out


def replica_records(cluster, topic: str, broker: int) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record in one replica's table, read straight from disk."""
    table = DeltaTable(replica_path(cluster.config.root, topic, 0, broker)).to_pyarrow_table(
        columns=["offset", "key", "value"]).sort_by("offset")
    return list(zip(*(table.column(c).to_pylist() for c in ("offset", "key", "value")),
                    strict=True))


def latest(records: list[tuple[int, bytes, bytes | None]]) -> dict[bytes, tuple[int, bytes | None]]:
    return {key: (offset, value) for offset, key, value in records}


def test_a_compacted_topic_keeps_the_latest_value_per_key_on_every_replica(
        spark, cluster, topic_name, all_brokers_back) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, COMPACTED)])
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        produce_rounds(producer, topic_name, 0, 5)
        wait_for_identical_replicas(cluster, topic_name, 1)
        s = cluster.controller.image().partition(topic_name, 0)
        follower = next(r for r in s.replicas if r != s.leader)
        kill_and_hold(cluster, follower)
        produce_rounds(producer, topic_name, 5, 5)
        producer.send(topic_name, None, key=b"k0", partition=0).get(30)  # delete k0
        producer.send(topic_name, b"newest", key=b"k1", partition=0).get(30)
        with pytest.raises(errors.InvalidRecordError, match="Compacted topic cannot accept "
                           "message without key"):
            producer.send(topic_name, b"keyless", partition=0).get(30)
    before = read_all(cluster, topic_name)
    assert len(before) == 10 * KEYS + 2
    want = latest(before)

    results = cluster.log_cleaner.run([topic_name])
    assert results[0].error == "" and results[0].compacted[s.leader].removed > 0
    cluster.start_broker(follower)  # catches up from the compacted leader
    wait_until(lambda: follower in cluster.controller.image().partition(topic_name, 0).isr,
               "the follower back in the ISR")
    cluster.log_cleaner.run([topic_name])  # and compacts what it had copied
    # Replicas are compacted each on its own (as in Kafka, their files may differ), so each
    # must give the same latest values, with only original records and fewer of them.
    for broker in s.replicas:
        on_disk = replica_records(cluster, topic_name, broker)
        assert latest(on_disk) == want and set(on_disk) <= set(before), broker
        assert len(on_disk) < len(before), broker

    def compacted() -> bool:  # once the brokers have taken the rewritten files in
        return len(read_all(cluster, topic_name)) < len(before)
    wait_until(compacted, "the brokers to read the compacted log")
    after = read_all(cluster, topic_name)
    assert latest(after) == want  # the latest value of each key (k0: its tombstone), in place
    below_newest = [key for offset, key, _ in after if offset < before[-1][0]]
    assert sorted(below_newest) == sorted({key for _, key, _ in before})  # each key once
    assert set(after) <= set(before)  # same offsets, keys and values: nothing rewritten
    assert earliest(cluster, topic_name) == 0  # compaction does not move the log start

    rows = (spark.read.format("deltabus")
            .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
            .option("subscribe", topic_name).load()  # failOnDataLoss defaults to true
            .select("offset", "key", "value").collect())
    assert sorted((r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
                  for r in rows) == after
