"""`Fetcher`: the consumer's fetches (Kafka's Fetcher, with its FetchCollector's part).

Sends one Fetch to the leader of the assigned partitions that have nothing buffered or in
flight, completes the answers, applies each partition's answer to the `SubscriptionState`
(records into the buffer and the position past them; a position out of range reset by
`auto_offset_reset`), waits out a broker's throttle (its throttle_time_ms), and hands poll the
buffered records, deserialized. The next fetch goes out while the application works on the
records just returned. Separate from the `Consumer`, which keeps the group, the commits and the
public API: this is the fetch path alone, with the calls it has in flight and the throttles.

Invariants: a partition has at most one fetch in flight; an answer for a position that moved
since its fetch was sent (a seek, a reset, a revoke) is dropped; a partition's position is
validated with its leader (`OffsetFetcher`) before it is fetched from a new leader. Not
thread-safe: owned by one Consumer and run on its polling thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import pyarrow as pa

from deltabus import errors, trace
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.consumer_coordinator import TopicPartition
from deltabus.client.offset_fetcher import OffsetFetcher
from deltabus.client.subscription_state import SubscriptionState
from deltabus.records import ConsumerRecord, from_ipc, iter_consumer_records
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb

__all__ = ["Deserializer", "Fetcher"]

# The consumer's logger: applications (and tests) configure and watch that one for resets.
log = logging.getLogger("deltabus.client.consumer")

Deserializer = Callable[[bytes], Any]


class Fetcher:
    """Fetches for one Consumer's assigned partitions. Runs in the user's process; not
    thread-safe (the consumer's polling thread only)."""

    def __init__(self, client: ClusterClient, assignment: SubscriptionState,
                 offsets: OffsetFetcher, *, fetch_max_wait_ms: int, fetch_min_bytes: int,
                 fetch_max_bytes: int, max_partition_fetch_bytes: int, isolation: int,
                 auto_offset_reset: str,
                 deserializers: tuple[Deserializer | None, Deserializer | None]) -> None:
        """The options are the consumer's (Kafka's fetch configs); `isolation`: the isolation
        level's number on the wire."""
        self._client = client
        self._assignment = assignment
        self._offsets = offsets
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self._isolation = isolation
        self.auto_offset_reset = auto_offset_reset
        self._deserializers = deserializers
        # Fetches sent ahead: (gRPC future, the fetch offset of each partition it asks for).
        self._inflight: list[tuple[Any, dict[TopicPartition, int | None]]] = []
        self._fetch_addresses: dict[Any, str] = {}  # an in-flight fetch -> its broker
        # broker address -> time.monotonic() before which we fetch nothing from it: its answer
        # said we are over a quota (throttle_time_ms), as Kafka's consumer waits
        self.throttled_until: dict[str, float] = {}

    # ---- handing records to poll -------------------------------------------------------------

    def collect(self, limit: int, deadline: float) -> dict[TopicPartition, pa.Table]:
        """Up to `limit` buffered records, one table per partition, fetching until some are
        buffered or the deadline passes; then the next fetches go out ahead of the next poll."""
        while not self._assignment.buffer:
            if not self._inflight:
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
                self.send_fetches(min(wait_ms, self.fetch_max_wait_ms))
                if not self._inflight:
                    self._wait_out_throttles(deadline)
            self._complete_fetches(deadline)
            if self._assignment.buffer or time.monotonic() >= deadline:
                break
        out: dict[TopicPartition, pa.Table] = {}
        buffer = self._assignment.buffer
        while buffer and limit > 0:
            tp, table = next(iter(buffer.items()))
            part = table.slice(0, limit)
            rest = table.slice(part.num_rows)
            if rest.num_rows:
                buffer[tp] = rest
            else:
                del buffer[tp]
            out[tp] = part
            self._assignment.consumed_epochs[tp] = part.column("leader_epoch")[-1].as_py()
            limit -= part.num_rows
        if out:  # fetch ahead while the application works on these records
            self.send_fetches(self.fetch_max_wait_ms)
        return out

    def records(self, taken: list[tuple[TopicPartition, pa.Table]],
                epochs: dict[TopicPartition, int]) -> list[ConsumerRecord]:
        """What `collect` took as ConsumerRecords, deserialized. `epochs`: the consumed epochs
        before the take, restored for what a failed deserialization gives back."""
        out: list[ConsumerRecord] = []
        for i, (tp, table) in enumerate(taken):
            records = iter_consumer_records(tp.topic, tp.partition, table)
            if self._deserializers == (None, None):
                out.extend(records)
                continue
            for j, record in enumerate(records):
                try:
                    out.append(self._deserialized(record))
                except errors.ClientError:
                    # As Kafka's consumer (KIP-334): the records before it are returned, and
                    # the position stays at it, so the next poll raises again.
                    self._give_back([(tp, table.slice(j)), *taken[i + 1:]], epochs)
                    if j:
                        self._assignment.consumed_epochs[tp] = \
                            table.column("leader_epoch")[j - 1].as_py()
                    if out:
                        return out
                    raise
        return out

    def _deserialized(self, record: ConsumerRecord) -> ConsumerRecord:
        """`record` with its key and value through the deserializers. A failure raises
        ClientError naming the record (Kafka's RecordDeserializationException)."""
        key_deserializer, value_deserializer = self._deserializers
        try:
            return record._replace(
                key=(key_deserializer(record.key) if key_deserializer and record.key is not None
                     else record.key),
                value=(value_deserializer(record.value)
                       if value_deserializer and record.value is not None else record.value))
        except Exception as e:
            raise errors.ClientError(
                f"cannot deserialize the record of {record.topic}-{record.partition} at offset "
                f"{record.offset}: {e}; poll raises this until the consumer seeks past it"
            ) from e

    def _give_back(self, untaken: list[tuple[TopicPartition, pa.Table]],
                   epochs: dict[TopicPartition, int]) -> None:
        """Undo part of a poll's take: these records go back to the front of the buffer, so
        each partition's position is the first of them again."""
        buffer = self._assignment.buffer
        for tp, table in untaken:
            rest = buffer.pop(tp, None)
            buffer[tp] = table if rest is None else pa.concat_tables([table, rest])
            if tp in epochs:
                self._assignment.consumed_epochs[tp] = epochs[tp]
            else:
                self._assignment.consumed_epochs.pop(tp, None)
        for tp, _ in reversed(untaken):
            buffer.move_to_end(tp, last=False)

    # ---- fetching ----------------------------------------------------------------------------

    def _wait_out_throttles(self, deadline: float) -> None:
        """Nothing could be fetched: every leader asked us to wait. Wait for the first to
        be free again (or the poll's deadline)."""
        now = time.monotonic()
        pending = [t for t in self.throttled_until.values() if t > now]
        if pending:
            time.sleep(max(0.0, min(min(pending), deadline) - now))

    def send_fetches(self, max_wait_ms: int) -> None:
        """Send a fetch to each leader of partitions with nothing buffered or in flight."""
        positions = self._assignment.positions
        busy = {tp for _, sent in self._inflight for tp in sent}
        todo = [tp for tp in positions if tp not in self._assignment.buffer and tp not in busy]
        unknown = [tp for tp in todo if positions[tp] is None]
        if unknown:
            self._offsets.reset(unknown)
        retry = self._offsets.validate_positions(
            [tp for tp in todo if self._offsets.needs_validation(tp)])
        todo = [tp for tp in todo if tp not in retry]
        now = time.monotonic()
        for address, group in self._offsets.by_leader(todo, retry).items():
            if self.throttled_until.get(address, 0.0) > now:
                continue  # that broker throttles us: its partitions wait
            request = pb.FetchRequest(
                max_wait_ms=max_wait_ms, min_bytes=self.fetch_min_bytes,
                max_bytes=self.fetch_max_bytes, format=pb.ARROW, isolation_level=self._isolation,
                partitions=[self._fetch_partition(t) for t in group])
            try:
                call = self._client.stub(address).Fetch.future(
                    request, timeout=max_wait_ms / 1000 + self._client.request_timeout_ms / 1000)
            except errors.DeltaBusError:
                retry.extend(group)
                continue
            for t in group:  # what the leader at this epoch answers is valid there
                self._assignment.validated_epochs[t] = self._offsets.leader_epoch(t)
            self._inflight.append((call, {t: positions[t] for t in group}))
            self._fetch_addresses[call] = address
        if retry:
            self._back_off()

    def _complete_fetches(self, deadline: float) -> None:
        """Take the answers of in-flight fetches that complete before the deadline. An answer
        that raises (a non-retriable error) is taken all the same, as a failed call is: the next
        poll fetches again rather than raising the same old answer at every poll."""
        pending: list[tuple[Any, dict[TopicPartition, int | None]]] = []
        retry: list[TopicPartition] = []
        for call, sent in self._inflight:
            try:
                response = call.result(timeout=max(0.0, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                pending.append((call, sent))
                continue
            except grpc.RpcError as e:
                self._fetch_addresses.pop(call, None)
                error = error_from_rpc(e)
                if not error.retriable:
                    self._inflight = pending
                    raise error from None
                retry.extend(sent)
                continue
            address = self._fetch_addresses.pop(call, None)
            if response.throttle_time_ms > 0 and address is not None:
                self.throttled_until[address] = (time.monotonic()
                                                 + response.throttle_time_ms / 1000)
            try:
                self._handle_fetch(response, sent, retry)
            except errors.DeltaBusError:
                self._inflight = pending
                raise
        self._inflight = pending
        if retry:
            self._back_off()

    def _back_off(self) -> None:
        time.sleep(self._client.retry_backoff_ms / 1000)
        self._client.refresh_metadata()

    def _fetch_partition(self, tp: TopicPartition) -> pb.FetchPartition:
        state = self._client.image.partition(tp.topic, tp.partition)
        entry = pb.FetchPartition(topic=tp.topic, partition=tp.partition,
                                  fetch_offset=self._assignment.positions[tp] or 0,
                                  partition_max_bytes=self.max_partition_fetch_bytes)
        if state is not None:
            entry.current_leader_epoch = state.leader_epoch
        return entry

    def _handle_fetch(self, response: pb.FetchResponse, sent: dict[TopicPartition, int | None],
                      retry: list[TopicPartition]) -> None:
        positions = self._assignment.positions
        for p in response.partitions:
            tp = TopicPartition(p.topic, p.partition)
            if tp not in positions or positions[tp] != sent.get(tp):
                continue  # unassigned or seeked since the fetch was sent
            if p.error_code == errors.OffsetOutOfRangeError.code:
                if self.auto_offset_reset == "none":
                    raise errors.OffsetOutOfRangeError(
                        f"Fetch position {positions[tp]} is out of range for partition "
                        f"{tp.topic}-{tp.partition} (log start offset {p.log_start_offset}, "
                        f"high watermark {p.high_watermark}) and auto_offset_reset is none")
                log.info("fetch position %s of %s-%d is out of range; resetting to %s",
                         positions[tp], tp.topic, tp.partition, self.auto_offset_reset)
                self._offsets.reset([tp], committed=False)
                continue
            if p.error_code:
                error = errors.error_for_code(p.error_code, p.error_message)
                if not error.retriable:
                    raise error
                retry.append(tp)
                continue
            if p.arrow_records:
                table = from_ipc(p.arrow_records)
                if table.num_rows:
                    self._assignment.buffer[tp] = table
                    positions[tp] = table.column("offset")[-1].as_py() + 1
                    if trace.traced(tp.topic):
                        trace.stamp("fetched", tp.topic, tp.partition,
                                    table.column("offset")[0].as_py(),
                                    table.column("offset")[-1].as_py(),
                                    received=trace.now_ns())
                    self._assignment.position_epochs[tp] = \
                        table.column("leader_epoch")[-1].as_py()
            # Past what the answer read but holds no record of (markers, aborted records).
            if p.next_offset > (positions[tp] or 0):
                positions[tp] = p.next_offset

    # ---- rebalances and closing --------------------------------------------------------------

    def forget(self, revoked: list[TopicPartition]) -> None:
        """Drop the in-flight fetches that ask for a revoked partition: their answers are not
        ours to apply any more."""
        self._inflight = [(call, sent) for call, sent in self._inflight
                          if not any(tp in revoked for tp in sent)]
        self._fetch_addresses = {call: self._fetch_addresses[call] for call, _ in self._inflight
                                 if call in self._fetch_addresses}

    def close(self) -> None:
        """Cancel the fetches in flight."""
        for call, _ in self._inflight:
            call.cancel()
        self._inflight = []
