"""Bench step (r): produce, fetch and latency on object storage, and what they cost in requests
(issue 18: p99 produce latency at acks=all under 400 ms there; the PUT and GET requests a
produced and a fetched MB cost).

A 3-broker cluster of its own, on the bench's Spark session once the local cluster stopped,
keeps its root on moto's S3 server on loopback (bench/moto_server.py), reached through the
storage options given to `Cluster` only. On it, as steps (b)-(g) do locally, each phase on a
topic of its own: bulk produce (send_batch, acks=1), per-record send() to the same topic, a
fetch of that topic from the beginning, bulk produce with acks=all to a topic of replication
factor 3, and produce-to-consume latency at acks=1 and at acks=all RF 3. The fetch is served
from the leader's tail cache, as a consumer keeping up is; then the leader is restarted (a
controlled shutdown, its cache empty after) and the same fetch reads the bucket, as a consumer
catching up does.

moto writes a line per request it serves to its access log, so every phase's requests are
counted by method (PUT, GET, HEAD, LIST, DELETE, POST): those on the phase's topic (its
replicas' Parquet files and Delta logs) per MB of record values (10^6 bytes) produced or
fetched, and the cluster's others (its metadata log's commits: topics made, ISR changes)
beside them. The idle cluster's requests are counted first, for IDLE_S: none on this machine,
so a phase's count is its own.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.moto_server import METHODS, by_method, log_mark, s3_server, served
from bench.produce_fetch import bulk_produce, chunk_values, fetch_all, latency, send_each
from bench.sizes import VALUE_BYTES, Sizes
from deltabus.client.admin import AdminClient
from deltabus.log_tables.layout import topic_path
from deltabus.metadata import NewTopic

BROKERS = 3
ROOT = "deltabus"  # the cluster's root in its bucket
IDLE_S = 3.0  # the idle cluster's requests are counted over this long
MB = 1_000_000
RESTART_S_MAX = 120.0
# The phases whose requests are divided by the MB they moved (the latency phases move a few KB).
PER_MB = ("produce", "send", "fetch", "replicated_produce", "cold_fetch")


def object_storage_run(spark: Any, root: str, sizes: Sizes) -> dict[str, Any]:
    """The figures of step (r): rates, latencies, and each phase's requests by method and per
    MB. Needs BROKERS free task slots on `spark`; the access log goes under `root`, which the
    caller removes."""
    log = Path(root) / "moto-access.log"
    with s3_server(log) as server, _cluster(spark, server) as cluster:
        return _measure(cluster, log, chunk_values(sizes.s3_records), sizes)


@contextlib.contextmanager
def _cluster(spark: Any, server: Any) -> Iterator[Any]:
    """A BROKERS-broker cluster on a new bucket of `server`, for the duration; afterwards
    the session's `format("deltabus")` reads without its options again."""
    from deltabus.cluster.cluster import Cluster
    from deltabus.spark import register

    bucket = server.create_bucket(f"deltabus-bench-{uuid.uuid4().hex[:8]}")
    cluster = Cluster(spark, root=f"{bucket}/{ROOT}", brokers=BROKERS, port=0, kafka_port=-1,
                      storage_options=server.options()).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        register(spark)


def _measure(cluster: Any, log: Path, values: pa.Table, sizes: Sizes) -> dict[str, Any]:
    bootstrap, run_id = cluster.bootstrap_servers, uuid.uuid4().hex[:8]
    topic, replicated = f"s3-{run_id}", f"s3-rf3-{run_id}"
    latency_topic, replicated_latency = f"s3-latency-{run_id}", f"s3-rf3-latency-{run_id}"
    records, send_records = sizes.s3_records, sizes.s3_send_records
    requests: dict[str, Any] = {}
    figures: dict[str, Any] = {"records": records, "send_records": send_records,
                               "value_bytes": VALUE_BYTES, "brokers": BROKERS,
                               "requests": requests}
    rf3 = {"min.insync.replicas": "2"}
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1), NewTopic(latency_topic, 1, 1),
                             NewTopic(replicated, 1, 3, rf3),
                             NewTopic(replicated_latency, 1, 3, rf3)])
        try:
            with _counted(log, requests, "idle", topic):
                time.sleep(IDLE_S)
            with _counted(log, requests, "produce", topic, records * VALUE_BYTES):
                figures["bulk_rps"] = bulk_produce(bootstrap, topic, values, records)
            with _counted(log, requests, "send", topic, send_records * VALUE_BYTES):
                figures["send_rps"] = send_each(bootstrap, topic, send_records)
            with _counted(log, requests, "fetch", topic) as fetch:
                figures["fetched_records"], figures["fetch_rps"] = fetch_all(bootstrap, topic)
                fetch["bytes"] = figures["fetched_records"] * VALUE_BYTES
            with _counted(log, requests, "replicated_produce", replicated,
                          records * VALUE_BYTES):
                figures["replicated_rps"] = bulk_produce(bootstrap, replicated, values,
                                                         records, acks="all")
            with _counted(log, requests, "latency", latency_topic):
                figures["latency_ms"] = latency(bootstrap, latency_topic,
                                                sizes.s3_latency_run_s)
            with _counted(log, requests, "replicated_latency", replicated_latency):
                figures["replicated_latency_ms"] = latency(
                    bootstrap, replicated_latency, sizes.s3_latency_run_s, acks="all")
            with _counted(log, requests, "restart", topic):
                figures["restart_s"] = _restart_leader(cluster, admin, topic)
            with _counted(log, requests, "cold_fetch", topic) as fetch:
                cold, figures["cold_fetch_rps"] = fetch_all(bootstrap, topic)
                fetch["bytes"] = cold * VALUE_BYTES
        finally:
            admin.delete_topics([topic, latency_topic, replicated, replicated_latency])
    for phase in PER_MB:
        counted = requests[phase]
        counted["per_mb"] = {m: n * MB / counted["bytes"] for m, n in counted["topic"].items()}
    return figures


def _restart_leader(cluster: Any, admin: AdminClient, topic: str) -> float:
    """Seconds from a controlled shutdown of the leader of `topic`'s partition 0 (replication
    factor 1) until it is back and leads the partition again. (Not `restart_broker`, which
    waits for a new process id: a local Spark may run the new task in the same Python worker.)
    """
    leader = admin.describe_topics([topic])[0].partitions[0].leader
    start = time.monotonic()
    cluster.stop_broker(leader, RESTART_S_MAX)
    cluster.start_broker(leader)
    while admin.describe_topics([topic])[0].partitions[0].leader != leader:
        if time.monotonic() - start > RESTART_S_MAX:
            raise RuntimeError(f"broker {leader} did not lead {topic} again in "
                               f"{RESTART_S_MAX:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - start


@contextlib.contextmanager
def _counted(log: Path, requests: dict[str, Any], phase: str, topic: str,
             moved_bytes: int = 0) -> Iterator[dict[str, Any]]:
    """Count the requests moto served while the block ran into `requests[phase]`: its seconds,
    the bytes of record values it moved (`moved_bytes`, or set by the block), and by method
    those on `topic`'s tables ("topic"; "data_files": of them, those on its Parquet files) and
    the others ("other")."""
    counted: dict[str, Any] = {"bytes": moved_bytes}
    start, began = log_mark(log), time.monotonic()
    yield counted
    counted["s"] = time.monotonic() - began
    made = served(log, start, log_mark(log))
    prefix = f"{topic_path(ROOT, topic)}/"
    mine = [(method, key) for method, key in made if key.startswith(prefix)]
    counted["topic"] = by_method(mine)
    counted["data_files"] = by_method([(m, k) for m, k in mine if k.endswith(".parquet")
                                       and "/_delta_log/" not in k])
    counted["other"] = by_method([(m, k) for m, k in made if not k.startswith(prefix)])
    for part in ("topic", "data_files", "other"):
        counted[f"{part}_total"] = sum(counted[part][m] for m in METHODS)
    requests[phase] = counted


def main(argv: list[str]) -> int:
    """Step (r) alone: `python -m bench.object_storage [records [send_records
    [latency_run_s]]]` (the defaults of `make bench`), on a local Spark session of its own;
    prints the figures as JSON."""
    records, send_records, run_s = [*argv, "", "", ""][:3]
    default = Sizes()
    sizes = Sizes(s3_records=int(records or default.s3_records),
                  s3_send_records=int(send_records or default.s3_send_records),
                  s3_latency_run_s=float(run_s or default.s3_latency_run_s))
    return run_alone("s3", object_storage_run, sizes)


def run_alone(name: str, step: Callable[[Any, str, Sizes], dict[str, Any]],
              sizes: Sizes) -> int:
    """A step of the bench on a cluster of its own (`step(spark, root, sizes)`) run by
    itself, on a local Spark session of its own; prints its figures as JSON."""
    import json
    import shutil
    import tempfile

    from deltabus.cluster.cluster import local_spark

    spark = local_spark(BROKERS + 2, app_name=f"deltabus-bench-{name}", ui=False)
    spark.sparkContext.setLogLevel("WARN")
    root = tempfile.mkdtemp(prefix=f"deltabus-bench-{name}-")
    try:
        figures = step(spark, root, sizes)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
