"""`RecordAccumulator`: the producer's batches, from `send` to the sender (Kafka's
RecordAccumulator, with its ProducerBatch).

Holds the open batch of each partition (which `send` appends to), the queue of sealed batches
ready to go, the batches in flight per partition, every batch not yet acknowledged, and the bytes
of unsent records against `buffer_memory`. Decides when a batch is sealed (full, lingered, or
flushed), which ready batches may go now (`take_sendable`), and how the bulk path cuts a table
into batches (`chunks`). Separate from the `Producer` (the public API) and the `Sender` (the
requests): this is where records wait, and where the limits on waiting are kept.

Invariants: a partition's batches leave the ready queue in creation order, and nothing overtakes
a batch that waits; a partition has at most `in_flight_max` batches in flight, and more than one
only when they are full. Thread-safe under the owner's lock: every method but `chunks` is called
with the Producer's condition held (`send`, `flush` and the sender thread share it).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from deltabus import errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.partitioner import StickyPartitioner
from deltabus.records import produce_batch, record_bytes_max, to_ipc, to_ipc_batches

__all__ = ["ProducerBatch", "RecordAccumulator"]

# The producer's logger: applications configure that one for the producer's warnings.
log = logging.getLogger("deltabus.client.producer")

_BATCH_ORDER = itertools.count()


@dataclass(eq=False)
class ProducerBatch:
    """Records for one partition, filled by send() and sent as one Arrow batch."""

    topic: str
    partition: int
    created: float
    values: list = field(default_factory=list)
    keys: list = field(default_factory=list)
    timestamps: list | None = None
    headers: list | None = None
    table: pa.Table | None = None  # the bulk path hands over a whole table
    batch_rows: tuple[int, ...] = ()  # the bulk path's record batches in `table` (records each)
    nbytes: int = 0  # the records' bytes in a record batch at most (records.record_bytes_max)
    full: bool = False  # no more records fit: it may be sent while others are in flight
    retry_at: float = 0.0
    sent_ns: int = 0  # its last request's sending (time.time_ns()), for deltabus.trace
    base_sequence: int = -1  # set when first sent by an idempotent producer
    producer_epoch: int = -1  # the epoch of its base sequence (a bump numbers it again)
    order: int = field(default_factory=lambda: next(_BATCH_ORDER))  # creation order
    _payload: bytes | None = None
    done: threading.Event = field(default_factory=threading.Event)
    base_offset: int = -1
    error: BaseException | None = None
    callbacks: list = field(default_factory=list)
    # Guards `callbacks` against a callback added as the batch completes (it would never run).
    _callbacks_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return self.table.num_rows if self.table is not None else len(self.values)

    def to_table(self) -> pa.Table:
        if self.table is None:
            has_keys = any(k is not None for k in self.keys)
            self.table = produce_batch(self.values, self.keys if has_keys else None,
                                       self.timestamps, self.headers)
            self.values = self.keys = []  # type: ignore[assignment]
        return self.table

    def payload(self) -> bytes:
        """The batch as Arrow IPC, made once (retries resend the same bytes)."""
        if self._payload is None:
            table = self.to_table()
            if len(self.batch_rows) > 1:
                starts = np.cumsum((0,) + self.batch_rows[:-1])
                self._payload = to_ipc_batches([table.slice(int(start), rows) for start, rows
                                                in zip(starts, self.batch_rows, strict=True)])
            else:
                self._payload = to_ipc(table)
        return self._payload

    def add_callback(self, callback: Callable[[], Any]) -> None:
        """Run `callback` once the batch is complete: now, if it already is."""
        with self._callbacks_lock:
            if not self.done.is_set():
                self.callbacks.append(callback)
                return
        callback()

    def complete(self, base_offset: int, error: BaseException | None) -> None:
        with self._callbacks_lock:
            self.base_offset, self.error = base_offset, error
            self.done.set()
            callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a send callback failed")


class RecordAccumulator:
    """One Producer's batches and the limits on them. Runs in the user's process; its state
    is guarded by the Producer's condition, which callers hold (see the module docstring)."""

    def __init__(self, client: ClusterClient, lock: threading.Condition,
                 sticky: StickyPartitioner, *, batch_size: int, buffer_memory: int,
                 max_request_size: int, linger_s: float, max_block_s: float,
                 in_flight_max: int) -> None:
        """`lock`: the Producer's condition, notified whenever a batch is sealed, a partition
        frees up or buffer memory is released; the options are the producer's."""
        self._client = client
        self._lock = lock
        self._sticky = sticky
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_request_size = max_request_size
        self.linger_s = linger_s
        self.max_block_s = max_block_s
        # Batches in flight per partition: 1 without idempotence (gRPC may serve two requests
        # in either order); with it, full batches pipeline up to this depth (the leader appends
        # them in sequence order).
        self._in_flight_max = in_flight_max
        self.open: dict[tuple[str, int], ProducerBatch] = {}
        self.ready: collections.deque[ProducerBatch] = collections.deque()
        self.busy: collections.Counter[tuple[str, int]] = collections.Counter()
        self.incomplete: set[ProducerBatch] = set()
        self.unsent_bytes = 0
        self.flushing = False
        self.closed = False

    def chunks(self, table: pa.Table) -> list[tuple[pa.Table, tuple[int, ...], int, bool]]:
        """`table` cut into record batches of at most batch_size bytes as Kafka counts them (a
        lone record may be more): the broker checks max.message.bytes on each, as Kafka's does.
        Consecutive record batches travel together, up to half a request, as one entry of
        one Arrow record batch each (`records.to_ipc_batches`): one sequence range, one append,
        so bulk produce commits megabytes at a time. Each entry with its record batches' record
        counts, its size, and whether it is full (all but a small last one)."""
        total = np.concatenate(([0], np.cumsum(record_bytes_max(table))))
        entry_max = max(1, self.max_request_size // 2)
        batch_max = min(self.batch_size, entry_max)
        bounds = [0]
        while bounds[-1] < table.num_rows:
            end = int(np.searchsorted(total, total[bounds[-1]] + batch_max, "right")) - 1
            bounds.append(max(end, bounds[-1] + 1))
        out, first = [], 0
        while first < len(bounds) - 1:
            last = first + 1
            while last < len(bounds) - 1 and total[bounds[last + 1]] - total[bounds[first]] \
                    <= entry_max:
                last += 1
            start, end = bounds[first], bounds[last]
            nbytes = int(total[end] - total[start])
            rows = tuple(bounds[i + 1] - bounds[i] for i in range(first, last))
            full = end < table.num_rows or 2 * nbytes >= self.batch_size
            out.append((table.slice(start, end - start), rows, nbytes, full))
            first = last
        return out

    def wait_for_buffer(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        while self.unsent_bytes + size > self.buffer_memory and self.unsent_bytes > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.KafkaTimeoutError(
                    f"Failed to allocate memory within the configured max blocking time "
                    f"{self.max_block_s * 1000:.0f} ms (buffer_memory={self.buffer_memory})")
            self._lock.wait(left)

    def new_batch(self, topic: str, partition: int) -> ProducerBatch:
        batch = ProducerBatch(topic, partition, time.monotonic())
        self.open[(topic, partition)] = batch
        self.incomplete.add(batch)
        self._lock.notify_all()
        return batch

    def seal(self, batch: ProducerBatch) -> None:
        """Move an open batch to the ready queue (caller holds the lock)."""
        if self.open.get((batch.topic, batch.partition)) is batch:
            del self.open[(batch.topic, batch.partition)]
            self.ready.append(batch)
            n = len(self._client.image.topics[batch.topic].partitions) \
                if batch.topic in self._client.image.topics else 1
            self._sticky.on_new_batch(batch.topic, n, batch.partition)
            self._lock.notify_all()

    def sealable(self, batch: ProducerBatch, now: float, queued: set[tuple[str, int]]) -> bool:
        """A lingered batch is sent when its partition is free; while the partition has a request
        in flight, or batches queued (waiting out a retry backoff: its leader is moving), records
        keep joining the open batch (one commit for them all, not many small batches that would
        later drain one round trip each)."""
        if self.closed or self.flushing:
            return True
        key = (batch.topic, batch.partition)
        return (now - batch.created >= self.linger_s and self.busy[key] == 0
                and key not in queued)

    def next_wakeup(self, now: float, queued: set[tuple[str, int]]) -> float:
        times = [b.created + self.linger_s for b in self.open.values()
                 if self.busy[(b.topic, b.partition)] == 0
                 and (b.topic, b.partition) not in queued]
        times += [b.retry_at for b in self.ready if b.retry_at > now]
        return max(min(times, default=now + 0.1) - now, 0.0005)

    def _room(self, batch: ProducerBatch, key: tuple[str, int]) -> bool:
        """May this batch go while others of its partition are in flight? Only a full one, and
        only up to the pipelining depth: sending a large batch while the previous one commits
        hides its transfer; a small one does better waiting and collecting more records."""
        busy = self.busy[key]
        return busy == 0 or (busy < self._in_flight_max and batch.full)

    def take_sendable(self, now: float) -> list[ProducerBatch]:
        """Due ready batches, in order, of partitions with room in flight (caller holds the
        lock). Per-partition order holds either way: one batch in flight at a time without
        idempotence, sequence numbers the leader appends in order with it. Batches of one
        partition in one request are appended in request order; partitions go in parallel."""
        sendable: list[ProducerBatch] = []
        waiting: collections.deque[ProducerBatch] = collections.deque()
        blocked: set[tuple[str, int]] = set()
        for batch in self.ready:
            key = (batch.topic, batch.partition)
            if key in blocked or batch.retry_at > now or not self._room(batch, key):
                blocked.add(key)  # nothing may overtake a batch that waits
                waiting.append(batch)
                continue
            self.busy[key] += 1
            sendable.append(batch)
        self.ready = waiting
        return sendable
