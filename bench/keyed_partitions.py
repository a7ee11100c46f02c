"""Step (p)'s keyed part alone, for working on it: `python -m bench.keyed_partitions [partitions
[records [rounds]]]` (1,000, 100,000 and 3 by default, as in `make bench`) on an embedded 3-broker
cluster of its own; prints the figures `partition_count` reports under "keyed" as JSON. The rest
of step (p) (12,000 partitions, a broker killed) takes half an hour; this takes a few minutes."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import uuid

from bench.partition_count import _keyed_one_vs_many
from bench.sizes import Sizes


def main(argv: list[str]) -> int:
    from deltabus.cluster.cluster import Cluster, local_spark

    sizes = Sizes()
    defaults = [sizes.keyed_partitions, sizes.keyed_records, sizes.keyed_rounds]
    partitions, records, rounds = ([int(a) for a in argv] + defaults[len(argv):])[:3]
    root = tempfile.mkdtemp(prefix="deltabus-keyed-")
    spark = local_spark(5, app_name="deltabus-bench-keyed", ui=False)
    spark.sparkContext.setLogLevel("WARN")
    cluster = Cluster(spark, root=f"{root}/cluster", brokers=3, port=0, kafka_port=0).start()
    try:
        figures = _keyed_one_vs_many(cluster.bootstrap_servers, uuid.uuid4().hex[:8],
                                     partitions, records, rounds)
    finally:
        cluster.stop()
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
