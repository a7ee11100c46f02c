"""Run by test_standalone_cluster.py in its own process (a SparkContext of its own): the driver of
a deltabus cluster on a Spark standalone cluster of simulated machines (tests/cluster/
standalone.py), its root on the S3 emulator. Prints one JSON line of findings.

1. The brokers bind and advertise their own machine's address, never the driver's.
2. Two idempotent producers send with acks=all (replication factor 3, min.insync.replicas=2),
   bootstrapping on the driver and reaching the brokers through the advertised addresses only,
   while the worker JVM of partition 0's leader is SIGKILLed: its executor goes with it, and
   its brokers come back on the other machines.
3. Everything acknowledged is read back once, in order.

Arguments: a JSON object with root, storage_options, master_url and workers ({host: pid}).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from deltabus import AdminClient, Cluster, Consumer, NewTopic, Producer, TopicPartition

TOPIC = "t"
PARTITIONS = 3
WAIT_S = 180


def progress(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    progress(f"waiting for {what}")
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def broker_hosts(cluster: Cluster) -> dict[int, str]:
    """Each registered broker's advertised host, from the controller's metadata."""
    return {b.broker_id: b.host for b in cluster.controller.image().brokers}


def listening_addresses(cluster: Cluster) -> dict[int, list[str]]:
    """Every listener each broker told the controller, as host:port."""
    return {b.broker_id: sorted(f"{e.host}:{e.port}" for e in b.listeners)
            for b in cluster.controller.image().brokers}


def produce_through_worker_kill(cluster: Cluster, workers: dict[str, int]) -> dict[str, Any]:
    acked: list[tuple[int, int, bytes]] = []
    failed: list[str] = []
    stop = threading.Event()

    def on_done(value: bytes) -> Callable[[Any], None]:
        def done(future: Any) -> None:
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
                if i % 50 == 0:
                    time.sleep(0.05)
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
        before = broker_hosts(cluster)
        old = cluster.controller.image().partition(TOPIC, 0)
        machine = before[old.leader]
        lost_brokers = sorted(b for b, host in before.items() if host == machine)
        progress(f"killing the worker on {machine} (brokers {lost_brokers})")
        os.kill(workers[machine], signal.SIGKILL)
        wait_until(lambda: cluster.controller.image().partition(TOPIC, 0).leader
                   not in (old.leader, -1), "a new leader")
        new = cluster.controller.image().partition(TOPIC, 0)
        wait_until(lambda: all(broker_hosts(cluster).get(b, machine) != machine
                               for b in lost_brokers),
                   "the lost brokers to register from the other machines")
        wait_until(lambda: all(sorted(cluster.controller.image().partition(TOPIC, p).isr)
                               == [0, 1, 2] for p in range(PARTITIONS)),
                   "every replica back in the ISR")
        relaunched_at = len(acked)
        wait_until(lambda: len(acked) >= relaunched_at + 200,
                   "records acknowledged after the relaunch")
        after = broker_hosts(cluster)
    finally:
        stop.set()
        for t in senders:
            t.join()
    progress(f"producers done: {len(acked)} acknowledged, {len(failed)} failed")
    records = read_all(cluster.bootstrap_servers, len(acked))
    stored = {(r.partition, r.offset): r.value for r in records}
    values = [r.value for r in records]
    in_order = all(
        [r.value for r in records if r.partition == p and r.value.startswith(name)]
        == sorted(r.value for r in records if r.partition == p and r.value.startswith(name))
        for p in range(PARTITIONS) for name in (b"p", b"q"))
    return {"killed_machine": machine, "lost_brokers": lost_brokers,
            "hosts_before": before, "hosts_after": after,
            "acked": len(acked), "failed": failed[:5],
            "lost": sum(1 for a in acked if stored.get((a[0], a[1])) != a[2]),
            "duplicates": len(values) - len(set(values)), "in_order": in_order,
            "new_leader_in_old_isr": new.leader in old.isr}


def read_all(bootstrap: str, expected: int) -> list[Any]:
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    records: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(records) < expected and time.monotonic() < deadline:
        records.extend(consumer.poll(1000, max_records=100_000))
    consumer.close()
    return records


def main(args: dict[str, Any], dump_after_s: float) -> None:
    faulthandler.dump_traceback_later(dump_after_s, exit=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    spark = (SparkSession.builder.master(args["master_url"])
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.memory", "1g")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    executors = len(args["workers"]) + 1  # and the driver's block manager
    wait_until(lambda: spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
               >= executors, "an executor on every worker")
    cluster = Cluster(spark, root=args["root"], brokers=3, port=0,
                      storage_options=args["storage_options"]).start()
    try:
        result: dict[str, Any] = {"listeners": listening_addresses(cluster),
                                  "driver": cluster.bootstrap_servers}
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
        progress(f"cluster up on {broker_hosts(cluster)}, topic created")
        result["worker_kill"] = produce_through_worker_kill(cluster, args["workers"])
        print(json.dumps(result))
    finally:
        cluster.stop()
        spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), float(sys.argv[2]))
