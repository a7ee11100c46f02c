"""Brokers joining and leaving a running cluster (deltabus/cluster/scaling.py): a scale-out
takes its share of replicas and leaders, a scale-in drains before it stops anyone, both under
acks=all producers, through the API and through `deltabus cluster scale` / `balance`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltabus import AdminClient, Cluster, NewTopic, Producer, errors
from deltabus.cli.main import main
from deltabus.cluster.balancer import bounds
from tests.cluster.acked_load import AckedLoad
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(900)

TOPIC, PARTITIONS, RF = "scaled", 6, 2


@pytest.fixture
def small_cluster(spark: Any, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(spark, root=str(tmp_path / "root"), brokers=2, port=0,
                      kafka_port=-1, schema_registry_port=-1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def spread(admin: AdminClient) -> dict[int, tuple[int, int]]:
    """(replicas, leaders) per broker, from the metadata clients see."""
    (topic,) = admin.describe_topics([TOPIC])
    out: dict[int, list[int]] = {}
    for p in topic.partitions:
        for b in p.replicas:
            out.setdefault(b, [0, 0])[0] += 1
        out.setdefault(p.leader, [0, 0])[1] += 1
    return {b: (r, lead) for b, (r, lead) in sorted(out.items())}


def fully_replicated(admin: AdminClient) -> bool:
    (topic,) = admin.describe_topics([TOPIC])
    return all(sorted(p.isr) == sorted(p.replicas) and not p.adding_replicas
               and not p.removing_replicas for p in topic.partitions)


def cli(capsys: pytest.CaptureFixture[str], bootstrap: str, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main([*argv, "--bootstrap-server", bootstrap])
    return rc, capsys.readouterr().out


def test_brokers_join_and_leave_under_load(small_cluster: Cluster,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = small_cluster.bootstrap_servers
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, RF)])
        with AckedLoad(bootstrap, TOPIC) as load:
            wait_until(lambda: len(load.acked) > 200, "records acknowledged before the scale")
            rc, out = cli(capsys, bootstrap, "cluster", "scale", "--brokers", "3")
            assert rc == 0, out
            assert "Scaling the cluster from 2 to 3 brokers." in out
            assert out.rstrip().endswith("The cluster runs 3 brokers: 0, 1, 2."), out
            wait_until(lambda: fully_replicated(admin), "every partition fully replicated")
            after_out = spread(admin)
            lo, hi = bounds(PARTITIONS * RF, 3)
            assert all(lo <= r <= hi for r, _ in after_out.values()), after_out
            lo, hi = bounds(PARTITIONS, 3)
            assert all(lo <= lead <= hi for _, lead in after_out.values()), after_out
            assert set(after_out) == {0, 1, 2}

            rc, out = cli(capsys, bootstrap, "cluster", "balance", "--dry-run")
            assert rc == 0 and "The cluster is balanced" in out, out

            status = small_cluster.scale(2)
            assert (status.state, status.members) == ("done", (0, 1))
            wait_until(lambda: fully_replicated(admin), "every partition fully replicated")
            assert set(spread(admin)) == {0, 1}
            assert small_cluster.controller.live_brokers() == [0, 1]
        found = load.check(PARTITIONS)
    assert (found["lost"], found["duplicates"], found["in_order"]) == (0, 0, True), found
    assert found["acked"] > 200


def test_a_scale_that_cannot_be_done_is_refused_before_anything_moves(
        small_cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = small_cluster.bootstrap_servers
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 2, 2)])
        with pytest.raises(errors.InvalidReplicationFactorError,
                           match=f"topic {TOPIC} has replication factor 2"):
            admin.scale_cluster(1)
        with pytest.raises(errors.InvalidRequestError, match="task slots"):
            small_cluster.scale(40)
        assert admin.scale_cluster().members == (0, 1)
    rc, out = cli(capsys, bootstrap, "cluster", "scale", "--brokers", "1")
    assert rc != 0
    rc, out = cli(capsys, bootstrap, "cluster", "scale", "--describe")
    assert rc == 0 and "Members: [0, 1]" in out, out


def test_the_autoscaler_follows_a_load_that_rises_and_falls(spark: Any, tmp_path: Path) -> None:
    """A load of ~100 KB/s over 2 brokers (targets of 20 KB/s each) adds a broker up to the
    maximum, 3; when it stops, one goes, but not before the cool-down since the last scale."""
    cooldown_s = 15
    cluster = Cluster(spark, root=str(tmp_path / "root"), brokers=2, port=0, kafka_port=-1,
                      schema_registry_port=-1, load_report_interval_ms=1000,
                      broker_autoscale_min=2, broker_autoscale_max=3,
                      broker_autoscale_target_bytes_in_per_sec=20_000,
                      broker_autoscale_window_ms=3000,
                      broker_autoscale_cooldown_ms=cooldown_s * 1000).start()
    counts: list[int] = []
    try:
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("auto", 4, 2)])
        stop = threading.Event()

        def produce() -> None:
            with Producer(cluster.bootstrap_servers, acks="all") as producer:
                while not stop.wait(0.01):
                    producer.send("auto", b"x" * 1000)

        def members() -> int:
            counts.append(len(cluster.controller.members()))
            return counts[-1]

        sender = threading.Thread(target=produce)
        sender.start()
        try:
            wait_until(lambda: members() == 3, "the autoscaler to add a broker", 300)
            up = time.monotonic()
        finally:
            stop.set()
            sender.join()
        wait_until(lambda: members() == 2 and cluster.scaler.status().state == "done",
                   "the autoscaler to remove a broker", 300)
        assert time.monotonic() - up >= cooldown_s
        assert max(counts) == 3 and min(counts) == 2  # never past its bounds
    finally:
        cluster.stop()
