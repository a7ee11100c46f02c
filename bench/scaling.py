"""Step (u): brokers joining a loaded cluster (issue 41). A cluster of its own, `scale_from`
brokers, fills `scale_partitions` partitions (replication factor up to 3) with `scale_bytes`
of incompressible records; then a producer sends 1 MB batches (send_batch, acks=all) to the
same topic at a steady 4 MB/s for `scale_run_s` seconds before the scale, and on until the
scale is done:

- the time from `Cluster.scale(scale_to)` to balanced (it returns once every move is done:
  the new replicas copied, in the ISR, the old ones dropped, leaders elected), the bytes of
  the moved replicas, and the spread of replicas and leaders before and after;
- the producer's acknowledged rate and produce latency while the replicas move, against
  before: what the moves cost the producers under leader/follower.replication.throttled.rate
  (replication_quota.py).

Runs after the embedded cluster stopped, on the task slots its brokers held (the bench's
session has room for `scale_to` brokers and a catch-up task beside them).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pyarrow as pa

from deltabus import AdminClient, Cluster, NewTopic, Producer
from deltabus.cluster.balancer import bounds

TOPIC = "bench-scaling"
RECORD_BYTES = 10_000  # large records: the fill is bytes, not records
FILL_CHUNK_RECORDS = 100  # 1 MB a send_batch


class PacedProducer:
    """send_batch of 1 MB chunks at acks=all, `bytes_per_s` offered, round the partitions,
    each chunk waited for before the next: `rate` tells the bytes a second acknowledged and
    `latency` the chunks' produce latencies between two instants. Paced, not full speed: a
    producer faster than the throttled moves would grow the topic faster than they copy it
    (one such run filled the disk and never balanced)."""

    def __init__(self, bootstrap: str, partitions: int, bytes_per_s: float) -> None:
        self.bootstrap, self.partitions, self.bytes_per_s = bootstrap, partitions, bytes_per_s
        self.acked: list[tuple[float, int, float]] = []  # (when, bytes, latency s) per chunk
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-scaling")

    def __enter__(self) -> PacedProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        chunk = pa.table({"value": [os.urandom(RECORD_BYTES) for _ in range(FILL_CHUNK_RECORDS)]})
        started, sent = time.monotonic(), 0
        with Producer(self.bootstrap, acks="all") as producer:
            while not self._stop.is_set():
                ahead = started + sent / self.bytes_per_s - time.monotonic()
                if ahead > 0 and self._stop.wait(ahead):
                    break
                asked = time.monotonic()
                for future in producer.send_batch(TOPIC, chunk,
                                                  partition=(sent // chunk.nbytes)
                                                  % self.partitions):
                    try:
                        future.get(120)
                    except Exception:  # counted: a figure, not the bench's failure
                        self.failed += 1
                        continue
                    done = time.monotonic()
                    self.acked.append((done, chunk.nbytes, done - asked))
                sent += chunk.nbytes

    def rate(self, start: float, end: float) -> float:
        """Bytes a second acknowledged from `start` to `end` (monotonic seconds)."""
        done = sum(size for when, size, _ in list(self.acked) if start <= when < end)
        return done / max(end - start, 1e-9)

    def latency_ms(self, start: float, end: float) -> dict[str, float]:
        """p50 and p99 of the chunks' produce latencies acknowledged from `start` to `end`."""
        seconds = sorted(lat for when, _, lat in list(self.acked) if start <= when < end)
        if not seconds:
            return {"p50": 0.0, "p99": 0.0}
        return {"p50": seconds[len(seconds) // 2] * 1000,
                "p99": seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))] * 1000}


def fill(bootstrap: str, partitions: int, total_bytes: int) -> int:
    """`total_bytes` of incompressible records spread over the partitions; the bytes sent."""
    per_partition = max(1, total_bytes // partitions // RECORD_BYTES)
    sent = 0
    with Producer(bootstrap, acks="all") as producer:
        futures = []
        for p in range(partitions):
            left = per_partition
            while left:
                n = min(left, FILL_CHUNK_RECORDS)
                chunk = pa.table({"value": [os.urandom(RECORD_BYTES) for _ in range(n)]})
                futures += producer.send_batch(TOPIC, chunk, partition=p)
                sent += chunk.nbytes
                left -= n
        producer.flush()
        for future in futures:
            future.get(0)
    return sent


def spread(cluster: Cluster, topic: str = TOPIC) -> dict[int, list[int]]:
    """[replicas, leaders] of `topic` per broker, from the controller's image."""
    out: dict[int, list[int]] = {}
    for p in cluster.controller.image().topics[topic].partitions:
        for b in p.replicas:
            out.setdefault(b, [0, 0])[0] += 1
        out.setdefault(p.leader, [0, 0])[1] += 1
    return dict(sorted(out.items()))


def scale_out(spark: Any, root: str, *, partitions: int, total_bytes: int, scale_from: int,
              scale_to: int, run_s: float, produce_bytes_per_s: float = 4e6) -> dict[str, Any]:
    """Step (u)'s figures (see the module docstring)."""
    rf = min(3, scale_from)
    cluster = Cluster(spark, root=root, brokers=scale_from, port=0, kafka_port=-1,
                      schema_registry_port=-1).start()
    try:
        bootstrap = cluster.bootstrap_servers
        with AdminClient(bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, partitions, rf)])
        started = time.monotonic()
        filled = fill(bootstrap, partitions, total_bytes)
        fill_s = time.monotonic() - started
        before = spread(cluster)
        with PacedProducer(bootstrap, partitions, produce_bytes_per_s) as producer:
            warmed = time.monotonic()
            time.sleep(run_s)
            scale_started = time.monotonic()
            status = cluster.scale(scale_to)
            scale_done = time.monotonic()
        after = spread(cluster)
        moved = sum(max(0, after.get(b, [0, 0])[0] - before.get(b, [0, 0])[0])
                    for b in after)
        lo, hi = bounds(partitions * rf, scale_to)
        rate_before = producer.rate(warmed, scale_started)
        rate_during = producer.rate(scale_started, scale_done)
        return {
            "partitions": partitions, "replication_factor": rf, "bytes": filled,
            "fill_s": fill_s, "brokers": [scale_from, scale_to], "state": status.state,
            "scale_s": scale_done - scale_started, "replicas_moved": moved,
            "bytes_moved": filled * moved // partitions,
            "spread_before": before, "spread_after": after,
            "balanced": all(lo <= r <= hi for r, _ in after.values()),
            "producer_offered_bps": produce_bytes_per_s,
            "producer_before_bps": rate_before, "producer_during_bps": rate_during,
            "during_vs_before": rate_during / rate_before if rate_before else 0.0,
            "latency_before_ms": producer.latency_ms(warmed, scale_started),
            "latency_during_ms": producer.latency_ms(scale_started, scale_done),
            "producer_failed": producer.failed,
            "throttled_rate": [cluster.config.leader_replication_throttled_rate,
                               cluster.config.follower_replication_throttled_rate],
        }
    finally:
        cluster.stop()
