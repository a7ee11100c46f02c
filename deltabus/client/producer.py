"""`Producer`: Kafka's producer, over gRPC with Arrow batches.

Thread-safe. `send` only appends to an in-memory batch for its partition (no I/O, no per-record
objects beyond a small future), so a Python loop can send hundreds of thousands of records a
second; a sender thread turns full or lingered batches into Arrow IPC and sends them to partition
leaders: one batch in flight per partition (so per-partition order holds, retries included),
partitions in parallel, at most `max_in_flight_requests_per_connection` requests per broker.

Delivery: a batch that fails with a retriable error is retried (after a metadata refresh when the
error says the leader moved) until `delivery_timeout_ms`; then its futures fail. Limits:
`buffer_memory` bytes of unsent records (send blocks up to `max_block_ms` beyond it), `batch_size`
bytes per partition batch, `max_request_size` bytes per request.

Batch sizes: the broker checks a topic's max.message.bytes on each batch as Kafka does, so a
batch never grows past `batch_size` as a record batch would count it, each record at its largest
(`records.record_bytes_max`); only a record bigger than that goes alone. The default, 1,000,000
(librdkafka's), leaves a full batch room within the default max.message.bytes (1,048,588).

Transactions (KIP-98), as confluent-kafka's Producer names them: with a `transactional_id`,
`init_transactions()` makes the producer transactional (a new epoch from the transaction
coordinator, fencing earlier producers of the id); then `begin_transaction()`, `send`,
`send_offsets_to_transaction`, `commit_transaction()` or `abort_transaction()`. Without
`init_transactions()` a transactional id only gives a stable producer id (epoch 0, or
`producer_epoch`), as the Spark sink and `exactly_once` use it.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Unpack

import grpc
import numpy as np
import pyarrow as pa

from deltabus import errors, trace
from deltabus.client import wire
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.partitioner import StickyPartitioner, partition_for_key
from deltabus.client.security import ClientSecurity, SecuritySettings
from deltabus.client.transaction_manager import TransactionManager
from deltabus.records import (
    HEADER_OVERHEAD_BYTES_MAX,
    RECORD_OVERHEAD_BYTES_MAX,
    produce_batch,
    record_bytes_max,
    to_ipc,
    to_ipc_batches,
)
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb

log = logging.getLogger(__name__)

_BATCH_ORDER = itertools.count()
_ACKS = {"0": pb.ACKS_NONE, "1": pb.ACKS_LEADER, "all": pb.ACKS_ALL, "-1": pb.ACKS_ALL}


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int  # -1 unless the broker set LogAppendTime


@dataclass(eq=False)
class _Batch:
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
    order: int = field(default_factory=lambda: next(_BATCH_ORDER))  # creation order
    _payload: bytes | None = None
    done: threading.Event = field(default_factory=threading.Event)
    base_offset: int = -1
    error: BaseException | None = None
    callbacks: list = field(default_factory=list)

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

    def complete(self, base_offset: int, error: BaseException | None) -> None:
        self.base_offset, self.error = base_offset, error
        self.done.set()
        for callback in self.callbacks:
            try:
                callback()
            except Exception:
                log.exception("a send callback failed")


class FutureRecordMetadata:
    """The future `send` returns; `get()` blocks until the record is acknowledged."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        return self._batch.done.is_set()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.done.wait(timeout):
            raise errors.KafkaTimeoutError(f"no acknowledgement within {timeout} s")
        if self._batch.error is not None:
            raise self._batch.error
        offset = self._batch.base_offset + self._index if self._batch.base_offset >= 0 else -1
        return RecordMetadata(self._batch.topic, self._batch.partition, offset, -1)

    result = get

    def add_done_callback(self, fn: Callable[[FutureRecordMetadata], Any]) -> None:
        if self._batch.done.is_set():
            fn(self)
        else:
            self._batch.callbacks.append(lambda: fn(self))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._batch.done.wait(timeout)
        return self._batch.error


def _offset_commits(offsets: Any) -> list[pb.OffsetCommitPartition]:
    """send_offsets_to_transaction's offsets as TxnOffsetCommit entries."""
    if isinstance(offsets, dict):
        items = [(tp[0], tp[1], o if isinstance(o, int) else o.offset,
                  "" if isinstance(o, int) else getattr(o, "metadata", "") or "",
                  -1 if isinstance(o, int) else getattr(o, "leader_epoch", -1))
                 for tp, o in offsets.items()]
    else:
        items = [(o.topic, o.partition, o.offset, getattr(o, "metadata", None) or "",
                  getattr(o, "leader_epoch", None) or -1) for o in offsets]
    return [pb.OffsetCommitPartition(topic=t, partition=p, committed_offset=o, metadata=m,
                                     committed_leader_epoch=e) for t, p, o, m, e in items]


def _to_bytes(data: Any, what: str) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, str or None, not {type(data).__name__}")


class Producer:
    """Send records to topics. Options are Kafka's producer configs in snake case, with Kafka
    3's defaults: acks="all" and idempotence on (no duplicates or reordering on retries)."""

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str],
        *,
        acks: int | str = "all",
        linger_ms: int = 5,
        batch_size: int = 1_000_000,
        buffer_memory: int = 256 * 1024 * 1024,
        max_request_size: int = 64 * 1024 * 1024,
        max_in_flight_requests_per_connection: int = 5,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        max_block_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        client_id: str = "deltabus-producer",
        allow_auto_create_topics: bool = True,
        enable_idempotence: bool = True,
        max_in_flight_batches_per_partition: int = 2,
        transactional_id: str | None = None,
        producer_epoch: int | None = None,
        transaction_timeout_ms: int = 60_000,
        **security: Unpack[SecuritySettings],
    ) -> None:
        """`security`: Kafka's client security configs (deltabus.client.security)."""
        acks_value = _ACKS.get(str(acks))
        if acks_value is None:
            raise errors.InvalidRequiredAcksError(f"acks must be 0, 1 or all, not {acks!r}")
        self.acks = acks_value
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_request_size = max_request_size
        self.max_in_flight = max_in_flight_requests_per_connection
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.request_timeout_ms = request_timeout_ms
        self.max_block_s = max_block_ms / 1000
        self.allow_auto_create = allow_auto_create_topics
        self._client = ClusterClient(bootstrap_servers, request_timeout_ms=request_timeout_ms,
                                     retry_backoff_ms=retry_backoff_ms, client_id=client_id,
                                     security=ClientSecurity.from_settings(**security))
        self._lock = threading.Condition()
        self._open: dict[tuple[str, int], _Batch] = {}
        self._ready: collections.deque[_Batch] = collections.deque()
        self._in_flight: dict[str, int] = collections.defaultdict(int)
        # broker address -> time.monotonic() before which it takes no request from us: its
        # answer said we are over a quota (throttle_time_ms), as Kafka's producer waits
        self._throttled_until: dict[str, float] = {}
        # Batches in flight per partition: 1 without idempotence (gRPC may serve two requests
        # in either order); with it, full batches pipeline up to this depth (the leader appends
        # them in sequence order).
        self._busy: collections.Counter[tuple[str, int]] = collections.Counter()
        if transactional_id is not None and not enable_idempotence:
            raise errors.InvalidConfigError("a transactional_id needs enable_idempotence")
        self.enable_idempotence = enable_idempotence
        # The same producer id across restarts (see deltabus.client.exactly_once).
        self.transactional_id = transactional_id
        # With a transactional id, the epoch to write with instead of the cluster's: the Spark
        # sink writes micro-batch b with epoch b, so leaders recognise a replay of b and fence
        # an older batch's zombie task (see deltabus.spark.sink).
        if producer_epoch is not None and not (
                transactional_id is not None and 0 <= producer_epoch < 32_768):
            raise errors.InvalidConfigError(
                "producer_epoch needs a transactional_id and must be in [0, 32767]")
        self._fixed_epoch = producer_epoch
        self.transaction_timeout_ms = transaction_timeout_ms
        self._txn: TransactionManager | None = None  # set by init_transactions()
        self._in_flight_max = (max_in_flight_batches_per_partition if enable_idempotence
                               else 1)
        self._producer_id = -1
        self._producer_epoch = -1
        self._sequences: collections.Counter[tuple[str, int]] = collections.Counter()
        self._flushing = False
        self._refreshing = False
        self._unsent_bytes = 0
        self._incomplete: set[_Batch] = set()
        self._sticky = StickyPartitioner()
        self._closed = False
        self._sender = threading.Thread(target=self._send_loop, name="deltabus-producer-sender",
                                        daemon=True)
        self._sender.start()

    # ---- sending -----------------------------------------------------------------------------

    def partitions_for(self, topic: str) -> int:
        return self._client.partitions_for(topic, wait_ms=int(self.max_block_s * 1000),
                                           allow_auto_create=self.allow_auto_create)

    def send(self, topic: str, value: Any = None, key: Any = None,
             headers: list[tuple[str, Any]] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """Queue one record; returns a future of its RecordMetadata (topic, partition, offset)."""
        if self._txn is not None:
            self._txn.check_sending()
        value_b = _to_bytes(value, "value")
        key_b = _to_bytes(key, "key")
        n = self.partitions_for(topic)
        if partition is None:
            partition = (partition_for_key(key_b, n) if key_b is not None
                         else self._sticky.partition(topic, n))
        elif not 0 <= partition < n:
            raise errors.UnknownTopicOrPartitionError(
                f"partition {partition} of topic {topic} does not exist (it has {n})")
        size = len(value_b or b"") + len(key_b or b"") + RECORD_OVERHEAD_BYTES_MAX + sum(
            len(k.encode()) + len(_to_bytes(v, "header value") or b"") + HEADER_OVERHEAD_BYTES_MAX
            for k, v in headers or ())
        with self._lock:
            if self._closed:
                raise errors.ClientError("the producer is closed")
            self._wait_for_buffer(size)
            batch = self._open.get((topic, partition))
            if batch is not None and batch.nbytes + size > self.batch_size:
                batch.full = True  # a batch stays within batch_size (but for a lone record)
                self._seal(batch)
                batch = None
            if batch is None:
                batch = self._new_batch(topic, partition)
            index = len(batch.values)
            batch.values.append(value_b)
            batch.keys.append(key_b)
            if timestamp_ms is not None or headers:
                self._add_extras(batch, index, timestamp_ms, headers)
            elif batch.timestamps is not None or batch.headers is not None:
                self._add_extras(batch, index, None, None)
            batch.nbytes += size
            self._unsent_bytes += size
            if batch.nbytes >= self.batch_size:
                batch.full = True
                self._seal(batch)
        return FutureRecordMetadata(batch, index)

    def _add_extras(self, batch: _Batch, index: int, timestamp_ms: int | None,
                    headers: list[tuple[str, Any]] | None) -> None:
        if batch.timestamps is None:
            batch.timestamps = [None] * index
            batch.headers = [None] * index
        batch.timestamps.append(timestamp_ms)
        assert batch.headers is not None
        batch.headers.append([(k, _to_bytes(v, "header value")) for k, v in headers]
                             if headers else None)

    def send_batch(self, topic: str, data: pa.Table | list[bytes],
                   partition: int | None = None) -> list[FutureRecordMetadata]:
        """The bulk path: send an Arrow table (columns value, and optionally key, timestamp,
        headers) or a list of values in as few requests as possible. Returns one future per
        chunk; each resolves to the metadata of the chunk's first record."""
        if self._txn is not None:
            self._txn.check_sending()
        table = (data if isinstance(data, pa.Table)
                 else pa.table({"value": pa.array(data, pa.binary())}))
        n = self.partitions_for(topic)
        keyed = ("key" in table.column_names
                 and table.column("key").null_count < table.num_rows)
        if keyed and partition is None:
            keys = table.column("key").to_pylist()
            parts = [partition_for_key(k, n) if k is not None else self._sticky.partition(topic, n)
                     for k in keys]
            futures = []
            for p in sorted(set(parts)):
                mask = pa.array([x == p for x in parts])
                futures.extend(self.send_batch(topic, table.filter(mask), partition=p))
            return futures
        if partition is not None and not 0 <= partition < n:
            raise errors.UnknownTopicOrPartitionError(
                f"partition {partition} of topic {topic} does not exist (it has {n})")
        futures = []
        for chunk, batch_rows, nbytes, full in self._chunks(table):
            p = partition if partition is not None else self._sticky.partition(topic, n)
            batch = _Batch(topic, p, time.monotonic(), table=chunk, nbytes=nbytes, full=full,
                           batch_rows=batch_rows)
            batch.payload()  # serialise here, while an earlier chunk is in flight
            with self._lock:
                if self._closed:
                    raise errors.ClientError("the producer is closed")
                self._wait_for_buffer(nbytes)
                batch.created = time.monotonic()
                self._incomplete.add(batch)
                self._unsent_bytes += nbytes
                self._ready.append(batch)
                self._lock.notify_all()
            if partition is None:
                self._sticky.on_new_batch(topic, n, p)
            futures.append(FutureRecordMetadata(batch, 0))
        return futures

    def _chunks(self, table: pa.Table) -> list[tuple[pa.Table, tuple[int, ...], int, bool]]:
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

    def _wait_for_buffer(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        while self._unsent_bytes + size > self.buffer_memory and self._unsent_bytes > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.KafkaTimeoutError(
                    f"Failed to allocate memory within the configured max blocking time "
                    f"{self.max_block_s * 1000:.0f} ms (buffer_memory={self.buffer_memory})")
            self._lock.wait(left)

    def _new_batch(self, topic: str, partition: int) -> _Batch:
        batch = _Batch(topic, partition, time.monotonic())
        self._open[(topic, partition)] = batch
        self._incomplete.add(batch)
        self._lock.notify_all()
        return batch

    def _seal(self, batch: _Batch) -> None:
        """Move an open batch to the ready queue (caller holds the lock)."""
        if self._open.get((batch.topic, batch.partition)) is batch:
            del self._open[(batch.topic, batch.partition)]
            self._ready.append(batch)
            n = len(self._client.image.topics[batch.topic].partitions) \
                if batch.topic in self._client.image.topics else 1
            self._sticky.on_new_batch(batch.topic, n, batch.partition)
            self._lock.notify_all()

    # ---- the sender thread -------------------------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    queued = {(b.topic, b.partition) for b in self._ready}
                    for batch in [b for b in self._open.values()
                                  if self._sealable(b, now, queued)]:
                        self._seal(batch)
                    sendable = self._take_sendable(now) if self._ready else []
                    if sendable or (self._closed and not self._incomplete):
                        break
                    self._lock.wait(self._next_wakeup(now, queued))
                if not sendable and self._closed and not self._incomplete:
                    return
            self._dispatch(sendable)

    def _sealable(self, batch: _Batch, now: float, queued: set[tuple[str, int]]) -> bool:
        """A lingered batch is sent when its partition is free; while the partition has a request
        in flight, or batches queued (waiting out a retry backoff: its leader is moving), records
        keep joining the open batch (one commit for them all, not many small batches that would
        later drain one round trip each)."""
        if self._closed or self._flushing:
            return True
        key = (batch.topic, batch.partition)
        return (now - batch.created >= self.linger_s and self._busy[key] == 0
                and key not in queued)

    def _next_wakeup(self, now: float, queued: set[tuple[str, int]]) -> float:
        times = [b.created + self.linger_s for b in self._open.values()
                 if self._busy[(b.topic, b.partition)] == 0
                 and (b.topic, b.partition) not in queued]
        times += [b.retry_at for b in self._ready if b.retry_at > now]
        return max(min(times, default=now + 0.1) - now, 0.0005)

    def _room(self, batch: _Batch, key: tuple[str, int]) -> bool:
        """May this batch go while others of its partition are in flight? Only a full one, and
        only up to the pipelining depth: sending a large batch while the previous one commits
        hides its transfer; a small one does better waiting and collecting more records."""
        busy = self._busy[key]
        return busy == 0 or (busy < self._in_flight_max and batch.full)

    def _take_sendable(self, now: float) -> list[_Batch]:
        """Due ready batches, in order, of partitions with room in flight (caller holds the
        lock). Per-partition order holds either way: one batch in flight at a time without
        idempotence, sequence numbers the leader appends in order with it. Batches of one
        partition in one request are appended in request order; partitions go in parallel."""
        sendable: list[_Batch] = []
        waiting: collections.deque[_Batch] = collections.deque()
        blocked: set[tuple[str, int]] = set()
        for batch in self._ready:
            key = (batch.topic, batch.partition)
            if key in blocked or batch.retry_at > now or not self._room(batch, key):
                blocked.add(key)  # nothing may overtake a batch that waits
                waiting.append(batch)
                continue
            self._busy[key] += 1
            sendable.append(batch)
        self._ready = waiting
        return sendable

    def _dispatch(self, batches: list[_Batch]) -> None:
        """Group batches by leader and send one request per leader (split at max_request_size)."""
        by_leader: dict[str, list[_Batch]] = collections.defaultdict(list)
        outcomes: list[tuple[_Batch, int, errors.DeltaBusError | None]] = []
        if self.enable_idempotence:
            try:
                self._number(batches)
            except errors.DeltaBusError as e:
                self._settle([(b, -1, e) for b in batches])
                return
        for batch in batches:
            try:
                broker, _ = self._client.leader(batch.topic, batch.partition)
            except errors.DeltaBusError as e:
                outcomes.append((batch, -1, e))
                continue
            by_leader[broker.address].append(batch)
        if outcomes:
            self._settle(outcomes)
        for address, group in by_leader.items():
            sent: list[_Batch] = []
            size = 0
            for batch in group:
                payload = batch.payload()
                if sent and size + len(payload) > self.max_request_size:
                    self._send_request(address, sent)
                    size, sent = 0, []
                size += len(payload)
                sent.append(batch)
            self._send_request(address, sent)

    def _number(self, batches: list[_Batch]) -> None:
        """Give each batch its producer id and base sequence, once: a retry keeps them, so
        the leader recognises it. The id comes from the cluster on first use."""
        if self._producer_id < 0:
            response = self._client.call_any("InitProducerId", pb.InitProducerIdRequest(
                transactional_id=self.transactional_id or ""))
            errors.check(response.error_code, response.error_message)
            self._producer_id, self._producer_epoch = response.producer_id, response.producer_epoch
            if self._fixed_epoch is not None:
                self._producer_epoch = self._fixed_epoch
        for batch in batches:
            if batch.base_sequence < 0:
                key = (batch.topic, batch.partition)
                batch.base_sequence = self._sequences[key]
                self._sequences[key] += batch.count
        if self._txn is not None:  # in the transaction before its first batch, as librdkafka
            self._txn.add_partitions({(b.topic, b.partition) for b in batches},
                                     self.max_block_s)

    def sequences(self) -> dict[tuple[str, int], int]:
        """The next sequence number per partition (after flush: what was sent so far)."""
        with self._lock:
            return dict(self._sequences)

    def restore_sequences(self, sequences: dict[tuple[str, int], int]) -> None:
        """Continue a transactional producer's sequences where an earlier instance of it
        stood, before sending anything: replayed batches then carry the sequence numbers they
        had, and the leaders drop those already written."""
        with self._lock:
            if self._incomplete:
                raise errors.ClientError("restore_sequences before sending anything")
            self._sequences = collections.Counter(sequences)

    def _produce_data(self, batch: _Batch) -> pb.PartitionProduceData:
        data = pb.PartitionProduceData(topic=batch.topic, partition=batch.partition)
        if self.enable_idempotence:
            data.producer_id = self._producer_id
            data.producer_epoch = self._producer_epoch
            data.base_sequence = batch.base_sequence
        return data

    def _send_request(self, address: str, batches: list[_Batch]) -> None:
        with self._lock:
            while True:
                throttled_s = self._throttled_until.get(address, 0.0) - time.monotonic()
                if throttled_s <= 0 and self._in_flight[address] < self.max_in_flight:
                    break
                self._lock.wait(throttled_s if throttled_s > 0 else None)
            self._in_flight[address] += 1
        request = wire.produce_request(
            self.acks, self.request_timeout_ms,
            [(self._produce_data(b), b.payload()) for b in batches],
            self.transactional_id if self._txn is not None else None)
        sent_ns = trace.now_ns()
        for batch in batches:
            batch.sent_ns = sent_ns
        try:
            call = self._client.raw_produce(address).future(
                request, timeout=self.request_timeout_ms / 1000 + 5)
        except errors.DeltaBusError as e:
            self._request_done(address)
            self._settle([(b, -1, e) for b in batches])
            return
        call.add_done_callback(lambda f: self._on_response(address, f, batches))

    def _request_done(self, address: str) -> None:
        with self._lock:
            self._in_flight[address] -= 1
            self._lock.notify_all()

    def _on_response(self, address: str, call: Any, batches: list[_Batch]) -> None:
        self._request_done(address)
        try:
            response = call.result()
        except grpc.RpcError as e:
            error = error_from_rpc(e)
            self._settle([(b, -1, error) for b in batches])
            return
        except Exception as e:  # cancelled at close
            self._settle([(b, -1, errors.NetworkError(str(e))) for b in batches])
            return
        if response.throttle_time_ms > 0:
            with self._lock:
                self._throttled_until[address] = max(
                    self._throttled_until.get(address, 0.0),
                    time.monotonic() + response.throttle_time_ms / 1000)
        if self.acks == 0:
            self._settle([(b, -1, None) for b in batches])
            return
        results: dict[tuple[str, int], collections.deque[Any]] = {}
        for p in response.partitions:  # several batches of one partition: answers in order
            results.setdefault((p.topic, p.partition), collections.deque()).append(p)
        outcomes: list[tuple[_Batch, int, errors.DeltaBusError | None]] = []
        for batch in batches:
            answers = results.get((batch.topic, batch.partition))
            result = answers.popleft() if answers else None
            if result is None:
                outcomes.append((batch, -1, errors.UnknownServerError("no answer for the batch")))
            elif result.error_code == errors.DuplicateSequenceNumberError.code:
                # The leader already has this batch (written before a failover, its answer
                # lost): success, as Kafka's producer takes it, with the offset unknown.
                outcomes.append((batch, -1, None))
            elif result.error_code:
                outcomes.append((batch, -1, errors.error_for_code(result.error_code,
                                                                  result.error_message)))
            else:
                outcomes.append((batch, result.base_offset, None))
                if trace.traced(batch.topic):
                    trace.stamp("produce", batch.topic, batch.partition, result.base_offset,
                                result.base_offset + batch.count - 1, sent=batch.sent_ns,
                                acked=trace.now_ns())
        self._settle(outcomes)

    def _settle(self, outcomes: list[tuple[_Batch, int, errors.DeltaBusError | None]]) -> None:
        """Apply the outcome of sent batches in one step: retriable failures go back to the front
        of the queue in their order (after retry_backoff_ms), the rest complete, and their
        partitions are free again. One step, so no later batch of a partition can slip ahead."""
        now = time.monotonic()
        done: list[tuple[_Batch, int, BaseException | None]] = []
        retry: list[_Batch] = []
        refresh = False
        for batch, base_offset, error in outcomes:
            expired = now - batch.created > self.delivery_timeout_s
            if error is not None and error.retriable and not expired:
                batch.retry_at = now + self._client.retry_backoff_ms / 1000
                retry.append(batch)
                refresh |= error.invalid_metadata
            elif error is not None and error.retriable and not isinstance(
                    error, (errors.NetworkError, errors.RequestTimedOutError)):
                done.append((batch, -1, error))  # as Kafka: the broker's last answer
            elif error is not None and error.retriable:
                done.append((batch, -1, errors.KafkaTimeoutError(
                    f"Expiring records for {batch.topic}-{batch.partition}: "
                    f"delivery.timeout.ms {self.delivery_timeout_s * 1000:.0f} passed: {error}")))
            else:
                done.append((batch, base_offset, error))
        for batch, base_offset, failure in done:
            if failure is not None and self._txn is not None:
                self._txn.batch_failed(failure)
            if failure is not None:  # as Kafka's producer: a lost batch is worth a line
                log.warning("batch of %d records to %s-%d (sequence %d) failed: %s",
                            batch.count, batch.topic, batch.partition, batch.base_sequence,
                            failure)
            batch.complete(base_offset, failure)  # callbacks run before flush() can return
        with self._lock:
            if retry:  # back in creation order: a partition's batches must never swap places
                self._ready = collections.deque(
                    sorted([*retry, *self._ready], key=lambda b: b.order))
            for batch, _, _ in done:
                self._incomplete.discard(batch)
                self._unsent_bytes -= batch.nbytes
            for batch, _, _ in outcomes:
                self._busy[(batch.topic, batch.partition)] -= 1
            self._lock.notify_all()
        if refresh:
            self._refresh_metadata_soon()

    def _refresh_metadata_soon(self) -> None:
        """Refresh metadata in the background (once at a time): a leader moved."""
        with self._lock:
            if self._refreshing:
                return
            self._refreshing = True

        def refresh() -> None:
            try:
                self._client.refresh_metadata()
            except errors.DeltaBusError as e:
                log.info("metadata refresh before a retry failed: %s", e)
            finally:
                with self._lock:
                    self._refreshing = False
                    self._lock.notify_all()

        threading.Thread(target=refresh, name="deltabus-producer-metadata", daemon=True).start()

    # ---- transactions ------------------------------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Make this producer transactional (confluent-kafka's init_transactions): a new epoch
        for its transactional id, which fences any earlier producer of the id and aborts the
        transaction it left open. Call it once, before sending."""
        if self.transactional_id is None or self._fixed_epoch is not None:
            raise errors.InvalidConfigError(
                "init_transactions needs a transactional_id and no producer_epoch")
        with self._lock:
            if self._incomplete or self._producer_id >= 0 and self._txn is None:
                raise errors.InvalidTxnStateError("init_transactions before sending anything")
        txn = self._txn or TransactionManager(self._client, self.transactional_id,
                                              self.transaction_timeout_ms)
        txn.init(self.max_block_s if timeout is None else timeout)
        with self._lock:
            self._txn = txn
            self._producer_id, self._producer_epoch = txn.producer_id, txn.producer_epoch
            self._sequences.clear()  # a new epoch starts its sequences at 0

    def _transaction(self) -> TransactionManager:
        if self._txn is None:
            raise errors.InvalidTxnStateError("init_transactions() first")
        return self._txn

    def begin_transaction(self) -> None:
        """Open a transaction: what is sent until commit or abort is in it."""
        self._transaction().begin()

    def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any,
                                    timeout: float | None = None) -> None:
        """Commit a consumer group's offsets with the transaction (read-process-write):
        `offsets` a dict {TopicPartition or (topic, partition): OffsetAndMetadata or offset},
        or a list of objects with topic, partition and offset (confluent-kafka's
        TopicPartition); `group_metadata` the consumer's consumer_group_metadata() or a group
        id. The offsets become the group's only if the transaction commits."""
        group_id = group_metadata if isinstance(group_metadata, str) else \
            group_metadata.group_id
        self._transaction().send_offsets(
            group_id, getattr(group_metadata, "generation_id", -1),
            getattr(group_metadata, "member_id", ""), _offset_commits(offsets),
            self.max_block_s if timeout is None else timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send what is queued, then commit the transaction: its records become visible to
        read_committed consumers and its offsets the group's. A fenced producer raises
        ProducerFencedError; a transaction with a failed batch raises and must be aborted."""
        txn = self._transaction()
        txn.raise_if_fatal()
        self.flush(timeout)
        txn.end(True, self.max_block_s if timeout is None else timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Wait for what is queued, then abort the transaction: its records are never shown to
        read_committed consumers and its offsets are dropped."""
        txn = self._transaction()
        txn.raise_if_fatal()
        self.flush(timeout)
        txn.end(False, self.max_block_s if timeout is None else timeout)

    # ---- flushing and closing ----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until it is acknowledged (or failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._flushing = True
            for batch in list(self._open.values()):
                self._seal(batch)
            self._lock.notify_all()
        try:
            self._await_incomplete(deadline, timeout)
        finally:
            with self._lock:
                self._flushing = False

    def _await_incomplete(self, deadline: float | None, timeout: float | None) -> None:
        with self._lock:
            while self._incomplete:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise errors.KafkaTimeoutError(
                        f"flush did not complete in {timeout} s: {len(self._incomplete)} "
                        "batches unacknowledged")
                self._lock.wait(left if left is not None else 0.5)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then release the connections. Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
            self._sender.join(5)
            self._client.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
