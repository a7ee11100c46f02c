"""Transaction markers are rows of a partition table, but never records: the Spark source reads
around them (with either isolation level), as deltabus's Consumer does, on a real cluster whose
markers were written as the transaction coordinator will write them (the leader's TxnMarkers
API, with the cluster's broker credential)."""

from __future__ import annotations

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from deltabus.log_tables.control_records import TxnMarker
from deltabus.rpc.txn_markers import write_txn_markers
from tests.conftest import wait_until


def _marker(cluster, topic: str, producer_id: int, committed: bool) -> None:
    image = cluster.controller.image()
    leader = image.broker(image.partition(topic, 0).leader).address
    outcome = write_txn_markers(leader, [TxnMarker(producer_id, 0, committed, 0, ((topic, 0),))],
                                timeout_ms=30_000,
                                broker_secret=cluster.config.inter_broker_secret)
    assert set(outcome.values()) == {None}


def test_markers_are_never_rows_of_the_spark_source_nor_records_of_a_consumer(
        spark, cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        producer.send(topic_name, b"v0", partition=0).get(30)
        producer.send(topic_name, b"v1", partition=0).get(30)
        _marker(cluster, topic_name, 6000, committed=False)  # offset 2
        producer.send(topic_name, b"v2", partition=0).get(30)
        _marker(cluster, topic_name, 6001, committed=True)  # offset 4
    for level in ("read_uncommitted", "read_committed"):
        df = (spark.read.format("deltabus")
              .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
              .option("subscribe", topic_name).option("kafka.isolation.level", level).load())
        rows = sorted((r.offset, r.value) for r in df.collect())
        assert rows == [(0, b"v0"), (1, b"v1"), (3, b"v2")], level
        assert consumed(cluster, topic_name, level) == [(0, b"v0"), (1, b"v1"), (3, b"v2")]


def consumed(cluster, topic: str, level: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record deltabus's Consumer reads until its position passes
    the last marker (offset 4)."""
    consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest",
                        isolation_level=level)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    seen: list[tuple[int, bytes]] = []

    def at_end() -> bool:
        seen.extend((r.offset, r.value) for r in consumer.poll(200))
        return consumer.position(tp) == 5

    wait_until(at_end, "the consumer to pass the markers", 30)
    consumer.close()
    return seen
