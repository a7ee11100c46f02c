"""Bench steps (a)-(g): the physical limit, produce, fetch and produce-to-consume latency.

    (a) straight write_deltalake of the produce batches, and the bare commit of the same
        batches (a pyarrow file and its commit file): the physical limits of this machine
    (b) bulk produce (send_batch) of the same batches; (f) the same with acks=all and RF 3
    (c) per-record send()
    (d) fetch of the whole topic with poll_batch, from the beginning
    (e) produce-to-consume latency: one small record every ~2 ms, linger.ms=0; (g) with acks=all

Each function returns its figure; the caller owns the topics. A fetch or a latency wait gives up
after IDLE_MS_MAX with nothing new, so a stuck cluster ends the bench instead of hanging it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from bench import latency_trace
from bench.sizes import VALUE_BYTES
from deltabus import config as cfg
from deltabus.cli.producer_performance import BULK_CHUNK_BYTES, payload, random_values
from deltabus.client.consumer import Consumer, TopicPartition
from deltabus.client.producer import FutureRecordMetadata, Producer
from deltabus.config import LogConfig
from deltabus.errors import KafkaTimeoutError
from deltabus.log_tables.appender import create_log_table
from deltabus.log_tables.delta_commit import DeltaCommitWriter
from deltabus.records import normalize_produce, to_log_batch
from deltabus.storage import Storage

LATENCY_INTERVAL_S = 0.002
WARM_UP = b"warm-up"
IDLE_MS_MAX = 10_000  # a fetch or a latency wait giving up after this long with nothing new


def chunk_values(records: int) -> pa.Table:
    """One produce chunk (at most BULK_CHUNK_BYTES) of `records`: distinct random values of
    VALUE_BYTES, sent again and again. A fixed payload would let Parquet dictionary-encode the
    straight write down to nothing and make the "physical limit" a measure of that, not of
    writing."""
    rows = max(1, min(records, BULK_CHUNK_BYTES // VALUE_BYTES))
    return pa.table({"value": random_values(rows, VALUE_BYTES)})


def _chunks(values: pa.Table, records: int) -> Iterator[pa.Table]:
    for first in range(0, records, values.num_rows):
        yield values.slice(0, min(values.num_rows, records - first))


def _log_batches(values: pa.Table, records: int) -> list[pa.Table]:
    """The log batches the broker would write for `records` of `values`, chunk by chunk."""
    batches, offset = [], 0
    for chunk in _chunks(values, records):
        batches.append(to_log_batch(normalize_produce(chunk), base_offset=offset,
                                    now_ms=int(time.time() * 1000), leader_epoch=0))
        offset += chunk.num_rows
    return batches


def straight_write(path: str, values: pa.Table, records: int) -> float:
    """Records/s of write_deltalake appending the log batches the broker would write."""
    batches = _log_batches(values, records)
    start = time.perf_counter()
    for batch in batches:
        write_deltalake(path, batch, mode="append")
    return records / (time.perf_counter() - start)


def bare_write(path: str, values: pa.Table, records: int) -> float:
    """Records/s of the bare commit (a pyarrow file and its commit file, as the append path
    writes them, with nothing else) appending the same log batches to an empty log table:
    what bulk produce at acks=1 is judged against (issue 38: at least 85 % of it)."""
    batches = _log_batches(values, records)
    create_log_table(path, topic="bench-bare", partition=0,
                     checkpoint_interval=LogConfig.checkpoint_interval)
    writer = DeltaCommitWriter(Storage(path), path, 0)
    start = time.perf_counter()
    for batch in batches:
        writer.commit(adds=[writer.write_file(batch)])
    return records / (time.perf_counter() - start)


def bulk_produce(bootstrap: str, topic: str, values: pa.Table, records: int,
                 acks: int | str = 1, *, security: Mapping[str, Any] | None = None) -> float:
    """Records/s of send_batch, from the first call until every chunk is acked. `security`:
    the client's security settings (step (m)), PLAINTEXT without."""
    with Producer(bootstrap, acks=acks, **(security or {})) as producer:
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


def fetch_all(bootstrap: str, topic: str, *, security: Mapping[str, Any] | None = None
              ) -> tuple[int, float]:
    """(records, records/s) reading the whole topic with poll_batch from offset 0."""
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap, fetch_max_bytes=cfg.FETCH_MAX_BYTES,
                  max_partition_fetch_bytes=cfg.FETCH_MAX_BYTES,
                  **(security or {})) as consumer:
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
        raise RuntimeError(f"fetch stalled: {count} of {end} records in {elapsed:.1f} s")
    return count, count / elapsed


def latency(bootstrap: str, topic: str, run_s: float, acks: int | str = 1,
            trace_dir: str | None = None) -> dict[str, Any]:
    """Produce-to-consume latency (ms): a consumer thread polls while one small record is sent
    every ~2 ms for `run_s` with linger.ms=0; latency is the consume time minus the record's
    timestamp, which the producer sets at send time (both clocks are this process's). With
    the `trace_dir` deltabus.trace writes to (tracing `topic`), also the breakdown of the
    records' trips by stage (bench.latency_trace), under "breakdown"."""
    tp = TopicPartition(topic, 0)
    consumer = Consumer(bootstrap)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    consumer.position(tp)
    latencies: list[float] = []
    polled_ns: dict[int, int] = {}
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            records = consumer.poll(timeout_ms=100)
            now_ns = time.time_ns()
            for record in records:
                if record.value != WARM_UP:  # its latency includes opening the channels
                    latencies.append(now_ns / 1e6 - record.timestamp)
                    polled_ns[record.offset] = now_ns

    reader = threading.Thread(target=consume, name="deltabus-bench-consumer", daemon=True)
    reader.start()
    sends = _send_paced(bootstrap, topic, acks, run_s)
    figures: dict[str, Any] = gathered(latencies, len(sends), stop, reader, consumer.close)
    if trace_dir is not None:
        sent_ns = {future.get(0).offset: ns for future, ns in sends if future.done()
                   and future.exception(0) is None}
        figures["breakdown"] = latency_trace.breakdown(trace_dir, topic, sent_ns, polled_ns)
    return figures


def gathered(latencies: list[float], sent: int, stop: threading.Event,
             reader: threading.Thread, close: Callable[[], Any]) -> dict[str, float]:
    """A latency step's figures once its `reader` thread has them all (or has been idle for
    IDLE_MS_MAX): stops the reader and closes its consumer first."""
    deadline = time.monotonic() + IDLE_MS_MAX / 1000
    while len(latencies) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join(5)
    close()
    return percentiles(latencies, sent)


def percentiles(latencies: list[float], sent: int) -> dict[str, float]:
    """A latency step's figures (ms): p50, p95, p99 and max of what came back of `sent`."""
    ordered = sorted(latencies)
    if not ordered:
        raise RuntimeError("latency: no record came back")

    def pct(q: float) -> float:
        return ordered[min(int(len(ordered) * q), len(ordered) - 1)]

    return {"sent": sent, "received": len(ordered), "p50": pct(0.5), "p95": pct(0.95),
            "p99": pct(0.99), "max": ordered[-1]}


def _send_paced(bootstrap: str, topic: str, acks: int | str,
                run_s: float) -> list[tuple[FutureRecordMetadata, int]]:
    """Send one 16-byte record every LATENCY_INTERVAL_S for `run_s`; returns each send's future
    and when it was called (time.time_ns()).

    Waits at most IDLE_MS_MAX for the acks: a backlog must not stretch the bench without end.
    """
    producer = Producer(bootstrap, acks=acks, linger_ms=0)
    sends: list[tuple[FutureRecordMetadata, int]] = []
    try:
        producer.send(topic, WARM_UP).get(30)
        start = next_at = time.monotonic()
        while time.monotonic() - start < run_s:
            now_ns = time.time_ns()
            sends.append((producer.send(topic, b"x" * 16, timestamp_ms=now_ns // 1_000_000),
                          now_ns))
            next_at += LATENCY_INTERVAL_S
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        with contextlib.suppress(KafkaTimeoutError):
            producer.close(timeout=IDLE_MS_MAX / 1000)
    return sends
