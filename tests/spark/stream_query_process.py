"""A streaming query in a process of its own, for tests that SIGKILL it (driver and JVM).

    python stream_query_process.py BOOTSTRAP TOPIC OUT CHECKPOINT run|drain

`run` streams the topic into Parquet files at OUT until killed, printing "progress" after each
micro-batch; `drain` reads what is left (availableNow) and exits.
"""

from __future__ import annotations

import sys
import time

from deltabus import local_spark


def main(bootstrap: str, topic: str, out: str, checkpoint: str, mode: str) -> None:
    spark = local_spark(2, app_name="deltabus-killed-query", ui=False)
    spark.sparkContext.setLogLevel("ERROR")
    stream = (spark.readStream.format("deltabus").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "2000").load()
              .selectExpr("cast(value AS string) AS value", "partition", "offset"))
    writer = (stream.writeStream.format("parquet").option("path", out)
              .option("checkpointLocation", checkpoint))
    if mode == "drain":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        print("drained", flush=True)
        return
    query = writer.trigger(processingTime="100 milliseconds").start()
    seen = 0
    while True:
        if len(query.recentProgress) > seen:
            seen = len(query.recentProgress)
            print("progress", seen, flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main(*sys.argv[1:6])
