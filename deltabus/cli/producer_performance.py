"""`deltabus perf producer`: Kafka's kafka-producer-perf-test.sh, plus `--bulk` for send_batch.

Lines are Kafka's (a progress line every 5 s, then the summary with percentiles), so results can be
set side by side with Kafka's. A record's latency is its ack time minus its send time, taken in a
future callback. Callbacks cost CPU on the same interpreter that sends, so only every k-th record
carries one (at most ~SAMPLES_MAX per run), each standing for k records; the max latency is
therefore the sampled max. With --bulk each chunk is one future, standing for its rows.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from deltabus.cli.options import (
    PRODUCER_CONFIGS,
    CliError,
    add_command_config,
    client_kwargs,
    command_config,
    parse_properties,
)
from deltabus.cli.results import write_json
from deltabus.client.producer import FutureRecordMetadata, Producer

REPORT_INTERVAL_S = 5.0  # Kafka's reporting interval
SAMPLES_MAX = 100_000  # latency callbacks per run, to keep measuring cheap
BULK_CHUNK_BYTES = 16 * 1024 * 1024  # values per send_batch call: well under a request's limit


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("producer", parents=[parent],
                              help="producer throughput and latency (kafka-producer-perf-test)")
    p.add_argument("--topic", required=True)
    p.add_argument("--num-records", type=int, required=True)
    p.add_argument("--record-size", type=int, required=True, help="value bytes per record")
    p.add_argument("--throughput", type=float, default=-1,
                   help="records/s to aim at; -1 for as fast as possible")
    p.add_argument("--producer-props", nargs="+", metavar="KEY=VALUE",
                   help="producer configs: acks=1 linger.ms=5 batch.size=...")
    p.add_argument("--bulk", action="store_true", help="send Arrow tables with send_batch")
    p.add_argument("--batch-records", type=int,
                   help="with --bulk: records per send_batch call (default: 16 MiB of values)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    add_command_config(p, "--producer.config", clients="producer")
    p.set_defaults(func=run)


class LatencyStats:
    """Kafka's ProducerPerformance.Stats: totals, a 5 s window, and sampled latencies.

    Thread-safe: callbacks run on the producer's threads, reports on a reporter thread.
    """

    def __init__(self, record_size: int) -> None:
        self.record_size = record_size
        self._lock = threading.Lock()
        self.start = time.monotonic()
        self.count = 0
        self.latency_sum_ms = 0.0
        self.latency_max_ms = 0.0
        self.samples: list[float] = []
        self.errors = 0
        self.first_error: BaseException | None = None
        self._window = [time.monotonic(), 0, 0.0, 0.0]  # start, count, latency sum, max

    def callback(self, sent_at: float, weight: int) -> Callable[[FutureRecordMetadata], None]:
        def done(future: FutureRecordMetadata) -> None:
            error = future.exception(0)
            self.record((time.monotonic() - sent_at) * 1000, weight, error)
        return done

    def record(self, latency_ms: float, weight: int, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None:
                self.errors += weight
                self.first_error = self.first_error or error
                return
            self.count += weight
            self.latency_sum_ms += latency_ms * weight
            self.latency_max_ms = max(self.latency_max_ms, latency_ms)
            self.samples.append(latency_ms)
            w = self._window
            w[1] += weight
            w[2] += latency_ms * weight
            w[3] = max(w[3], latency_ms)

    def wait_for(self, records: int, timeout_s: float = 10.0) -> None:
        """Wait until callbacks accounted for `records`: flush() may return while the last
        callbacks still run on the producer's threads."""
        deadline = time.monotonic() + timeout_s
        while self.count + self.errors < records and time.monotonic() < deadline:
            time.sleep(0.001)

    def window_line(self) -> str:
        """Kafka's progress line for the window now ending; starts the next window."""
        with self._lock:
            start, count, latency_sum, latency_max = self._window
            now = time.monotonic()
            self._window = [now, 0, 0.0, 0.0]
        elapsed = max(now - start, 1e-9)
        return (f"{count} records sent, {count / elapsed:.1f} records/sec "
                f"({count * self.record_size / elapsed / 1024 / 1024:.2f} MB/sec), "
                f"{latency_sum / max(count, 1):.1f} ms avg latency, "
                f"{latency_max:.1f} ms max latency.")

    def summary(self) -> dict[str, Any]:
        """The run's figures: what the summary line prints and the JSON holds."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        with self._lock:
            ordered = sorted(self.samples)
            count = self.count

        def pct(q: float) -> float:
            return ordered[min(int(len(ordered) * q), len(ordered) - 1)] if ordered else 0.0

        return {
            "records": count, "elapsed_s": round(elapsed, 3),
            "records_per_s": count / elapsed,
            "mb_per_s": count * self.record_size / elapsed / 1024 / 1024,
            "latency_avg_ms": self.latency_sum_ms / max(count, 1),
            "latency_max_ms": self.latency_max_ms,
            "latency_p50_ms": pct(0.5), "latency_p95_ms": pct(0.95),
            "latency_p99_ms": pct(0.99), "latency_p999_ms": pct(0.999),
            "errors": self.errors,
        }


def summary_line(s: dict[str, Any]) -> str:
    """Kafka's final line of kafka-producer-perf-test."""
    return (f"{s['records']} records sent, {s['records_per_s']:f} records/sec "
            f"({s['mb_per_s']:.2f} MB/sec), {s['latency_avg_ms']:.2f} ms avg latency, "
            f"{s['latency_max_ms']:.2f} ms max latency, {int(s['latency_p50_ms'])} ms 50th, "
            f"{int(s['latency_p95_ms'])} ms 95th, {int(s['latency_p99_ms'])} ms 99th, "
            f"{int(s['latency_p999_ms'])} ms 99.9th.")


def payload(size: int) -> bytes:
    """Random upper-case letters, made once and reused, as Kafka's perf test does."""
    return bytes(random.choices(range(ord("A"), ord("Z") + 1), k=size))


def fixed_values(n: int, value: bytes) -> pa.Array:
    """n copies of `value` as an Arrow binary array, built from buffers (no Python per row)."""
    size = len(value)
    offsets = np.arange(n + 1, dtype=np.int64) * size
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets.tobytes()),
                               pa.py_buffer(value * n)]).cast(pa.binary())


def random_values(n: int, size: int, seed: int = 7) -> pa.Array:
    """n distinct random upper-case values of `size` bytes (no Python per row). Unlike a fixed
    payload, Parquet cannot dictionary-encode them away, so writes cost what real data costs."""
    data = np.random.default_rng(seed).integers(65, 91, n * size, dtype=np.uint8).tobytes()
    offsets = np.arange(n + 1, dtype=np.int32) * size
    return pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])


def run(args: argparse.Namespace) -> int:
    if args.num_records < 1 or args.record_size < 0:
        raise CliError("--num-records must be at least 1 and --record-size at least 0")
    props = {**command_config(args), **parse_properties(args.producer_props, "--producer-props")}
    bootstrap = props.get("bootstrap.servers") or args.bootstrap_server
    kwargs = client_kwargs(props, PRODUCER_CONFIGS, ignore=("bootstrap.servers",))
    with Producer(bootstrap, **kwargs) as producer:
        producer.partitions_for(args.topic)  # metadata (and auto-creation) outside the timing
        stats = LatencyStats(args.record_size)
        stop = _start_reporter(stats)
        try:
            if args.bulk:
                send_bulk(producer, args.topic, args.num_records, args.record_size,
                          args.throughput, stats, args.batch_records)
            else:
                send_records(producer, args.topic, args.num_records, args.record_size,
                             args.throughput, stats)
            producer.flush()
            stats.wait_for(args.num_records)
        finally:
            stop.set()
    result = stats.summary()
    print(summary_line(result))
    result.update(tool="producer-perf", topic=args.topic, record_size=args.record_size,
                  bulk=args.bulk, producer_props=props)
    if args.json:
        write_json(args.json, result)
    if stats.errors:
        raise CliError(f"{stats.errors} records failed to send: {stats.first_error}")
    return 0


def _start_reporter(stats: LatencyStats) -> threading.Event:
    """A thread printing Kafka's progress line every 5 s until the returned event is set."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(REPORT_INTERVAL_S):
            print(stats.window_line(), flush=True)

    threading.Thread(target=loop, name="deltabus-perf-reporter", daemon=True).start()
    return stop


def _throttle(start: float, sent: int, throughput: float) -> None:
    """Sleep while ahead of `throughput` records/s (Kafka's ThroughputThrottler, simplified)."""
    if throughput > 0:
        ahead_s = sent / throughput - (time.monotonic() - start)
        if ahead_s > 0:
            time.sleep(ahead_s)


def send_records(producer: Producer, topic: str, n: int, record_size: int,
                 throughput: float, stats: LatencyStats) -> None:
    """Kafka's loop: send() each record; every k-th record carries a latency callback."""
    value = payload(record_size)
    every = max(1, n // SAMPLES_MAX)
    start = time.monotonic()
    for i in range(n):
        sent_at = time.monotonic()
        future = producer.send(topic, value)
        if i % every == 0:
            future.add_done_callback(stats.callback(sent_at, min(every, n - i)))
        if throughput > 0:
            _throttle(start, i + 1, throughput)


def send_bulk(producer: Producer, topic: str, n: int, record_size: int, throughput: float,
              stats: LatencyStats, batch_records: int | None = None) -> None:
    """The bulk path: one Arrow table of values, sent chunk by chunk with send_batch."""
    rows = batch_records or max(1, BULK_CHUNK_BYTES // max(record_size, 1))
    rows = min(rows, n)
    table = pa.table({"value": fixed_values(rows, payload(record_size))})
    start = time.monotonic()
    for first in range(0, n, rows):
        chunk = table.slice(0, min(rows, n - first))
        sent_at = time.monotonic()
        futures = producer.send_batch(topic, chunk)
        weights = [chunk.num_rows // len(futures)] * len(futures)
        weights[0] += chunk.num_rows % len(futures)
        for future, weight in zip(futures, weights, strict=True):
            future.add_done_callback(stats.callback(sent_at, weight))
        _throttle(start, first + chunk.num_rows, throughput)
