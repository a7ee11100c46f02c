"""Run by test_local_cluster.py in its own process: a deltabus cluster on Spark's local-cluster
master, where every executor is a separate JVM with its own Python workers, and executors are
killed with SIGKILL. Prints one JSON line of findings for the test to check.

1. Two idempotent producers send with acks=all to a topic with replication factor 3 and
   min.insync.replicas=2 while the executor of partition 0's leader is killed.
2. A follower's executor is killed: producing goes on, the follower rejoins and catches up.
3. Two of the three brokers are killed and kept down: acks=all fails NOT_ENOUGH_REPLICAS,
   consumers still read everything committed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyspark
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from deltabus import AdminClient, Cluster, Consumer, NewTopic, Producer, TopicPartition, errors
from deltabus.log_tables.layout import replica_path

TOPIC = "t"
PARTITIONS = 3
WAIT_S = 120


def progress(what: str) -> None:
    """A time-stamped line on stderr, so a slow or stuck run shows how far it got."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    progress(f"waiting for {what}")
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def replica_values(cluster: Cluster, partition: int, broker: int) -> list:
    table = DeltaTable(replica_path(cluster.config.root, TOPIC, partition, broker))
    return table.to_pyarrow_table(columns=["offset", "value"]).sort_by("offset").to_pylist()


def replica_extent(cluster: Cluster, partition: int, broker: int) -> tuple[int, int]:
    """(records, last offset) of a replica's table, from its file statistics: cheap to poll."""
    table = DeltaTable(replica_path(cluster.config.root, TOPIC, partition, broker))
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return sum(actions["num_records"]), max(actions["max.offset"], default=-1)


def replicas_identical(cluster: Cluster) -> bool:
    """Every replica in the ISR and as long as its leader; then, once, record for record."""
    for p in range(PARTITIONS):
        s = cluster.controller.image().partition(TOPIC, p)
        if s.leader < 0 or sorted(s.isr) != sorted(s.replicas):
            return False
        leader = replica_extent(cluster, p, s.leader)
        if any(replica_extent(cluster, p, r) != leader for r in s.replicas):
            return False
    for p in range(PARTITIONS):
        s = cluster.controller.image().partition(TOPIC, p)
        leader_records = replica_values(cluster, p, s.leader)
        if any(replica_values(cluster, p, r) != leader_records for r in s.replicas):
            return False
    return True


def read_all(bootstrap: str, expected: int) -> list:
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    records: list = []
    deadline = time.monotonic() + WAIT_S
    while len(records) < expected and time.monotonic() < deadline:
        records.extend(consumer.poll(1000, max_records=100_000))
    consumer.close()
    return records


def produce_through_leader_kill(cluster: Cluster) -> dict:
    acked: list[tuple[int, int, bytes]] = []
    failed: list[str] = []
    stop = threading.Event()

    def on_done(value: bytes) -> Callable:
        def done(future) -> None:
            error = future.exception()
            if error is None:
                meta = future.get(0)
                acked.append((meta.partition, meta.offset, value))
            else:
                failed.append(repr(error))
        return done

    def produce(name: str) -> None:
        producer = Producer(cluster.bootstrap_servers, acks="all", linger_ms=2,
                            delivery_timeout_ms=WAIT_S * 1000)
        try:
            i = 0
            while not stop.is_set():
                value = f"{name}-{i:07d}".encode()
                producer.send(TOPIC, value, key=f"{name}{i % 11}").add_done_callback(
                    on_done(value))
                i += 1
                if i % 100 == 0:
                    time.sleep(0.02)
            producer.flush(WAIT_S)
        except Exception as e:  # counted, so the loss check below still runs
            failed.append(f"flush: {e!r}")
        finally:
            with contextlib.suppress(Exception):
                producer.close(1)

    senders = [threading.Thread(target=produce, args=(n,)) for n in ("p", "q")]
    for t in senders:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 200, "records acknowledged before the kill")
        old = cluster.controller.image().partition(TOPIC, 0)
        old_pid = cluster.broker_pids()[old.leader]
        cluster.kill_broker(old.leader, executor=True)
        wait_until(lambda: cluster.controller.image().partition(TOPIC, 0).leader
                   not in (old.leader, -1), "a new leader")
        new = cluster.controller.image().partition(TOPIC, 0)
        wait_until(lambda: cluster.broker_pids().get(old.leader, old_pid) != old_pid,
                   "the killed broker to be relaunched")
        relaunched_at = len(acked)
        wait_until(lambda: len(acked) >= relaunched_at + 200,
                   "records acknowledged after the relaunch")
    finally:
        stop.set()
        for t in senders:
            t.join()
    progress(f"producers done: {len(acked)} acknowledged, {len(failed)} failed")
    records = read_all(cluster.bootstrap_servers, len(acked))
    progress(f"read {len(records)} records")
    stored = {(r.partition, r.offset): r.value for r in records}
    values = [r.value for r in records]
    in_order = all(
        [r.value for r in records if r.partition == p and r.value.startswith(name)]
        == sorted(r.value for r in records if r.partition == p and r.value.startswith(name))
        for p in range(PARTITIONS) for name in (b"p", b"q"))
    wait_until(lambda: replicas_identical(cluster), "every replica to catch up")
    first_of_each = list({e.split(":")[0]: e for e in reversed(failed)}.values())
    return {"acked": len(acked), "failed": failed[:3] + first_of_each[:3],
            "lost": sum(1 for a in acked if stored.get((a[0], a[1])) != a[2]),
            "duplicates": len(values) - len(set(values)), "in_order": in_order,
            "new_leader_in_old_isr": new.leader in old.isr,
            "epoch_bumped": new.leader_epoch > old.leader_epoch}


def follower_kill(cluster: Cluster) -> dict:
    s = cluster.controller.image().partition(TOPIC, 1)
    follower = next(r for r in s.replicas if r != s.leader)
    cluster.kill_broker(follower, relaunch=False, executor=True)  # down until started
    wait_until(lambda: follower not in cluster.controller.image().partition(TOPIC, 1).isr,
               "the ISR to shrink")
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        futures = [producer.send(TOPIC, f"f-{i}".encode(), partition=1) for i in range(200)]
        producer.flush(WAIT_S)
    produced = sum(1 for f in futures if f.get(0).offset >= 0)
    cluster.start_broker(follower)
    wait_until(lambda: replicas_identical(cluster), "the follower to rejoin")
    return {"produced_while_follower_down": produced}


def two_of_three_down(cluster: Cluster) -> dict:
    s = cluster.controller.image().partition(TOPIC, 2)
    followers = [r for r in s.replicas if r != s.leader]
    for broker in followers:
        cluster.kill_broker(broker, relaunch=False, executor=True)
    wait_until(lambda: cluster.controller.image().partition(TOPIC, 2).isr == (s.leader,),
               "the ISR to shrink to the leader")
    refused = ""
    with Producer(cluster.bootstrap_servers, acks="all", delivery_timeout_ms=3000,
                  request_timeout_ms=2000) as producer:
        try:
            producer.send(TOPIC, b"refused", partition=2).get(30)
        except errors.DeltaBusError as e:
            refused = e.name
    consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(TOPIC, 2)])
    got: list = []
    expected = len(replica_values(cluster, 2, s.leader))
    deadline = time.monotonic() + WAIT_S
    while len(got) < expected and time.monotonic() < deadline:
        got.extend(consumer.poll(1000, max_records=100_000))
    consumer.close()
    for broker in followers:
        cluster.start_broker(broker)
    wait_until(lambda: replicas_identical(cluster), "the brokers to come back")
    return {"refused_with": refused, "read_while_down": len(got), "committed": expected,
            "refused_record_absent": b"refused" not in {r.value for r in got}}


def main(root: str, dump_after_s: float) -> None:
    # Before the test gives up on us, print every thread's stack to stderr: where it hangs.
    faulthandler.dump_traceback_later(dump_after_s, exit=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    spark = (SparkSession.builder.master("local-cluster[4,1,1024]")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    # Port 0: any free ports. A fixed port P puts broker b on P + 1 + b, which another test's
    # server or a client's ephemeral port may hold.
    cluster = Cluster(spark, root=root, brokers=3, port=0).start()
    try:
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
        progress("cluster up, topic created")
        result = {"leader_kill": produce_through_leader_kill(cluster)}
        progress("leader kill done")
        result["follower_kill"] = follower_kill(cluster)
        progress("follower kill done")
        result["two_down"] = two_of_three_down(cluster)
        progress("two down done")
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        result.update(executors=executors, pids=len(set(cluster.broker_pids().values())))
        print(json.dumps(result))
    finally:
        cluster.stop()
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
