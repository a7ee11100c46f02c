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

import faulthandler
import json
import logging
import os
import sys
import time

import pyarrow as pa
import pyspark
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from deltabus import AdminClient, Cluster, Consumer, NewTopic, Producer, TopicPartition, errors
from deltabus.log_tables.layout import replica_path
from tests.cluster.acked_load import WAIT_S, AckedLoad, progress, wait_until

TOPIC = "t"
PARTITIONS = 3


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


def produce_through_leader_kill(cluster: Cluster) -> dict:
    with AckedLoad(cluster.bootstrap_servers, TOPIC) as load:
        wait_until(lambda: len(load.acked) >= 200, "records acknowledged before the kill")
        old = cluster.controller.image().partition(TOPIC, 0)
        old_pid = cluster.broker_pids()[old.leader]
        cluster.kill_broker(old.leader, executor=True)
        wait_until(lambda: cluster.controller.image().partition(TOPIC, 0).leader
                   not in (old.leader, -1), "a new leader")
        new = cluster.controller.image().partition(TOPIC, 0)
        wait_until(lambda: cluster.broker_pids().get(old.leader, old_pid) != old_pid,
                   "the killed broker to be relaunched")
        relaunched_at = len(load.acked)
        wait_until(lambda: len(load.acked) >= relaunched_at + 200,
                   "records acknowledged after the relaunch")
    found = load.check(PARTITIONS)
    wait_until(lambda: replicas_identical(cluster), "every replica to catch up")
    return {**found, "new_leader_in_old_isr": new.leader in old.isr,
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
