"""Run by soak_scaling.py in its own process: under Spark dynamic allocation, executors follow
the brokers. A local-cluster master (three workers, separate executor JVMs of one core each)
with `spark.dynamicAllocation.enabled`; a cluster of 2 brokers scaled to 4 and back to 2 while
an acks=all producer sends. Each broker task holds an executor's one core, so a scale-out makes
Spark add executors, and a scale-in leaves the drained brokers' executors idle, which Spark
gives back after its idle timeout. Prints one JSON line of findings for the test to check.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pyspark.sql import SparkSession

from deltabus import AdminClient, Cluster, NewTopic
from tests.cluster.acked_load import AckedLoad, progress, wait_until
from tests.soak.job_session import job_session

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
    spark = job_session("local-cluster[3,2,1200]", dump_after_s, {
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",  # two executors a worker
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "0",
        "spark.dynamicAllocation.maxExecutors": "6",
        "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
        "spark.dynamicAllocation.executorIdleTimeout": f"{IDLE_TIMEOUT_S}s"})
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
