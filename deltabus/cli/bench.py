"""`deltabus bench` (`make bench`): deltabus's throughput and latency against its targets.

Everything runs in one process against an embedded 3-broker cluster (or, with --bootstrap-server,
a running one), in an order where each step leaves what the next needs:

    (a) straight write_deltalake of the produce batches: the physical limit of this machine
    (b) bulk produce (send_batch, acks=1) of the same batches, to a 1-partition topic
    (c) per-record send() to the same topic
    (d) fetch of the whole topic with poll_batch, from the beginning
    (e) produce-to-consume latency: one small record every ~2 ms for ~3 s, linger.ms=0
    (f) bulk produce as (b) but acks=all to a topic with replication factor 3
    (g) latency as (e) but acks=all with replication factor 3
    (h) offset commits: 100 consumers each committing every 100 ms (see group_bench)
    (i) rebalance time of a 10-member group when one member leaves
    (j) a Structured Streaming query draining a 10-million-record topic, against Spark reading
        the same Parquet files directly (see stream_bench)
    (k) a partition table after 10,000 small commits: open time and fetch rate of the broker's
        log, before and after the log cleaner's small-file compaction (see merge_bench)
    (l) Kafka's perf-test workload through a Kafka client (confluent-kafka) on the Kafka
        listeners, beside deltabus's gRPC clients, in the same run (see kafka_bench)

The bulk target is relative as well as absolute, because what a 2-core laptop can write to Delta
bounds every figure; (a) says what that bound was on this run.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from deltabus import config as cfg
from deltabus.cli import group_bench, kafka_bench, merge_bench, stream_bench
from deltabus.cli.options import CliError
from deltabus.cli.producer_performance import BULK_CHUNK_BYTES, payload, random_values
from deltabus.cli.results import write_json
from deltabus.client.admin import AdminClient
from deltabus.client.consumer import Consumer, TopicPartition
from deltabus.client.producer import Producer
from deltabus.errors import KafkaTimeoutError
from deltabus.metadata import NewTopic
from deltabus.records import normalize_produce, to_log_batch

VALUE_BYTES = 100
LATENCY_RUN_S = 3.0
LATENCY_INTERVAL_S = 0.002
WARM_UP = b"warm-up"
IDLE_MS_MAX = 10_000  # a fetch or a latency wait giving up after this long with nothing new
TARGETS = {"bulk_rps": 500_000, "bulk_vs_straight": 0.70, "send_rps": 150_000,
           "fetch_rps": 1_000_000, "latency_p50_ms": 50.0,
           "replicated_vs_bulk": 0.5, "replicated_latency_p99_ms": 150.0,
           "commits_vs_asked": 0.9, "rebalance_s": 3.0, "stream_vs_direct": 0.8,
           "merged_open_speedup": 1.0, "merged_fetch_speedup": 1.0}


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    del parent  # bench has its own --bootstrap-server: absent means an embedded cluster
    p = subparsers.add_parser("bench", help="throughput and latency against the targets")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT",
                   help="bench a running cluster (default: start an embedded one)")
    p.add_argument("--records", type=int, default=1_000_000,
                   help="records for bulk produce and fetch (default 1000000)")
    p.add_argument("--send-records", type=int,
                   help="records for per-record send() (default: min(300000, --records))")
    p.add_argument("--drain-records", type=int, default=10_000_000,
                   help="records the streaming query drains in step (j) (default 10000000)")
    p.add_argument("--kafka-bootstrap-server", metavar="HOST:PORT",
                   help="the running cluster's Kafka listener, for step (l) with "
                        "--bootstrap-server (the embedded cluster's otherwise)")
    p.add_argument("--small-commits", type=int, default=10_000,
                   help="small commits before the merge in step (k) (default 10000)")
    p.add_argument("--json", default="bench/results.json", metavar="FILE",
                   help="where to write the figures (default bench/results.json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.records < 1 or args.drain_records < 1 or args.small_commits < 2 or (
            args.send_records is not None and args.send_records < 1):
        raise CliError("--records, --send-records and --drain-records must be at least 1, "
                       "--small-commits at least 2")
    send_records = args.send_records or min(300_000, args.records)
    root = tempfile.mkdtemp(prefix="deltabus-bench-")
    started = time.monotonic()
    try:
        with _bootstrap(args.bootstrap_server, root) as (bootstrap, spark, kafka_bootstrap):
            figures = run_steps(bootstrap, root, args.records, send_records)
            with _step(figures["step_s"], "j", "streaming query draining a topic"):
                figures["drain"] = stream_bench.drain_vs_parquet(
                    spark, bootstrap, pa.table({"value": random_values(
                        min(args.drain_records, 100_000), VALUE_BYTES)}), args.drain_records)
            kafka_bootstrap = args.kafka_bootstrap_server or kafka_bootstrap
            if kafka_bootstrap:
                with _step(figures["step_s"], "l", "Kafka client and gRPC perf workload"):
                    figures["kafka"] = kafka_bench.kafka_vs_grpc(
                        bootstrap, kafka_bootstrap, send_records, payload(VALUE_BYTES))
            else:
                print("(l) skipped: give --kafka-bootstrap-server with --bootstrap-server")
        with _step(figures["step_s"], "k", f"{args.small_commits:,} small commits, then merge"):
            figures["small_files"] = merge_bench.small_commits_then_merge(
                f"{root}/small-commits", args.small_commits, VALUE_BYTES)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures["elapsed_s"] = time.monotonic() - started
    verdicts = judge(figures)
    print(report(figures, verdicts))
    write_json(args.json, {**figures, "targets": TARGETS, "pass": verdicts})
    print(f"figures written to {args.json}")
    return 0


@contextlib.contextmanager
def _bootstrap(bootstrap: str | None, root: str) -> Iterator[tuple[str, Any, str | None]]:
    """The given cluster, or an embedded one (local Spark, 3 brokers) for the duration; and a
    SparkSession for the streaming step (2 task slots beside the brokers)."""
    from deltabus.cluster.cluster import Cluster, local_spark

    spark = local_spark(2 if bootstrap else 5, app_name="deltabus-bench", ui=False)
    spark.sparkContext.setLogLevel("WARN")
    if bootstrap:
        try:
            yield bootstrap, spark, None
        finally:
            spark.stop()
        return
    cluster = Cluster(spark, root=f"{root}/cluster", brokers=3, port=0, kafka_port=0).start()
    try:
        yield cluster.bootstrap_servers, spark, cluster.kafka_bootstrap_servers
    finally:
        cluster.stop()
        spark.stop()


def run_steps(bootstrap: str, root: str, records: int, send_records: int) -> dict[str, Any]:
    """Steps (a)-(e), in order; returns the figures."""
    run_id = uuid.uuid4().hex[:8]
    topic, latency_topic = f"bench-{run_id}", f"bench-latency-{run_id}"
    replicated, replicated_latency = f"bench-rf3-{run_id}", f"bench-rf3-latency-{run_id}"
    chunk_rows = max(1, min(records, BULK_CHUNK_BYTES // VALUE_BYTES))
    # Distinct random values: a fixed payload would let Parquet dictionary-encode the straight
    # write down to nothing and make the "physical limit" a measure of that, not of writing.
    values = pa.table({"value": random_values(chunk_rows, VALUE_BYTES)})
    with AdminClient(bootstrap) as admin:
        commits, rebalance = f"bench-commits-{run_id}", f"bench-rebalance-{run_id}"
        admin.create_topics([NewTopic(topic, 1, 1), NewTopic(latency_topic, 1, 1),
                             NewTopic(replicated, 1, 3, {"min.insync.replicas": "2"}),
                             NewTopic(replicated_latency, 1, 3, {"min.insync.replicas": "2"}),
                             NewTopic(commits, 1, 1),
                             NewTopic(rebalance, group_bench.GROUP_MEMBERS, 1)])
        try:
            figures: dict[str, Any] = {"records": records, "send_records": send_records,
                                       "value_bytes": VALUE_BYTES, "chunk_records": chunk_rows}
            steps = figures["step_s"] = {}
            with _step(steps, "a", "straight write_deltalake"):
                figures["straight_write_rps"] = straight_write(f"{root}/straight", values,
                                                               records)
            with _step(steps, "b", "bulk produce, send_batch"):
                figures["bulk_rps"] = bulk_produce(bootstrap, topic, values, records)
            figures["bulk_vs_straight"] = figures["bulk_rps"] / figures["straight_write_rps"]
            with _step(steps, "c", "per-record send()"):
                figures["send_rps"] = send_each(bootstrap, topic, send_records)
            with _step(steps, "d", "fetch, poll_batch"):
                figures["fetched_records"], figures["fetch_rps"] = fetch_all(bootstrap, topic)
            with _step(steps, "e", "produce-to-consume latency"):
                figures["latency_ms"] = latency(bootstrap, latency_topic)
            with _step(steps, "f", "bulk produce, acks=all, replication factor 3"):
                figures["replicated_rps"] = bulk_produce(bootstrap, replicated, values, records,
                                                         acks="all")
            figures["replicated_vs_bulk"] = figures["replicated_rps"] / figures["bulk_rps"]
            with _step(steps, "g", "latency, acks=all, replication factor 3"):
                figures["replicated_latency_ms"] = latency(bootstrap, replicated_latency,
                                                           acks="all")
            with _step(steps, "h", "offset commits, 100 consumers every 100 ms"):
                figures["offset_commits"] = group_bench.offset_commits(bootstrap, commits)
            with _step(steps, "i", "rebalance of 10 members when one leaves"):
                figures["rebalance_s"] = group_bench.rebalance_time(bootstrap, rebalance)
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


def _chunks(values: pa.Table, records: int) -> Iterator[pa.Table]:
    for first in range(0, records, values.num_rows):
        yield values.slice(0, min(values.num_rows, records - first))


def straight_write(path: str, values: pa.Table, records: int) -> float:
    """Records/s of write_deltalake appending the log batches the broker would write."""
    batches, offset = [], 0
    for chunk in _chunks(values, records):
        batches.append(to_log_batch(normalize_produce(chunk), base_offset=offset,
                                    now_ms=int(time.time() * 1000), leader_epoch=0))
        offset += chunk.num_rows
    start = time.perf_counter()
    for batch in batches:
        write_deltalake(path, batch, mode="append")
    return records / (time.perf_counter() - start)


def bulk_produce(bootstrap: str, topic: str, values: pa.Table, records: int,
                 acks: int | str = 1) -> float:
    """Records/s of send_batch, from the first call until every chunk is acked."""
    with Producer(bootstrap, acks=acks) as producer:
        producer.send(topic, WARM_UP).get(30)  # metadata and channels outside the timing
        start = time.perf_counter()
        futures = [f for chunk in _chunks(values, records)
                   for f in producer.send_batch(topic, chunk)]
        producer.flush()
        elapsed = time.perf_counter() - start
        for future in futures:
            future.get(0)  # raises the first failure, if any
    return records / elapsed


def send_each(bootstrap: str, topic: str, records: int) -> float:
    """Records/s of a plain send() loop (linger.ms=5, acks=1), flush included."""
    value = payload(VALUE_BYTES)
    with Producer(bootstrap, acks=1) as producer:
        producer.send(topic, WARM_UP).get(30)
        start = time.perf_counter()
        last = None
        for _ in range(records):
            last = producer.send(topic, value)
        producer.flush()
        elapsed = time.perf_counter() - start
        if last is not None:
            last.get(0)
    return records / elapsed


def fetch_all(bootstrap: str, topic: str) -> tuple[int, float]:
    """(records, records/s) reading the whole topic with poll_batch from offset 0."""
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap, fetch_max_bytes=cfg.FETCH_MAX_BYTES,
                  max_partition_fetch_bytes=cfg.FETCH_MAX_BYTES) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        count, last = 0, time.monotonic()
        start = time.perf_counter()
        while count < end and (time.monotonic() - last) * 1000 < IDLE_MS_MAX:
            got = sum(t.num_rows for t in consumer.poll_batch(timeout_ms=1000).values())
            if got:
                count, last = count + got, time.monotonic()
        elapsed = time.perf_counter() - start
    if count < end:
        raise CliError(f"fetch stalled: {count} of {end} records in {elapsed:.1f} s")
    return count, count / elapsed


def latency(bootstrap: str, topic: str, acks: int | str = 1) -> dict[str, float]:
    """Produce-to-consume latency (ms): a consumer thread polls while one small record is sent
    every ~2 ms with linger.ms=0; latency is the consume time minus the record's timestamp,
    which the producer sets at send time (both clocks are this process's)."""
    tp = TopicPartition(topic, 0)
    consumer = Consumer(bootstrap)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    consumer.position(tp)
    latencies: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for record in consumer.poll(timeout_ms=100):
                if record.value != WARM_UP:  # its latency includes opening the channels
                    latencies.append(time.time() * 1000 - record.timestamp)

    reader = threading.Thread(target=consume, name="deltabus-bench-consumer", daemon=True)
    reader.start()
    sent = _send_paced(bootstrap, topic, acks)
    deadline = time.monotonic() + IDLE_MS_MAX / 1000
    while len(latencies) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join(5)
    consumer.close()
    ordered = sorted(latencies)
    if not ordered:
        raise CliError("latency: no record came back")

    def pct(q: float) -> float:
        return ordered[min(int(len(ordered) * q), len(ordered) - 1)]

    return {"sent": sent, "received": len(ordered), "p50": pct(0.5), "p95": pct(0.95),
            "p99": pct(0.99), "max": ordered[-1]}


def _send_paced(bootstrap: str, topic: str, acks: int | str) -> int:
    """Send one 16-byte record every LATENCY_INTERVAL_S for LATENCY_RUN_S; returns the count.

    Waits at most IDLE_MS_MAX for the acks: a backlog must not stretch the bench without end.
    """
    producer = Producer(bootstrap, acks=acks, linger_ms=0)
    try:
        producer.send(topic, WARM_UP).get(30)
        sent = 0
        start = next_at = time.monotonic()
        while time.monotonic() - start < LATENCY_RUN_S:
            producer.send(topic, b"x" * 16, timestamp_ms=int(time.time() * 1000))
            sent += 1
            next_at += LATENCY_INTERVAL_S
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        with contextlib.suppress(KafkaTimeoutError):
            producer.close(timeout=IDLE_MS_MAX / 1000)
    return sent


def judge(f: dict[str, Any]) -> dict[str, bool]:
    """PASS/MISS per target."""
    return {
        "bulk": f["bulk_rps"] >= TARGETS["bulk_rps"]
        and f["bulk_vs_straight"] >= TARGETS["bulk_vs_straight"],
        "send": f["send_rps"] >= TARGETS["send_rps"],
        "fetch": f["fetch_rps"] >= TARGETS["fetch_rps"],
        "latency": f["latency_ms"]["p50"] <= TARGETS["latency_p50_ms"],
        "replicated": f["replicated_vs_bulk"] >= TARGETS["replicated_vs_bulk"],
        "replicated_latency": (f["replicated_latency_ms"]["p99"]
                               <= TARGETS["replicated_latency_p99_ms"]),
        "commits": (f["offset_commits"]["commits_per_s"]
                    >= TARGETS["commits_vs_asked"] * f["offset_commits"]["asked_per_s"]),
        "rebalance": f["rebalance_s"] <= TARGETS["rebalance_s"],
        "drain": f["drain"]["stream_vs_direct"] >= TARGETS["stream_vs_direct"],
        "small_files": (f["small_files"]["open_speedup"] >= TARGETS["merged_open_speedup"]
                        and f["small_files"]["fetch_speedup"] >= TARGETS["merged_fetch_speedup"]),
    }


def report(f: dict[str, Any], ok: dict[str, bool]) -> str:
    """The table printed at the end: measured figure, target, PASS/MISS."""
    lat, rlat, oc, dr, sf = (f["latency_ms"], f["replicated_latency_ms"], f["offset_commits"],
                             f["drain"], f["small_files"])
    rows = [
        ("(a) straight write_deltalake", f"{f['straight_write_rps']:,.0f} rec/s",
         "the physical limit", ""),
        ("(b) bulk produce, send_batch",
         f"{f['bulk_rps']:,.0f} rec/s ({f['bulk_vs_straight']:.0%} of a)",
         f">= {TARGETS['bulk_rps']:,} and >= {TARGETS['bulk_vs_straight']:.0%} of a", ok["bulk"]),
        ("(c) per-record send()", f"{f['send_rps']:,.0f} rec/s",
         f">= {TARGETS['send_rps']:,}", ok["send"]),
        ("(d) fetch, poll_batch", f"{f['fetch_rps']:,.0f} rec/s",
         f">= {TARGETS['fetch_rps']:,}", ok["fetch"]),
        ("(e) produce-to-consume latency",
         (f"p50 {lat['p50']:.1f} / p95 {lat['p95']:.1f} / p99 {lat['p99']:.1f} ms "
          f"({lat['received']}/{lat['sent']} back)"),
         f"p50 <= {TARGETS['latency_p50_ms']:.0f} ms", ok["latency"]),
        ("(f) bulk, acks=all, RF 3",
         f"{f['replicated_rps']:,.0f} rec/s ({f['replicated_vs_bulk']:.0%} of b)",
         f">= {TARGETS['replicated_vs_bulk']:.0%} of b", ok["replicated"]),
        ("(g) latency, acks=all, RF 3",
         (f"p50 {rlat['p50']:.1f} / p95 {rlat['p95']:.1f} / p99 {rlat['p99']:.1f} ms "
          f"({rlat['received']}/{rlat['sent']} back)"),
         f"p99 <= {TARGETS['replicated_latency_p99_ms']:.0f} ms", ok["replicated_latency"]),
        ("(h) offset commits, 100 consumers",
         (f"{oc['commits_per_s']:,.0f}/s of {oc['asked_per_s']:,.0f} asked, latency p50 "
          f"{oc['p50_ms']:.0f} / p99 {oc['p99_ms']:.0f} ms"),
         f">= {TARGETS['commits_vs_asked']:.0%} of asked", ok["commits"]),
        ("(i) rebalance, 10 members, 1 leaves", f"{f['rebalance_s']:.2f} s",
         f"<= {TARGETS['rebalance_s']:.0f} s", ok["rebalance"]),
        (f"(j) stream drain, {dr['records'] / 1e6:g} M records",
         (f"{dr['stream_rps']:,.0f} rec/s ({dr['stream_vs_direct']:.0%} of direct Parquet "
          f"{dr['direct_rps']:,.0f}; Python source ceiling {dr['memory_rps']:,.0f} = "
          f"{dr['memory_vs_direct']:.0%}; {dr['stream_wall_rps']:,.0f} with start-up; "
          f"medians of {len(dr['rounds'])})"),
         f">= {TARGETS['stream_vs_direct']:.0%} of direct Parquet", ok["drain"]),
        (f"(k) {sf['commits']:,} small commits, merged",
         (f"open {sf['before']['open_ms']:,.0f} -> {sf['after']['open_ms']:,.0f} ms, fetch "
          f"{sf['before']['fetch_rps']:,.0f} -> {sf['after']['fetch_rps']:,.0f} rec/s; "
          f"{sf['files_before']:,} -> {sf['files_after']} files in {sf['merge_s']:.1f} s"),
         "faster after the merge", ok["small_files"]),
    ]
    if "kafka" in f:
        k = f["kafka"]
        rows.append((f"(l) perf workload, {k['records']:,} records",
                     (f"produce: Kafka client {k['kafka_produce_rps']:,.0f}, gRPC "
                      f"{k['grpc_produce_rps']:,.0f} rec/s; consume: Kafka client "
                      f"{k['kafka_consume_rps']:,.0f}, gRPC {k['grpc_consume_rps']:,.0f} rec/s"),
                     "reported side by side", ""))
    title = (f"deltabus bench: {f['records']:,} records of {f['value_bytes']} bytes "
             f"(send() {f['send_records']:,}), 1 partition, {f['elapsed_s']:.0f} s")
    lines = [title,
             f"{'step':<38}{'measured':<60}{'target':<34}result"]
    for name, measured, target, passed in rows:
        verdict = "" if passed == "" else ("PASS" if passed else "MISS")
        lines.append(f"{name:<38}{measured:<60}{target:<34}{verdict}".rstrip())
    return "\n".join(lines)
