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

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from pyspark.sql import SparkSession

from deltabus import AdminClient, Cluster, NewTopic
from tests.cluster.acked_load import AckedLoad, progress, wait_until

TOPIC = "t"
PARTITIONS = 3


def broker_hosts(cluster: Cluster) -> dict[int, str]:
    """Each registered broker's advertised host, from the controller's metadata."""
    return {b.broker_id: b.host for b in cluster.controller.image().brokers}


def listening_addresses(cluster: Cluster) -> dict[int, list[str]]:
    """Every listener each broker told the controller, as host:port."""
    return {b.broker_id: sorted(f"{e.host}:{e.port}" for e in b.listeners)
            for b in cluster.controller.image().brokers}


class History:
    """What the controller's metadata said over the run, sampled every 0.1 s: each change of a
    partition's leader, epoch and ISR, and of the registered brokers (host, epoch, live), as
    lines "HH:MM:SS.mmm what", for the findings of a run that lost records (the controller's
    own log, on the job's stderr, has every change; this has them side by side)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="history", daemon=True)

    def __enter__(self) -> History:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last: dict[str, str] = {}
        while not self._stop.wait(0.1):
            controller = self.cluster.controller
            if controller is None:
                continue
            try:
                image = controller.image()
                live = set(controller.live_brokers())
                epochs = controller.broker_epochs()
                now = {f"broker {b.broker_id}": f"{b.host} epoch {epochs.get(b.broker_id)} "
                       + ("live" if b.broker_id in live else "fenced") for b in image.brokers}
                for p in range(PARTITIONS):
                    s = image.partition(TOPIC, p)
                    now[f"{TOPIC}-{p}"] = f"leader {s.leader} epoch {s.leader_epoch} " \
                                          f"ISR {list(s.isr)}"
            except Exception as e:  # the cluster stopping
                now = {"error": repr(e)}
            stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
            for key, value in now.items():
                if last.get(key) != value:
                    self.lines.append(f"{stamp} {key}: {value}")
            last = now


def produce_through_worker_kill(cluster: Cluster, workers: dict[str, int]) -> dict[str, Any]:
    with History(cluster) as history, AckedLoad(cluster.bootstrap_servers, TOPIC) as load:
        wait_until(lambda: len(load.acked) >= 200, "records acknowledged before the kill")
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
        relaunched_at = len(load.acked)
        wait_until(lambda: len(load.acked) >= relaunched_at + 200,
                   "records acknowledged after the relaunch")
        after = broker_hosts(cluster)
    found = load.check(PARTITIONS)
    if found["lost"]:
        found["history"] = history.lines
    return {"killed_machine": machine, "lost_brokers": lost_brokers,
            "hosts_before": before, "hosts_after": after, "old": describe(old),
            "new": describe(new), "new_leader_in_old_isr": new.leader in old.isr, **found}


def describe(state: Any) -> str:
    return f"leader {state.leader} epoch {state.leader_epoch} ISR {list(state.isr)}"


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
