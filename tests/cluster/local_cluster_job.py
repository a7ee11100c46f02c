"""Run by test_local_cluster.py in its own process: a deltabus cluster on Spark's local-cluster
master, where every executor is a separate JVM with its own Python workers. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
import time

import pyspark
from pyspark.sql import SparkSession

from deltabus import AdminClient, Cluster, Consumer, NewTopic, Producer, TopicPartition


def main(root: str, port: int) -> None:
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    spark = (SparkSession.builder.master("local-cluster[4,1,1024]")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cluster = Cluster(spark, root=root, brokers=3, port=port).start()
    try:
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("t", 3, 1)])
        with Producer(cluster.bootstrap_servers) as producer:
            for i in range(100):
                producer.send("t", f"{i}", key=str(i))
        victim = cluster.controller.image().partition("t", 0).leader
        old_pid = cluster.broker_pids()[victim]
        cluster.kill_broker(victim)
        deadline = time.monotonic() + 120
        while cluster.broker_pids().get(victim, old_pid) == old_pid:
            assert time.monotonic() < deadline, "broker not relaunched"
            time.sleep(0.1)
        with Producer(cluster.bootstrap_servers) as producer:
            producer.send("t", b"after-kill", partition=0).get(60)
        consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest")
        consumer.assign([TopicPartition("t", p) for p in range(3)])
        records = []
        while len(records) < 101 and time.monotonic() < deadline:
            records.extend(consumer.poll(1000))
        consumer.close()
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        print(json.dumps({"records": len(records), "executors": executors,
                          "pids": len(set(cluster.broker_pids().values()))}))
    finally:
        cluster.stop()
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
