"""`make bench` (`python -m bench`): deltabus's throughput and latency against its targets.

Everything runs in one process against an embedded 3-broker cluster (or, with --bootstrap-server,
a running one), in an order where each step leaves what the next needs:

    (a) straight write_deltalake of the produce batches, the bare commit of the same batches (a
        pyarrow file and its commit file, as the append path writes them), and one small commit
        (3 records) made each way of committing, from write_deltalake to the bare commit: the
        physical limits of this machine (see commit_paths)
    (b) bulk produce (send_batch, acks=1) of the same batches, to a 1-partition topic
    (c) per-record send() to the same topic
    (d) fetch of the whole topic with poll_batch, from the beginning
    (e) produce-to-consume latency: one small record every ~2 ms for ~3 s, linger.ms=0, and
        where each record's time went, stage by stage (bench/latency_trace.py)
    (f) bulk produce as (b) but acks=all to a topic with replication factor 3
    (g) latency as (e) but acks=all with replication factor 3, with its breakdown too
    (h) offset commits: 100 consumers each committing every 100 ms (see groups)
    (i) rebalance time of a 10-member group when one member leaves
    (j) a Structured Streaming query draining a 10-million-record topic, against a Python data
        source serving the records from memory, and SQL over the topic on Spark's own Parquet
        reader, against Spark reading the same Parquet files directly (see stream_drain)
    (k) a partition table after 10,000 small commits: open time and fetch rate of the broker's
        log, before and after the log cleaner's small-file compaction (see small_files)
    (l) Kafka's perf-test workload through a Kafka client (confluent-kafka) on the Kafka
        listeners, beside deltabus's gRPC clients, in the same run (see kafka_clients)
    (m) produce and fetch over SASL_SSL (SCRAM-SHA-256, TLS) on a 2-broker cluster of its own,
        beside the same over PLAINTEXT on the bench's cluster (see sasl_ssl); only with the
        embedded cluster, whose Spark session has the task slots for it
    (n) 5,000 idle Kafka connections to the embedded cluster's bootstrap Kafka listener: the
        driver's resident memory per connection and its threads (see idle_connections); only
        with the embedded cluster, whose listener runs in this process
    (o) a producer with a producer_byte_rate quota beside one without: the quota'd one's steady
        rate after its first burst, held within 10% of its quota, and the other's (see quotas)
    (p) partitions by the thousand: keyed send() over 1,000 partitions against one, then 12,000
        partitions (4,000 a broker) created and led, brokers' threads and memory, fence events,
        and a broker killed and back (see partition_count); only with the embedded cluster,
        whose brokers' processes it reads
    (q) a well-behaved producer's send() rate alone and beside a hostile client sending, from a
        process of its own, the requests issue 17's review found (see hostile_clients); only
        with a Kafka listener
    (r) on object storage: a 3-broker cluster of its own with its root on moto's S3 server on
        loopback, after the embedded cluster stopped (on the task slots its brokers held): bulk
        produce, per-record send(), fetch (from the tail cache, then from the bucket after the
        leader restarted), bulk produce and latency at acks=1 and at acks=all with replication
        factor 3, and each phase's S3 requests by method, per produced or fetched MB (see
        object_storage); only with the embedded cluster
    (s) bulk produce of the same Avro records to a typed topic (value.schema.subject: the leader
        decodes every record into typed columns) and to an untyped one, alternating rounds
        (see typed_produce); runs before (r), on the cluster of the other steps
    (t) a broker's commit round over 1,000 partitions (one small batch each, on the process's
        append pool) against 1,000 bare commits of (a) (see commit_round); runs last, with no
        cluster
    (u) brokers joining a loaded cluster: 3 -> 6 brokers with 60 partitions holding 1 GB, the
        time from the scale to balanced and a steady producer's rate and latency during the
        moves against before them (see scaling); a cluster of its own after the embedded one
        stopped, only with the embedded cluster
    (v) what metrics cost: bulk produce, fetch and per-record send() on a 1-broker cluster
        keeping and serving metrics (scraped every second) against one with metrics.port -1,
        alternating rounds (see metrics_overhead); after (m), only with the embedded run's Spark
    (w) diskless topics against replicated ones on S3 (moto): bulk produce at acks=all with
        replication factor 3 and diskless, each one's S3 requests and stored bytes per
        produced MB, produce and end-to-end latency at acks=all, the time to move 100
        partitions of each kind, and a diskless leader's failover from kill -9 to the first
        acknowledged produce (see diskless); a cluster of its own after the embedded one
        stopped, only with the embedded cluster

Sizes are the full run's by default (`make bench` with no flags); flags make every step smaller
(see sizes). A command line argparse rejects exits 2; a step that fails raises, with its
traceback: the bench is a development tool, and where it broke matters more than a tidy line.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from bench import (
    commit_paths,
    commit_round,
    diskless,
    groups,
    hostile_clients,
    idle_connections,
    kafka_clients,
    metrics_overhead,
    object_storage,
    partition_count,
    quotas,
    sasl_ssl,
    scaling,
    small_files,
    stream_drain,
    typed_produce,
)
from bench.produce_fetch import (
    bare_write,
    bulk_produce,
    chunk_values,
    fetch_all,
    latency,
    send_each,
    straight_write,
)
from bench.report import TARGETS, judge, report
from bench.sizes import SEND_RECORDS_MAX, VALUE_BYTES, Sizes
from deltabus import trace
from deltabus.cli.producer_performance import payload, random_values
from deltabus.cli.results import write_json
from deltabus.client.admin import AdminClient
from deltabus.metadata import NewTopic

DEFAULT = Sizes()
# Steps (e) and (g)'s topics, whose records the trace follows (bench/latency_trace.py)
LATENCY_TOPIC_PREFIXES = ("bench-latency-", "bench-rf3-latency-")


def build_parser() -> argparse.ArgumentParser:
    """The flags of `python -m bench`; sizes default to the full run (bench.sizes)."""
    p = argparse.ArgumentParser(prog="python -m bench", allow_abbrev=False,
                                description="deltabus's throughput and latency against the "
                                            "targets (`make bench ARGS=...`)")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT",
                   help="bench a running cluster (default: start an embedded one)")
    p.add_argument("--kafka-bootstrap-server", metavar="HOST:PORT",
                   help="the running cluster's Kafka listener, for step (l) with "
                        "--bootstrap-server (the embedded cluster's otherwise)")
    p.add_argument("--json", default="bench/results.json", metavar="FILE",
                   help="where to write the figures (default bench/results.json)")
    size = p.add_argument_group("sizes (smaller: quicker and noisier)")
    size.add_argument("--records", type=int, default=DEFAULT.records,
                      help=f"records for bulk produce and fetch (default {DEFAULT.records})")
    size.add_argument("--small-commit-rounds", type=int, default=DEFAULT.small_commit_rounds,
                      help="small commits made by each way of committing, step (a) "
                           f"(default {DEFAULT.small_commit_rounds})")
    size.add_argument("--send-records", type=int,
                      help="records for per-record send() and step (l) "
                           f"(default: min({SEND_RECORDS_MAX}, --records))")
    size.add_argument("--latency-run-s", type=float, default=DEFAULT.latency_run_s,
                      help="seconds each latency step sends for, steps (e) and (g) "
                           f"(default {DEFAULT.latency_run_s:g})")
    size.add_argument("--committers", type=int, default=DEFAULT.committers,
                      help=f"consumers committing in step (h) (default {DEFAULT.committers})")
    size.add_argument("--commit-run-s", type=float, default=DEFAULT.commit_run_s,
                      help=f"seconds they commit for (default {DEFAULT.commit_run_s:g})")
    size.add_argument("--group-members", type=int, default=DEFAULT.group_members,
                      help=f"members of the group in step (i) (default {DEFAULT.group_members})")
    size.add_argument("--drain-records", type=int, default=DEFAULT.drain_records,
                      help="records the streaming query drains in step (j) "
                           f"(default {DEFAULT.drain_records})")
    size.add_argument("--drain-rounds", type=int, default=DEFAULT.drain_rounds,
                      help=f"timed rounds of step (j) (default {DEFAULT.drain_rounds})")
    size.add_argument("--small-commits", type=int, default=DEFAULT.small_commits,
                      help="small commits before the merge in step (k) "
                           f"(default {DEFAULT.small_commits})")
    size.add_argument("--secure-records", type=int, default=DEFAULT.secure_records,
                      help="records produced and fetched per protocol and round in step (m) "
                           f"(default {DEFAULT.secure_records})")
    size.add_argument("--secure-rounds", type=int, default=DEFAULT.secure_rounds,
                      help=f"rounds of step (m) (default {DEFAULT.secure_rounds})")
    size.add_argument("--metrics-records", type=int, default=DEFAULT.metrics_records,
                      help="records produced and fetched per side and round in step (v) "
                           f"(default {DEFAULT.metrics_records})")
    size.add_argument("--metrics-rounds", type=int, default=DEFAULT.metrics_rounds,
                      help=f"rounds of step (v) (default {DEFAULT.metrics_rounds})")
    size.add_argument("--idle-connections", type=int, default=DEFAULT.idle_connections,
                      help="idle Kafka connections held open in step (n) "
                           f"(default {DEFAULT.idle_connections})")
    size.add_argument("--quota-bytes-per-s", type=int, default=DEFAULT.quota_bytes_per_s,
                      help="the quota'd producer's producer_byte_rate in step (o) "
                           f"(default {DEFAULT.quota_bytes_per_s})")
    size.add_argument("--quota-run-s", type=float, default=DEFAULT.quota_run_s,
                      help="seconds both producers of step (o) run "
                           f"(default {DEFAULT.quota_run_s:g})")
    size.add_argument("--partitions", type=int, default=DEFAULT.partitions,
                      help=f"partitions step (p) creates (default {DEFAULT.partitions})")
    size.add_argument("--partitions-step", type=int, default=DEFAULT.partitions_step,
                      help="partitions per topic step (p) creates "
                           f"(default {DEFAULT.partitions_step})")
    size.add_argument("--keyed-partitions", type=int, default=DEFAULT.keyed_partitions,
                      help="partitions keyed send() spreads over in step (p) "
                           f"(default {DEFAULT.keyed_partitions})")
    size.add_argument("--keyed-records", type=int, default=DEFAULT.keyed_records,
                      help=f"records per keyed round of step (p) (default {DEFAULT.keyed_records})")
    size.add_argument("--keyed-rounds", type=int, default=DEFAULT.keyed_rounds,
                      help=f"keyed rounds of step (p) (default {DEFAULT.keyed_rounds})")
    size.add_argument("--hostile-run-s", type=float, default=DEFAULT.hostile_run_s,
                      help="seconds of each round of step (q)'s well-behaved producer "
                           f"(default {DEFAULT.hostile_run_s})")
    size.add_argument("--hostile-rounds", type=int, default=DEFAULT.hostile_rounds,
                      help="rounds of step (q), alone and beside the hostile client "
                           f"(default {DEFAULT.hostile_rounds})")
    size.add_argument("--round-partitions", type=int, default=DEFAULT.round_partitions,
                      help="partitions of step (t)'s commit round "
                           f"(default {DEFAULT.round_partitions})")
    size.add_argument("--round-rounds", type=int, default=DEFAULT.round_rounds,
                      help=f"timed rounds of step (t) (default {DEFAULT.round_rounds})")
    size.add_argument("--s3-records", type=int, default=DEFAULT.s3_records,
                      help="records for bulk produce and fetch on S3 in step (r) "
                           f"(default {DEFAULT.s3_records})")
    size.add_argument("--s3-send-records", type=int, default=DEFAULT.s3_send_records,
                      help="records for per-record send() on S3 in step (r) "
                           f"(default {DEFAULT.s3_send_records})")
    size.add_argument("--s3-latency-run-s", type=float, default=DEFAULT.s3_latency_run_s,
                      help="seconds each latency phase of step (r) sends for "
                           f"(default {DEFAULT.s3_latency_run_s:g})")
    size.add_argument("--scale-partitions", type=int, default=DEFAULT.scale_partitions,
                      help=f"partitions step (u) moves (default {DEFAULT.scale_partitions})")
    size.add_argument("--scale-bytes", type=int, default=DEFAULT.scale_bytes,
                      help=f"bytes they hold (default {DEFAULT.scale_bytes:,})")
    size.add_argument("--scale-from", type=int, default=DEFAULT.scale_from,
                      help=f"brokers before step (u)'s scale (default {DEFAULT.scale_from})")
    size.add_argument("--scale-to", type=int, default=DEFAULT.scale_to,
                      help=f"brokers after it (default {DEFAULT.scale_to})")
    size.add_argument("--scale-run-s", type=float, default=DEFAULT.scale_run_s,
                      help="seconds step (u)'s producer runs before the scale "
                           f"(default {DEFAULT.scale_run_s:g})")
    size.add_argument("--diskless-records", type=int, default=DEFAULT.diskless_records,
                      help="records bulk produced to each kind of topic in step (w) "
                           f"(default {DEFAULT.diskless_records})")
    size.add_argument("--diskless-latency-run-s", type=float,
                      default=DEFAULT.diskless_latency_run_s,
                      help="seconds each latency phase of step (w) sends for "
                           f"(default {DEFAULT.diskless_latency_run_s:g})")
    size.add_argument("--diskless-move-partitions", type=int,
                      default=DEFAULT.diskless_move_partitions,
                      help="partitions of each kind step (w) moves "
                           f"(default {DEFAULT.diskless_move_partitions})")
    size.add_argument("--diskless-failovers", type=int, default=DEFAULT.diskless_failovers,
                      help="diskless leaders step (w) kills "
                           f"(default {DEFAULT.diskless_failovers})")
    return p


def sizes_from(args: argparse.Namespace) -> Sizes:
    return Sizes(records=args.records,
                 send_records=args.send_records or min(SEND_RECORDS_MAX, args.records),
                 latency_run_s=args.latency_run_s, committers=args.committers,
                 commit_run_s=args.commit_run_s, group_members=args.group_members,
                 drain_records=args.drain_records, drain_rounds=args.drain_rounds,
                 small_commits=args.small_commits,
                 small_commit_rounds=args.small_commit_rounds, secure_records=args.secure_records,
                 secure_rounds=args.secure_rounds, metrics_records=args.metrics_records,
                 metrics_rounds=args.metrics_rounds, idle_connections=args.idle_connections,
                 quota_bytes_per_s=args.quota_bytes_per_s, quota_run_s=args.quota_run_s,
                 partitions=args.partitions, partitions_step=args.partitions_step,
                 keyed_partitions=args.keyed_partitions, keyed_records=args.keyed_records,
                 keyed_rounds=args.keyed_rounds, hostile_run_s=args.hostile_run_s,
                 hostile_rounds=args.hostile_rounds, round_partitions=args.round_partitions,
                 round_rounds=args.round_rounds, s3_records=args.s3_records,
                 s3_send_records=args.s3_send_records, s3_latency_run_s=args.s3_latency_run_s,
                 scale_partitions=args.scale_partitions, scale_bytes=args.scale_bytes,
                 scale_from=args.scale_from, scale_to=args.scale_to,
                 scale_run_s=args.scale_run_s, diskless_records=args.diskless_records,
                 diskless_latency_run_s=args.diskless_latency_run_s,
                 diskless_move_partitions=args.diskless_move_partitions,
                 diskless_failovers=args.diskless_failovers)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench: print the table, write the JSON; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes = sizes_from(args)
    wrong = sizes.check()
    if args.send_records is not None and args.send_records < 1:
        wrong.insert(0, "--send-records must be at least 1")  # 0 would mean the default
    if wrong:
        parser.error("; ".join(wrong))
    root = tempfile.mkdtemp(prefix="deltabus-bench-")
    embedded = args.bootstrap_server is None
    # The embedded cluster's brokers, started after this, stamp the latency steps' records.
    trace_dir = f"{root}/trace" if embedded else None
    if trace_dir is not None:
        trace.start(trace_dir, LATENCY_TOPIC_PREFIXES)
    started = time.monotonic()
    try:
        with _session(embedded, sizes) as spark:
            with _bootstrap(args.bootstrap_server, spark, root) as (bootstrap, kafka_bootstrap,
                                                                    cluster):
                figures = measure(bootstrap, spark,
                                  args.kafka_bootstrap_server or kafka_bootstrap, root, sizes,
                                  embedded=embedded, cluster=cluster, trace_dir=trace_dir)
            if embedded:  # on the task slots the embedded cluster's brokers held
                measure_object_storage(figures, spark, root, sizes)
                measure_diskless(figures, spark, root, sizes)
                measure_scaling(figures, spark, root, sizes)
            else:
                print("(r), (u) and (w) skipped: they start clusters of their own, on the "
                      "embedded run's Spark")
        measure_small_files(figures, root, sizes)  # needs no cluster: runs after it stopped
        measure_commit_round(figures, root, sizes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures["elapsed_s"] = time.monotonic() - started
    finish(figures, args.json, sys.argv[1:] if argv is None else argv)
    return 0


@contextlib.contextmanager
def _session(embedded: bool, sizes: Sizes) -> Iterator[Any]:
    """The bench's SparkSession, for the duration: with the embedded cluster 5 task slots (3
    held by its brokers, 2 for the streaming step) or room for step (u)'s brokers and two
    catch-up tasks, whichever is more; 2 beside a running cluster."""
    from deltabus.cluster.cluster import local_spark

    slots = max(5, sizes.scale_to + 2) if embedded else 2
    spark = local_spark(slots, app_name="deltabus-bench", ui=False)
    spark.sparkContext.setLogLevel("WARN")
    try:
        yield spark
    finally:
        spark.stop()


@contextlib.contextmanager
def _bootstrap(bootstrap: str | None, spark: Any, root: str
               ) -> Iterator[tuple[str, str | None, Any]]:
    """The given cluster, or an embedded one (3 brokers on `spark`) for the duration: its
    bootstrap servers, its Kafka listener's, and its Cluster (for step (p))."""
    from deltabus.cluster.cluster import Cluster

    if bootstrap:
        yield bootstrap, None, None
        return
    cluster = Cluster(spark, root=f"{root}/cluster", brokers=3, port=0, kafka_port=0).start()
    try:
        yield cluster.bootstrap_servers, cluster.kafka_bootstrap_servers, cluster
    finally:
        cluster.stop()


def measure(bootstrap: str, spark: Any, kafka_bootstrap: str | None, root: str,
            sizes: Sizes, *, embedded: bool = True, cluster: Any = None,
            trace_dir: str | None = None) -> dict[str, Any]:
    """The steps on a cluster, (a) to (j), (l) to (q) ((k) and (r) run after it stopped); (l)
    and (q) only with a Kafka listener, (p) only given the `cluster` (a Cluster of this
    process), (m) only on an `embedded` cluster's Spark session, (n) only with an `embedded`
    cluster's Kafka listener (in this process). Scratch files go under `root`, which the
    caller removes. `trace_dir`: see run_steps."""
    figures = run_steps(bootstrap, root, sizes, trace_dir)
    with _step(figures["step_s"], "j", "streaming query and SQL draining a topic"):
        figures["drain"] = stream_drain.drain_vs_parquet(
            spark, bootstrap, pa.table({"value": random_values(
                min(sizes.drain_records, 100_000), VALUE_BYTES)}), sizes.drain_records,
            sizes.drain_rounds)
    if kafka_bootstrap:
        with _step(figures["step_s"], "l", "Kafka client and gRPC perf workload"):
            figures["kafka"] = kafka_clients.kafka_vs_grpc(
                bootstrap, kafka_bootstrap, sizes.send_records, payload(VALUE_BYTES),
                sizes.latency_run_s)
    else:
        print("(l) skipped: give --kafka-bootstrap-server with --bootstrap-server")
    if embedded:
        with _step(figures["step_s"], "m", "produce and fetch, SASL_SSL beside PLAINTEXT"):
            figures["sasl_ssl"] = sasl_ssl.sasl_ssl_vs_plaintext(
                spark, bootstrap, root, chunk_values(sizes.secure_records), sizes.secure_records,
                sizes.secure_rounds)
    else:
        print("(m) skipped: it starts a cluster of its own, on the embedded run's Spark")
    if embedded:
        with _step(figures["step_s"], "v", "produce and fetch with metrics beside without"):
            figures["metrics_overhead"] = metrics_overhead.metrics_overhead(
                spark, root, chunk_values(sizes.metrics_records), sizes.metrics_records,
                sizes.send_records, sizes.metrics_rounds)
    else:
        print("(v) skipped: it starts clusters of its own, on the embedded run's Spark")
    if embedded and kafka_bootstrap:
        with _step(figures["step_s"], "n", f"{sizes.idle_connections:,} idle Kafka connections"):
            figures["idle_connections"] = idle_connections.idle_connections(
                kafka_bootstrap, sizes.idle_connections)
    else:
        print("(n) skipped: it measures the embedded cluster's listener, in this process")
    with _step(figures["step_s"], "o", "a quota'd producer beside an unquota'd one"):
        figures["quotas"] = quotas.quota_beside_unquotad(
            bootstrap, sizes.quota_bytes_per_s, sizes.quota_run_s)
    if cluster is not None:
        with _step(figures["step_s"], "p", f"{sizes.partitions:,} partitions"):
            figures["partition_count"] = partition_count.partitions_by_the_thousand(
                cluster, sizes)
    else:
        print("(p) skipped: it reads the embedded cluster's brokers' processes")
    if kafka_bootstrap:
        with _step(figures["step_s"], "q", "a well-behaved producer beside a hostile client"):
            figures["hostile"] = hostile_clients.well_behaved_beside_hostile(
                bootstrap, kafka_bootstrap, payload(VALUE_BYTES), sizes.hostile_run_s,
                sizes.hostile_rounds)
    else:
        print("(q) skipped: give --kafka-bootstrap-server with --bootstrap-server")
    with _step(figures["step_s"], "s", "bulk produce to a typed topic and an untyped one"):
        figures["typed_produce"] = typed_produce.typed_vs_untyped(
            bootstrap, sizes.records, typed_produce.ROUNDS, root)
    return figures


def measure_object_storage(figures: dict[str, Any], spark: Any, root: str, sizes: Sizes
                           ) -> None:
    """Step (r), on a cluster of its own with its root on moto's S3 server: adds its figures to
    `figures`. Needs object_storage.BROKERS + 1 free task slots on `spark`."""
    with _step(figures["step_s"], "r", "produce, fetch and latency on S3 (moto), requests "
                                       "per MB"):
        figures["object_storage"] = object_storage.object_storage_run(spark, root, sizes)


def measure_diskless(figures: dict[str, Any], spark: Any, root: str, sizes: Sizes) -> None:
    """Step (w), on a cluster of its own with its root on moto's S3 server: adds its figures to
    `figures`. Needs diskless.BROKERS + 1 free task slots on `spark`."""
    with _step(figures["step_s"], "w", "diskless against replication factor 3 on S3 (moto)"):
        figures["diskless"] = diskless.diskless_run(spark, root, sizes)


def measure_scaling(figures: dict[str, Any], spark: Any, root: str, sizes: Sizes) -> None:
    """Step (u), on a cluster of its own: adds its figures to `figures`. Needs
    sizes.scale_to + 1 free task slots on `spark`."""
    with _step(figures["step_s"], "u", f"scale {sizes.scale_from} -> {sizes.scale_to} brokers "
                                       f"holding {sizes.scale_bytes / 2**30:g} GiB"):
        figures["scaling"] = scaling.scale_out(
            spark, f"{root}/scaling", partitions=sizes.scale_partitions,
            total_bytes=sizes.scale_bytes, scale_from=sizes.scale_from,
            scale_to=sizes.scale_to, run_s=sizes.scale_run_s)


def measure_small_files(figures: dict[str, Any], root: str, sizes: Sizes) -> None:
    """Step (k), on a partition log of its own under `root`: adds its figures to `figures`."""
    with _step(figures["step_s"], "k", f"{sizes.small_commits:,} small commits, then merge"):
        figures["small_files"] = small_files.small_commits_then_merge(
            f"{root}/small-commits", sizes.small_commits, VALUE_BYTES)


def measure_commit_round(figures: dict[str, Any], root: str, sizes: Sizes) -> None:
    """Step (t), on partition logs of its own under `root`, against step (a)'s bare commit:
    adds its figures to `figures`."""
    with _step(figures["step_s"], "t", f"a commit round over {sizes.round_partitions:,} "
                                       "partitions"):
        figures["commit_round"] = commit_round.commit_round(
            f"{root}/commit-round", sizes.round_partitions, sizes.round_rounds,
            figures["commit_paths"]["bare commit"]["p50_ms"])


def run_steps(bootstrap: str, root: str, sizes: Sizes,
              trace_dir: str | None = None) -> dict[str, Any]:
    """Steps (a)-(i), in order, each on a topic of its own (deleted at the end); returns the
    figures. With the `trace_dir` the cluster's brokers stamp into (deltabus.trace), steps
    (e) and (g) also break their latency down by stage."""
    run_id = uuid.uuid4().hex[:8]
    topic, latency_topic = f"bench-{run_id}", f"{LATENCY_TOPIC_PREFIXES[0]}{run_id}"
    replicated, replicated_latency = f"bench-rf3-{run_id}", f"{LATENCY_TOPIC_PREFIXES[1]}{run_id}"
    commits, rebalance = f"bench-commits-{run_id}", f"bench-rebalance-{run_id}"
    records = sizes.records
    values = chunk_values(records)
    chunk_rows = values.num_rows
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1), NewTopic(latency_topic, 1, 1),
                             NewTopic(replicated, 1, 3, {"min.insync.replicas": "2"}),
                             NewTopic(replicated_latency, 1, 3, {"min.insync.replicas": "2"}),
                             NewTopic(commits, 1, 1),
                             NewTopic(rebalance, sizes.group_members, 1)])
        try:
            figures: dict[str, Any] = {"records": records, "send_records": sizes.send_records,
                                       "value_bytes": VALUE_BYTES, "chunk_records": chunk_rows,
                                       "group_members": sizes.group_members}
            steps = figures["step_s"] = {}
            with _step(steps, "a", "straight write_deltalake, the bare commit, and a small "
                                   "commit each way"):
                figures["straight_write_rps"] = straight_write(f"{root}/straight", values,
                                                               records)
                figures["bare_write_rps"] = bare_write(f"{root}/bare", values, records)
                figures["commit_paths"] = commit_paths.commit_paths(
                    f"{root}/commit-paths", sizes.small_commit_rounds)
            with _step(steps, "b", "bulk produce, send_batch"):
                figures["bulk_rps"] = bulk_produce(bootstrap, topic, values, records)
            figures["bulk_vs_straight"] = figures["bulk_rps"] / figures["straight_write_rps"]
            figures["bulk_vs_bare"] = figures["bulk_rps"] / figures["bare_write_rps"]
            with _step(steps, "c", "per-record send()"):
                figures["send_rps"] = send_each(bootstrap, topic, sizes.send_records)
            with _step(steps, "d", "fetch, poll_batch"):
                figures["fetched_records"], figures["fetch_rps"] = fetch_all(bootstrap, topic)
            with _step(steps, "e", "produce-to-consume latency"):
                figures["latency_ms"] = latency(bootstrap, latency_topic, sizes.latency_run_s,
                                                trace_dir=trace_dir)
            with _step(steps, "f", "bulk produce, acks=all, replication factor 3"):
                figures["replicated_rps"] = bulk_produce(bootstrap, replicated, values, records,
                                                         acks="all")
            figures["replicated_vs_bulk"] = figures["replicated_rps"] / figures["bulk_rps"]
            with _step(steps, "g", "latency, acks=all, replication factor 3"):
                figures["replicated_latency_ms"] = latency(bootstrap, replicated_latency,
                                                           sizes.latency_run_s, acks="all",
                                                           trace_dir=trace_dir)
            with _step(steps, "h", f"offset commits, {sizes.committers} consumers every "
                                   f"{groups.COMMIT_INTERVAL_S * 1000:.0f} ms"):
                figures["offset_commits"] = groups.offset_commits(
                    bootstrap, commits, sizes.committers, sizes.commit_run_s)
            with _step(steps, "i", f"rebalance of {sizes.group_members} members when one "
                                   "leaves"):
                figures["rebalance_s"] = groups.rebalance_time(bootstrap, rebalance,
                                                               sizes.group_members)
        finally:
            admin.delete_topics([topic, latency_topic, replicated, replicated_latency, commits,
                                 rebalance])
    return figures


@contextlib.contextmanager
def _step(steps: dict[str, float], letter: str, what: str) -> Iterator[None]:
    """Announce a step and record how long it took, so a slow bench says where time went."""
    print(f"({letter}) {what}...", end="", flush=True)
    start = time.monotonic()
    yield
    steps[letter] = time.monotonic() - start
    print(f" {steps[letter]:.1f} s", flush=True)


def finish(figures: dict[str, Any], json_path: str,
           argv: Sequence[str] = ()) -> dict[str, bool]:
    """Judge the figures, print the table, write them with the targets, the verdicts and the
    run (`run_stamp`: when, on what machine, which command) as JSON; returns the verdicts."""
    verdicts = judge(figures)
    print(report(figures, verdicts))
    write_json(json_path, {**figures, "targets": TARGETS, "pass": verdicts,
                           "run": run_stamp(argv)})
    print(f"figures written to {json_path}")
    return verdicts


def run_stamp(argv: Sequence[str]) -> dict[str, Any]:
    """What a table of figures must come with to mean anything: the date (UTC), the machine's
    cores and platform, the Python, and the command that produced them."""
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(),
            "command": shlex.join(["python", "-m", "bench", *argv])}
