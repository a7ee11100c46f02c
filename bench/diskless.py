"""Bench step (w): diskless topics against replicated ones on object storage (issue 44), in the
same run, on one 3-broker cluster whose root is on moto's S3 server (bench/moto_server.py):

- produce: bulk send_batch at acks=all to a topic of replication factor 3 (min.insync.replicas
  2) and to a diskless one: records/s, the S3 requests per produced MB by method (moto's access
  log, as step (r) counts them), and the bytes the bucket holds per produced MB afterwards (the
  objects under each topic's folder, moto's listing);
- latency: one small record every 2 ms at acks=all (linger.ms=0), each kind in turn: produce
  (send() to its acknowledgement) and end to end (send() to a consumer's poll), p50 and p99;
- commit intervals: the diskless latency phase again at each diskless.append.commit.interval.ms
  of COMMIT_INTERVALS_MS, with the PUTs a second it cost the partition;
- moves: `move_partitions` partitions of each kind (replicated ones of replication factor 1:
  three brokers leave a factor-3 replica nowhere to go), all on one broker, reassigned to the
  other brokers in one request: seconds from the request until every move completed and each
  partition acknowledged a record at its new leader (a replicated move copies the tables; a
  diskless one changes metadata); and one diskless partition alone, MOVE_ONE_ROUNDS times
  (median): the issue's move of a partition between brokers;
- failover: `failovers` rounds of kill -9 to the leader of a diskless partition under a
  producer: seconds from the kill to the first record acknowledged by the new leader.

`python -m bench.diskless` runs it alone and prints the figures as JSON; `make bench` runs it
as step (w).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.moto_server import s3_server
from bench.object_storage import BROKERS, MB, ROOT, _cluster, _counted, run_alone
from bench.produce_fetch import WARM_UP, bulk_produce, chunk_values, percentiles
from bench.sizes import VALUE_BYTES, Sizes
from deltabus import Consumer, Producer, TopicPartition
from deltabus.client.admin import AdminClient
from deltabus.config import SET, AlterConfigOp
from deltabus.log_tables.layout import topic_path
from deltabus.metadata import NewTopic

LATENCY_INTERVAL_S = 0.002
DRAIN_S_MAX = 30.0
WAIT_S_MAX = 300.0
DISKLESS = {"diskless.enable": "true"}
MOVE_ONE_ROUNDS = 3
COMMIT_INTERVALS_MS = (50, 100, 250, 500)  # the sweep behind the default (100 ms)
RF3 = {"min.insync.replicas": "2"}


def diskless_run(spark: Any, root: str, sizes: Sizes) -> dict[str, Any]:
    """The figures of step (w). Needs BROKERS free task slots on `spark`; the access log goes
    under `root`, which the caller removes."""
    log = Path(root) / "moto-access.log"
    with s3_server(log) as server, _cluster(spark, server) as cluster:
        return _measure(cluster, server, log, sizes)


def _measure(cluster: Any, server: Any, log: Path, sizes: Sizes) -> dict[str, Any]:
    bootstrap, run_id = cluster.bootstrap_servers, uuid.uuid4().hex[:8]
    kinds = {"replicated": (3, RF3), "diskless": (1, DISKLESS)}
    figures: dict[str, Any] = {"records": sizes.diskless_records, "value_bytes": VALUE_BYTES,
                               "brokers": BROKERS,
                               "move_partitions": sizes.diskless_move_partitions}
    values = chunk_values(sizes.diskless_records)
    with AdminClient(bootstrap) as admin:
        for kind, (rf, configs) in kinds.items():
            topic, latency_topic = f"w-{kind}-{run_id}", f"w-{kind}-latency-{run_id}"
            admin.create_topics([NewTopic(topic, 1, rf, configs),
                                 NewTopic(latency_topic, 1, rf, configs)])
            requests: dict[str, Any] = {}
            with _counted(log, requests, "produce", topic,
                          sizes.diskless_records * VALUE_BYTES):
                rps = bulk_produce(bootstrap, topic, values, sizes.diskless_records, acks="all")
            counted = requests["produce"]
            stored = _stored_bytes(server, cluster, topic)
            figures[kind] = {
                "produce_rps": rps,
                "requests_per_mb": {m: n * MB / counted["bytes"]
                                    for m, n in counted["topic"].items()},
                "requests_per_mb_total": counted["topic_total"] * MB / counted["bytes"],
                "stored_bytes_per_mb": stored * MB / counted["bytes"],
                "latency_ms": _latency(bootstrap, latency_topic, sizes.diskless_latency_run_s),
            }
            if kind == "diskless":
                figures["commit_intervals"] = _interval_sweep(
                    admin, log, bootstrap, latency_topic, sizes.diskless_latency_run_s)
            admin.delete_topics([topic, latency_topic])
        for kind, (_, configs) in kinds.items():
            figures[kind]["move_s"] = _move(cluster, admin, f"w-{kind}-moves-{run_id}",
                                            {} if kind == "replicated" else configs,
                                            sizes.diskless_move_partitions)
        figures["diskless"]["move_one_s"] = statistics.median(
            _move(cluster, admin, f"w-diskless-move-one-{run_id}-{i}", DISKLESS, 1)
            for i in range(MOVE_ONE_ROUNDS))
        figures["diskless"]["move_one_rounds"] = MOVE_ONE_ROUNDS
        figures["diskless"]["failover_s"] = _failovers(cluster, admin, f"w-failover-{run_id}",
                                                       sizes.diskless_failovers)
    return figures


def _stored_bytes(server: Any, cluster: Any, topic: str) -> int:
    """What the bucket holds under the topic's folder: every replica's data and Delta log."""
    bucket, _, prefix = cluster.config.root.removeprefix("s3://").partition("/")
    client = server.client()
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{topic_path(prefix or ROOT, topic)}/"):
        total += sum(item["Size"] for item in page.get("Contents", []))
    return total


def _latency(bootstrap: str, topic: str, run_s: float) -> dict[str, Any]:
    """Produce (send to acknowledgement) and end-to-end (send to poll) latencies, ms, of one
    16-byte record every LATENCY_INTERVAL_S at acks=all."""
    tp = TopicPartition(topic, 0)
    consumer = Consumer(bootstrap)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    consumer.position(tp)
    end_to_end: list[float] = []
    acked: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for record in consumer.poll(timeout_ms=100):
                if record.value != WARM_UP:
                    end_to_end.append(time.time_ns() / 1e6 - record.timestamp)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    sent = 0
    with Producer(bootstrap, acks="all", linger_ms=0) as producer:
        producer.send(topic, WARM_UP).get(30)
        start = next_at = time.monotonic()
        while time.monotonic() - start < run_s:
            sent_ms = time.time_ns() / 1e6
            future = producer.send(topic, b"x" * 16, timestamp_ms=int(sent_ms))
            future.add_done_callback(_acked_after(acked, sent_ms))
            sent += 1
            next_at += LATENCY_INTERVAL_S
            time.sleep(max(0.0, next_at - time.monotonic()))
        producer.flush()
    deadline = time.monotonic() + DRAIN_S_MAX
    while len(end_to_end) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join(5)
    consumer.close()
    return {"produce": percentiles(acked, sent), "end_to_end": percentiles(end_to_end, sent)}


def _interval_sweep(admin: AdminClient, log: Path, bootstrap: str, topic: str,
                    run_s: float) -> dict[str, Any]:
    """The latency phase again on the diskless `topic` at each commit interval of
    COMMIT_INTERVALS_MS (altered on the open partition): produce and end-to-end percentiles,
    and the PUTs a second the partition cost, the trade the default
    diskless.append.commit.interval.ms makes."""
    out: dict[str, Any] = {}
    for ms in COMMIT_INTERVALS_MS:
        admin.incremental_alter_configs({topic: [AlterConfigOp(
            "diskless.append.commit.interval.ms", SET, str(ms))]})
        requests: dict[str, Any] = {}
        with _counted(log, requests, "latency", topic):
            latency = _latency(bootstrap, topic, run_s)
        counted = requests["latency"]
        out[str(ms)] = {**latency, "puts_per_s": counted["topic"]["PUT"] / counted["s"]}
    return out


def _acked_after(acked: list[float], sent_ms: float) -> Any:
    """A send's callback adding the ms from `sent_ms` to its acknowledgement to `acked`."""
    def done(_future: Any) -> None:
        acked.append(time.time_ns() / 1e6 - sent_ms)
    return done


def _move(cluster: Any, admin: AdminClient, topic: str, configs: dict[str, str],
          partitions: int) -> float:
    """Seconds to move `partitions` partitions of one replica each, all on broker 0, to the
    other brokers in one request, until each acknowledged a record at its new leader. (With
    BROKERS brokers a replica of a replication-factor-3 partition has nowhere to go: the
    replicated side moves replication-factor-1 partitions, whose table is copied.)"""
    others = list(range(1, BROKERS))
    admin.create_topics([NewTopic(topic, replica_assignment={
        p: [0] for p in range(partitions)}, configs=configs)])
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        for p in range(partitions):  # a few records each, so a copy has something to do
            producer.send_batch(topic, pa.table({"value": [b"v" * VALUE_BYTES] * 100}),
                                partition=p)
        producer.flush()
    moves = {(topic, p): [others[p % len(others)]] for p in range(partitions)}
    start = time.monotonic()
    refused = {k: e for k, e in admin.alter_partition_reassignments(moves).items() if e}
    if refused:
        raise RuntimeError(f"moves of {topic} refused: {refused}")
    while True:
        described = admin.describe_topics([topic])[0].partitions
        if all(sorted(d.replicas) == sorted(moves[(topic, d.partition)]) and d.leader >= 0
               for d in described):
            break
        if time.monotonic() - start > WAIT_S_MAX:
            raise RuntimeError(f"{partitions} partitions of {topic} did not move in "
                               f"{WAIT_S_MAX:.0f} s")
        time.sleep(0.05)
    with Producer(cluster.bootstrap_servers, acks="all", linger_ms=0) as producer:
        served = [producer.send(topic, b"moved", partition=p) for p in range(partitions)]
        for future in served:  # every partition moved and taking writes at its new leader
            future.get(WAIT_S_MAX)
    moved_s = time.monotonic() - start
    admin.delete_topics([topic])
    return moved_s


def _failovers(cluster: Any, admin: AdminClient, topic: str, rounds: int) -> dict[str, Any]:
    """kill -9 the diskless partition's leader `rounds` times under a producer (acks=all):
    seconds from each kill to the first record the next leader acknowledged."""
    admin.create_topics([NewTopic(topic, 1, 1, DISKLESS)])
    seconds = []
    with Producer(cluster.bootstrap_servers, acks="all", linger_ms=0,
                  delivery_timeout_ms=int(WAIT_S_MAX * 1000)) as producer:
        for _ in range(rounds):
            leader = admin.describe_topics([topic])[0].partitions[0].leader
            producer.send(topic, b"before").get(60)
            killed = time.monotonic()
            cluster.kill_broker(leader)
            while True:
                future = producer.send(topic, b"after")
                future.get(WAIT_S_MAX)
                if admin.describe_topics([topic])[0].partitions[0].leader != leader:
                    break
            seconds.append(time.monotonic() - killed)
            cluster.controller.wait_for_brokers(BROKERS, WAIT_S_MAX)
    admin.delete_topics([topic])
    return {"rounds": rounds, "p50": statistics.median(seconds), "max": max(seconds),
            "each": seconds}


def main(argv: list[str]) -> int:
    """Step (w) alone: `python -m bench.diskless [records [latency_run_s [move_partitions
    [failovers]]]]` (the defaults of `make bench`), on a local Spark session of its own;
    prints the figures as JSON."""
    records, run_s, moves, failovers = [*argv, "", "", "", ""][:4]
    default = Sizes()
    sizes = Sizes(diskless_records=int(records or default.diskless_records),
                  diskless_latency_run_s=float(run_s or default.diskless_latency_run_s),
                  diskless_move_partitions=int(moves or default.diskless_move_partitions),
                  diskless_failovers=int(failovers or default.diskless_failovers))
    return run_alone("diskless", diskless_run, sizes)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
