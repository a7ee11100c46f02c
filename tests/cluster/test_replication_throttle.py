"""A throttled move on a running cluster (issue 41): a reassignment's new replica copies at
follower.replication.throttled.rate / leader.replication.throttled.rate, never faster, and
still copies everything and joins the ISR."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from deltabus import AdminClient, Cluster, NewTopic, Producer
from deltabus.log_tables.layout import replica_path
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(600)

RATE = 200_000  # bytes a second, each side
BATCHES, BATCH_BYTES = 60, 20_000


@pytest.fixture
def throttled_cluster(spark: Any, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(spark, root=str(tmp_path / "root"), brokers=2, port=0, kafka_port=-1,
                      schema_registry_port=-1, auto_balance_enable=False,
                      leader_replication_throttled_rate=RATE,
                      follower_replication_throttled_rate=RATE).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def data_bytes(root: str, broker: int) -> int:
    return sum(f.stat().st_size for f in Path(replica_path(root, "moving", 0, broker)).glob(
        "*.parquet"))


def values(root: str, broker: int) -> list[bytes]:
    table = DeltaTable(replica_path(root, "moving", 0, broker)).to_pyarrow_table(
        columns=["offset", "value"]).sort_by("offset")
    return table.column("value").to_pylist()


def test_a_moved_replica_copies_at_the_throttled_rate(throttled_cluster: Cluster) -> None:
    bootstrap, root = throttled_cluster.bootstrap_servers, throttled_cluster.config.root
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic("moving", replica_assignment={0: [0]})])
        with Producer(bootstrap, acks="all") as producer:
            for _ in range(BATCHES):  # a commit, and a data file, each
                producer.send("moving", os.urandom(BATCH_BYTES), partition=0)  # incompressible
                producer.flush(60)
        total = data_bytes(root, 0)
        assert total > 5 * RATE  # five seconds of copying at the rate, at least

        started = time.monotonic()
        assert admin.alter_partition_reassignments({("moving", 0): [0, 1]}) == {
            ("moving", 0): None}

        def moved() -> bool:
            (topic,) = admin.describe_topics(["moving"])
            (p,) = topic.partitions
            return sorted(p.isr) == [0, 1] and not p.adding_replicas and \
                list(p.replicas) == [0, 1]
        wait_until(moved, "the new replica in the ISR", timeout_s=300)
        elapsed = time.monotonic() - started
    assert elapsed >= 0.9 * total / RATE, (elapsed, total)
    assert values(root, 1) == values(root, 0)
    assert len(values(root, 1)) == BATCHES
