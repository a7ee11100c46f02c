"""Run by soak_scaling.py in its own process: under Spark dynamic allocation, executors follow
the brokers. A local-cluster master (three workers, separate executor JVMs of one core each)
with `spark.dynamicAllocation.enabled`; a cluster of 2 brokers scaled to 4 and back to 2 while
an acks=all producer sends. Each broker task holds an executor's one core, so a scale-out makes
Spark add executors, and a scale-in leaves the drained brokers' executors idle, which Spark
gives back after its idle timeout. Prints one JSON line of findings for the test to check.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import sys
from typing import Any

import pyspark
from pyspark.sql import SparkSession

from deltabus import AdminClient, Cluster, NewTopic
from tests.cluster.acked_load import AckedLoad, progress, wait_until

TOPIC, PARTITIONS, RF = "elastic", 8, 2
IDLE_TIMEOUT_S = 5


def executors(spark: SparkSession) -> int:
    """Executors the application holds now (the status tracker lists the driver too)."""
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1


def settled(cluster: Cluster) -> bool:
    return all(sorted(p.isr) == sorted(p.replicas) and not p.adding_replicas
               and not p.removing_replicas
               for p in cluster.controller.image().topics[TOPIC].partitions)


def main(root: str, dump_after_s: float) -> None:
    faulthandler.dump_traceback_later(dump_after_s, exit=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    spark = (SparkSession.builder.master("local-cluster[3,2,1200]")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.cores", "1")
             .config("spark.executor.memory", "512m")  # two executors a worker
             .config("spark.dynamicAllocation.enabled", "true")
             .config("spark.dynamicAllocation.shuffleTracking.enabled", "true")
             .config("spark.dynamicAllocation.minExecutors", "0")
             .config("spark.dynamicAllocation.maxExecutors", "6")
             .config("spark.dynamicAllocation.schedulerBacklogTimeout", "1s")
             .config("spark.dynamicAllocation.executorIdleTimeout", f"{IDLE_TIMEOUT_S}s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cluster = Cluster(spark, root=root, brokers=2, port=0, kafka_port=-1,
                      schema_registry_port=-1).start()
    result: dict[str, Any] = {}
    try:
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, RF)])
        wait_until(lambda: settled(cluster), "the topic's partitions settled")
        # the jobs that created the topic's tables are done: their executors go idle
        wait_until(lambda: executors(spark) == 2, "two executors, one a broker")
        result["start"] = executors(spark)
        with AckedLoad(cluster.bootstrap_servers, TOPIC) as load:
            wait_until(lambda: len(load.acked) > 200, "records acknowledged")
            result["out_status"] = cluster.scale(4).state
            result["out_peak"] = executors(spark)  # the moves' catch-up tasks took some too
            wait_until(lambda: executors(spark) == 4, "an executor a broker, the others idle")
            result["out"] = executors(spark)
            progress(f"scaled to 4 brokers on {result['out']} executors")
            result["in_status"] = cluster.scale(2).state
            wait_until(lambda: executors(spark) == 2, "the drained brokers' executors gone")
            result["in"] = executors(spark)
            progress(f"scaled back to 2 brokers on {result['in']} executors")
        result["grpc"] = load.check(PARTITIONS)
        result["live"] = cluster.controller.live_brokers()
        print(json.dumps(result))
    finally:
        cluster.stop()
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
