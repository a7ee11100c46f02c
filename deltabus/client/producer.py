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

Split as Kafka's client is: batches wait in the `RecordAccumulator`, the `Sender` (on the sender
thread) sends them and settles the answers, the `TransactionManager` speaks to the transaction
coordinator; this class is the public API over them. The accumulator and the sender share the
producer's one condition, so a batch's way from `send` to its acknowledgement is under one lock.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Unpack

import pyarrow as pa

from deltabus import errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.partitioner import StickyPartitioner, partition_for_key
from deltabus.client.record_accumulator import ProducerBatch, RecordAccumulator
from deltabus.client.security import ClientSecurity, SecuritySettings
from deltabus.client.sender import Sender
from deltabus.client.transaction_manager import TransactionManager
from deltabus.records import HEADER_OVERHEAD_BYTES_MAX, RECORD_OVERHEAD_BYTES_MAX
from deltabus.rpc.v1 import deltabus_pb2 as pb

_ACKS = {"0": pb.ACKS_NONE, "1": pb.ACKS_LEADER, "all": pb.ACKS_ALL, "-1": pb.ACKS_ALL}


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int  # -1 unless the broker set LogAppendTime


class FutureRecordMetadata:
    """The future `send` returns; `get()` blocks until the record is acknowledged."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: ProducerBatch, index: int) -> None:
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
        self._batch.add_callback(lambda: fn(self))

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
        # One condition for the batches and the requests (send, flush, the sender thread and
        # gRPC's callbacks): the accumulator and the sender both wait on it and notify it.
        self._lock = threading.Condition()
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
        self._sticky = StickyPartitioner()
        # Batches waiting (Kafka's RecordAccumulator) and the thread that sends them (Sender).
        self._accumulator = RecordAccumulator(
            self._client, self._lock, self._sticky, batch_size=batch_size,
            buffer_memory=buffer_memory, max_request_size=max_request_size,
            linger_s=self.linger_s, max_block_s=self.max_block_s,
            # 1 without idempotence (gRPC may serve two requests in either order); with it,
            # full batches pipeline (the leader appends them in sequence order).
            in_flight_max=max_in_flight_batches_per_partition if enable_idempotence else 1)
        self._sender = Sender(
            self._client, self._lock, self._accumulator, acks=self.acks,
            request_timeout_ms=request_timeout_ms, max_request_size=max_request_size,
            max_in_flight=self.max_in_flight, delivery_timeout_s=self.delivery_timeout_s,
            max_block_s=self.max_block_s, enable_idempotence=enable_idempotence,
            transactional_id=transactional_id, fixed_epoch=producer_epoch)
        self._io_thread = threading.Thread(target=self._sender.run,
                                           name="deltabus-producer-sender", daemon=True)
        self._io_thread.start()

    @property
    def _throttled_until(self) -> dict[str, float]:
        """Broker address -> when its throttle ends (the sender's; tests look at it)."""
        return self._sender.throttled_until

    # ---- sending -----------------------------------------------------------------------------

    def partitions_for(self, topic: str) -> int:
        return self._client.partitions_for(topic, wait_ms=int(self.max_block_s * 1000),
                                           allow_auto_create=self.allow_auto_create)

    def send(self, topic: str, value: Any = None, key: Any = None,
             headers: list[tuple[str, Any]] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """Queue one record; returns a future of its RecordMetadata (topic, partition, offset)."""
        if self._sender.txn is not None:
            self._sender.txn.check_sending()
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
        accumulator = self._accumulator
        with self._lock:
            if accumulator.closed:
                raise errors.ClientError("the producer is closed")
            accumulator.wait_for_buffer(size)
            batch = accumulator.open.get((topic, partition))
            if batch is not None and batch.nbytes + size > self.batch_size:
                batch.full = True  # a batch stays within batch_size (but for a lone record)
                accumulator.seal(batch)
                batch = None
            if batch is None:
                batch = accumulator.new_batch(topic, partition)
            index = len(batch.values)
            batch.values.append(value_b)
            batch.keys.append(key_b)
            if timestamp_ms is not None or headers:
                self._add_extras(batch, index, timestamp_ms, headers)
            elif batch.timestamps is not None or batch.headers is not None:
                self._add_extras(batch, index, None, None)
            batch.nbytes += size
            accumulator.unsent_bytes += size
            if batch.nbytes >= self.batch_size:
                batch.full = True
                accumulator.seal(batch)
        return FutureRecordMetadata(batch, index)

    def _add_extras(self, batch: ProducerBatch, index: int, timestamp_ms: int | None,
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
        if self._sender.txn is not None:
            self._sender.txn.check_sending()
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
        accumulator = self._accumulator
        for chunk, batch_rows, nbytes, full in accumulator.chunks(table):
            p = partition if partition is not None else self._sticky.partition(topic, n)
            batch = ProducerBatch(topic, p, time.monotonic(), table=chunk, nbytes=nbytes,
                                  full=full, batch_rows=batch_rows)
            batch.payload()  # serialise here, while an earlier chunk is in flight
            with self._lock:
                if accumulator.closed:
                    raise errors.ClientError("the producer is closed")
                accumulator.wait_for_buffer(nbytes)
                batch.created = time.monotonic()
                accumulator.incomplete.add(batch)
                accumulator.unsent_bytes += nbytes
                accumulator.ready.append(batch)
                self._lock.notify_all()
            if partition is None:
                self._sticky.on_new_batch(topic, n, p)
            futures.append(FutureRecordMetadata(batch, 0))
        return futures

    def sequences(self) -> dict[tuple[str, int], int]:
        """The next sequence number per partition (after flush: what was sent so far)."""
        with self._lock:
            return dict(self._sender.sequences)

    def restore_sequences(self, sequences: dict[tuple[str, int], int]) -> None:
        """Continue a transactional producer's sequences where an earlier instance of it
        stood, before sending anything: replayed batches then carry the sequence numbers they
        had, and the leaders drop those already written."""
        with self._lock:
            if self._accumulator.incomplete:
                raise errors.ClientError("restore_sequences before sending anything")
            self._sender.sequences = collections.Counter(sequences)

    # ---- transactions ------------------------------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Make this producer transactional (confluent-kafka's init_transactions): a new epoch
        for its transactional id, which fences any earlier producer of the id and aborts the
        transaction it left open. Call it once, before sending."""
        if self.transactional_id is None or self._fixed_epoch is not None:
            raise errors.InvalidConfigError(
                "init_transactions needs a transactional_id and no producer_epoch")
        sender = self._sender
        with self._lock:
            if self._accumulator.incomplete or sender.producer_id >= 0 and sender.txn is None:
                raise errors.InvalidTxnStateError("init_transactions before sending anything")
        txn = sender.txn or TransactionManager(self._client, self.transactional_id,
                                               self.transaction_timeout_ms)
        txn.init(self.max_block_s if timeout is None else timeout)
        with self._lock:
            sender.txn = txn
            sender.producer_id, sender.producer_epoch = txn.producer_id, txn.producer_epoch
            sender.sequences.clear()  # a new epoch starts its sequences at 0

    def _transaction(self) -> TransactionManager:
        if self._sender.txn is None:
            raise errors.InvalidTxnStateError("init_transactions() first")
        return self._sender.txn

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
            self._accumulator.flushing = True
            for batch in list(self._accumulator.open.values()):
                self._accumulator.seal(batch)
            self._lock.notify_all()
        try:
            self._await_incomplete(deadline, timeout)
        finally:
            with self._lock:
                self._accumulator.flushing = False

    def _await_incomplete(self, deadline: float | None, timeout: float | None) -> None:
        with self._lock:
            while self._accumulator.incomplete:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise errors.KafkaTimeoutError(
                        f"flush did not complete in {timeout} s: "
                        f"{len(self._accumulator.incomplete)} "
                        "batches unacknowledged")
                self._lock.wait(left if left is not None else 0.5)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then release the connections. Safe to call twice."""
        if self._accumulator.closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._accumulator.closed = True
                self._lock.notify_all()
            self._io_thread.join(5)
            self._client.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
