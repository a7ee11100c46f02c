"""`Sender`: the producer's sender thread, from ready batches to acknowledgements (Kafka's
Sender).

The loop seals lingered batches and takes the sendable ones from the `RecordAccumulator`,
numbers them (producer id, epoch and base sequence, once: a retry keeps them), groups them by
leader into produce requests (split at `max_request_size`, at most
`max_in_flight_requests_per_connection` per broker, after a broker's throttle), and settles each
batch from the answer: acknowledged, failed, or back to the front of the queue for a retry
(refreshing metadata in the background when the leader moved). Separate from the `Producer`
(the public API) and the accumulator (where batches wait): this is the I/O, on its own thread.

Invariants: a batch keeps its sequence numbers across retries; the outcome of a request's
batches is applied in one step under the lock, so no later batch of a partition slips ahead
of one that is retried. Thread-safe: the loop runs on the thread the Producer starts, answers
complete on gRPC's threads, and the batches, requests in flight and throttles are read and
written under the Producer's condition. The producer id, epoch, sequences and transaction
manager are the sender thread's while it sends; the Producer sets them (under the condition)
only before anything is sent (`init_transactions`, `restore_sequences`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import grpc

from deltabus import errors, trace
from deltabus.client import wire
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.record_accumulator import ProducerBatch, RecordAccumulator
from deltabus.client.transaction_manager import TransactionManager
from deltabus.config import PRODUCER_EPOCH_MAX
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb

__all__ = ["Sender"]

# The producer's logger: applications configure that one for the producer's warnings.
log = logging.getLogger("deltabus.client.producer")

Outcome = tuple[ProducerBatch, int, errors.DeltaBusError | None]


class Sender:
    """Sends one Producer's batches. Runs in the user's process, on the producer's sender
    thread and gRPC's callback threads; thread-safe under the Producer's condition."""

    def __init__(self, client: ClusterClient, lock: threading.Condition,
                 accumulator: RecordAccumulator, *, acks: pb.Acks, request_timeout_ms: int,
                 max_request_size: int, max_in_flight: int, delivery_timeout_s: float,
                 max_block_s: float, enable_idempotence: bool, transactional_id: str | None,
                 fixed_epoch: int | None) -> None:
        """`lock`: the Producer's condition; `acks`: the wire's Acks; `fixed_epoch`: the
        producer_epoch to write with instead of the cluster's (see Producer)."""
        self._client = client
        self._lock = lock
        self._accumulator = accumulator
        self.acks = acks
        self.request_timeout_ms = request_timeout_ms
        self.max_request_size = max_request_size
        self.max_in_flight = max_in_flight
        self.delivery_timeout_s = delivery_timeout_s
        self.max_block_s = max_block_s
        self.enable_idempotence = enable_idempotence
        self.transactional_id = transactional_id
        self._fixed_epoch = fixed_epoch
        self._in_flight: dict[str, int] = collections.defaultdict(int)
        # broker address -> time.monotonic() before which it takes no request from us: its
        # answer said we are over a quota (throttle_time_ms), as Kafka's producer waits
        self.throttled_until: dict[str, float] = {}
        self.txn: TransactionManager | None = None  # set by the Producer's init_transactions()
        self.producer_id = -1
        self.producer_epoch = -1
        self.sequences: collections.Counter[tuple[str, int]] = collections.Counter()
        # A batch of this idempotent producer failed: its sequence numbers are a gap no later
        # batch of its partition gets past. The next dispatch bumps the epoch first (KIP-360).
        self._epoch_bump = False
        self._refreshing = False

    def run(self) -> None:
        """The sender thread's loop: until the producer is closed and nothing is incomplete."""
        accumulator = self._accumulator
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    queued = {(b.topic, b.partition) for b in accumulator.ready}
                    for batch in [b for b in accumulator.open.values()
                                  if accumulator.sealable(b, now, queued)]:
                        accumulator.seal(batch)
                    sendable = accumulator.take_sendable(now) if accumulator.ready else []
                    if sendable or (accumulator.closed and not accumulator.incomplete):
                        break
                    self._lock.wait(accumulator.next_wakeup(now, queued))
                if not sendable and accumulator.closed and not accumulator.incomplete:
                    return
            self._dispatch(sendable)

    def _dispatch(self, batches: list[ProducerBatch]) -> None:
        """Group batches by leader and send one request per leader (split at max_request_size)."""
        by_leader: dict[str, list[ProducerBatch]] = collections.defaultdict(list)
        outcomes: list[Outcome] = []
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
            sent: list[ProducerBatch] = []
            size = 0
            for batch in group:
                payload = batch.payload()
                if sent and size + len(payload) > self.max_request_size:
                    self._send_request(address, sent)
                    size, sent = 0, []
                size += len(payload)
                sent.append(batch)
            self._send_request(address, sent)

    def _number(self, batches: list[ProducerBatch]) -> None:
        """Give each batch its producer id and base sequence, once: a retry keeps them, so
        the leader recognises it, unless the epoch was bumped since (then it is numbered again
        in the new one). The id comes from the cluster on first use."""
        self._bump_epoch_if_needed()
        if self.producer_id < 0:
            response = self._client.call_any("InitProducerId", pb.InitProducerIdRequest(
                transactional_id=self.transactional_id or ""))
            errors.check(response.error_code, response.error_message)
            self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
            if self._fixed_epoch is not None:
                self.producer_epoch = self._fixed_epoch
        for batch in batches:
            if batch.base_sequence < 0 or batch.producer_epoch != self.producer_epoch:
                key = (batch.topic, batch.partition)
                batch.base_sequence = self.sequences[key]
                batch.producer_epoch = self.producer_epoch
                self.sequences[key] += batch.count
        if self.txn is not None:  # in the transaction before its first batch, as librdkafka
            self.txn.add_partitions({(b.topic, b.partition) for b in batches},
                                    self.max_block_s)

    def _bump_epoch_if_needed(self) -> None:
        """After a failed batch, once nothing is in flight: the next epoch, every partition's
        sequences from 0 (Kafka's idempotent producer, KIP-360: the epoch of a producer
        without a transactional id is bumped by the producer itself; the leader takes a newer
        epoch's sequence 0). A new producer id where the epoch would overflow."""
        with self._lock:
            if not self._epoch_bump:
                return
            while sum(self._in_flight.values()) > 0:
                self._lock.wait()
            self._epoch_bump = False
            if self.producer_id < 0:
                return
            if self.producer_epoch + 1 > PRODUCER_EPOCH_MAX:
                self.producer_id = -1  # _number asks the cluster for a new one
            log.info("producer %d: a batch failed, leaving a gap in its sequences: bumping the "
                     "epoch to %d", self.producer_id, self.producer_epoch + 1)
            self.producer_epoch += 1
            self.sequences.clear()

    def _produce_data(self, batch: ProducerBatch) -> pb.PartitionProduceData:
        data = pb.PartitionProduceData(topic=batch.topic, partition=batch.partition)
        if self.enable_idempotence:
            data.producer_id = self.producer_id
            data.producer_epoch = batch.producer_epoch
            data.base_sequence = batch.base_sequence
        return data

    def _send_request(self, address: str, batches: list[ProducerBatch]) -> None:
        with self._lock:
            while True:
                throttled_s = self.throttled_until.get(address, 0.0) - time.monotonic()
                if throttled_s <= 0 and self._in_flight[address] < self.max_in_flight:
                    break
                self._lock.wait(throttled_s if throttled_s > 0 else None)
            self._in_flight[address] += 1
        request = wire.produce_request(
            self.acks, self.request_timeout_ms,
            [(self._produce_data(b), b.payload()) for b in batches],
            self.transactional_id if self.txn is not None else None)
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

    def _on_response(self, address: str, call: Any, batches: list[ProducerBatch]) -> None:
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
                self.throttled_until[address] = max(
                    self.throttled_until.get(address, 0.0),
                    time.monotonic() + response.throttle_time_ms / 1000)
        if self.acks == 0:
            self._settle([(b, -1, None) for b in batches])
            return
        results: dict[tuple[str, int], collections.deque[Any]] = {}
        for p in response.partitions:  # several batches of one partition: answers in order
            results.setdefault((p.topic, p.partition), collections.deque()).append(p)
        outcomes: list[Outcome] = []
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

    def _settle(self, outcomes: list[Outcome]) -> None:
        """Apply the outcome of sent batches in one step: retriable failures go back to the front
        of the queue in their order (after retry_backoff_ms), the rest complete, and their
        partitions are free again. One step, so no later batch of a partition can slip ahead."""
        now = time.monotonic()
        done: list[tuple[ProducerBatch, int, BaseException | None]] = []
        retry: list[ProducerBatch] = []
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
            if failure is not None and self.txn is not None:
                self.txn.batch_failed(failure)
            elif (failure is not None and self.enable_idempotence and batch.base_sequence >= 0
                  and self._fixed_epoch is None):
                with self._lock:
                    self._epoch_bump = True
            if failure is not None:  # as Kafka's producer: a lost batch is worth a line
                log.warning("batch of %d records to %s-%d (sequence %d) failed: %s",
                            batch.count, batch.topic, batch.partition, batch.base_sequence,
                            failure)
            batch.complete(base_offset, failure)  # callbacks run before flush() can return
        accumulator = self._accumulator
        with self._lock:
            if retry:  # back in creation order: a partition's batches must never swap places
                accumulator.ready = collections.deque(
                    sorted([*retry, *accumulator.ready], key=lambda b: b.order))
            for batch, _, _ in done:
                accumulator.incomplete.discard(batch)
                accumulator.unsent_bytes -= batch.nbytes
            for batch, _, _ in outcomes:
                accumulator.busy[(batch.topic, batch.partition)] -= 1
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
