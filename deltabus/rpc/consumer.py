"""`Consumer`: Kafka's consumer with manual assignment (`assign`/`seek`/`poll`).

Not thread-safe (as Kafka's KafkaConsumer): one thread polls. The consumer keeps a position per
assigned partition; a partition with no position starts where `auto_offset_reset` says (earliest or
latest), and one whose position fell out of range is reset the same way. Consumer groups (subscribe,
committed offsets) build on this: the position bookkeeping here is what they commit.

`poll` returns ConsumerRecords; `poll_batch` returns one Arrow table per partition, the zero-copy
path for bulk readers (Spark, pandas).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import grpc
import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
from deltabus.records import ConsumerRecord, from_ipc, iter_consumer_records
from deltabus.rpc.client import ClusterClient, error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Consumer:
    """Read records from assigned partitions. Options are Kafka's consumer configs, snake case."""

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str],
        *,
        auto_offset_reset: str = "latest",
        fetch_max_wait_ms: int = cfg.FETCH_MAX_WAIT_MS,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = cfg.FETCH_MAX_BYTES,
        max_partition_fetch_bytes: int = cfg.FETCH_PARTITION_MAX_BYTES,
        max_poll_records: int = 500,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        client_id: str = "deltabus-consumer",
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise errors.InvalidConfigError(
                f"auto_offset_reset must be earliest, latest or none, not {auto_offset_reset!r}")
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_poll_records = max_poll_records
        self._client = ClusterClient(bootstrap_servers, request_timeout_ms=request_timeout_ms,
                                     retry_backoff_ms=retry_backoff_ms, client_id=client_id)
        self._positions: dict[TopicPartition, int | None] = {}
        self._buffer: collections.OrderedDict[TopicPartition, pa.Table] = collections.OrderedDict()
        # Fetches sent ahead: (gRPC future, the fetch offset of each partition it asks for).
        self._inflight: list[tuple[Any, dict[TopicPartition, int | None]]] = []
        self._closed = False

    # ---- assignment and positions ------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions (replacing any earlier assignment)."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        image = self._client.refresh_metadata()
        for tp in wanted:
            if image.partition(tp.topic, tp.partition) is None:
                raise errors.UnknownTopicOrPartitionError(
                    f"{tp.topic}-{tp.partition} does not exist")
        self._positions = {tp: self._positions.get(tp) for tp in wanted}
        self._buffer = collections.OrderedDict(
            (tp, t) for tp, t in self._buffer.items() if tp in self._positions)

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    def partitions_for_topic(self, topic: str) -> set[int]:
        image = self._client.refresh_metadata()
        if topic not in image.topics:
            raise errors.UnknownTopicOrPartitionError(f"Topic '{topic}' does not exist.")
        return set(range(len(image.topics[topic].partitions)))

    def topics(self) -> set[str]:
        return set(self._client.refresh_metadata().topics)

    def _check_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = TopicPartition(*tp)
        if tp not in self._positions:
            raise errors.ClientError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return tp

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        tp = self._check_assigned(partition)  # type: ignore[arg-type]
        if offset < 0:
            raise errors.ClientError(f"seek offset must not be negative: {offset}")
        self._positions[tp] = offset
        self._buffer.pop(tp, None)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, -2)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, -1)

    def _seek_to(self, partitions: Iterable[TopicPartition], timestamp: int) -> None:
        tps = [self._check_assigned(tp) for tp in partitions] or list(self._positions)
        for tp, offset in self._list_offsets(tps, timestamp).items():
            self._positions[tp] = offset
            self._buffer.pop(tp, None)

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record poll will return for this partition."""
        tp = self._check_assigned(partition)  # type: ignore[arg-type]
        buffered = self._buffer.get(tp)
        if buffered is not None:  # fetched ahead, not yet returned by poll
            return int(buffered.column("offset")[0].as_py())
        if self._positions[tp] is None:
            self._reset([tp])
        position = self._positions[tp]
        assert position is not None
        return position

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._list_offsets([TopicPartition(*tp) for tp in partitions], -2)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._list_offsets([TopicPartition(*tp) for tp in partitions], -1)

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The earliest offset whose timestamp is at or after the given ms (-1 when none)."""
        out = {}
        for tp, ts in timestamps.items():
            out.update(self._list_offsets([TopicPartition(*tp)], ts))
        return out

    def _reset(self, tps: list[TopicPartition]) -> None:
        if self.auto_offset_reset == "none":
            raise errors.OffsetOutOfRangeError(
                f"no position for {[f'{t.topic}-{t.partition}' for t in tps]} and "
                "auto_offset_reset is none")
        timestamp = -2 if self.auto_offset_reset == "earliest" else -1
        self._positions.update(self._list_offsets(tps, timestamp))

    def _list_offsets(self, tps: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        """ListOffsets against each partition's leader, retrying while leaders move."""
        out: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + self._client.request_timeout_ms / 1000
        pending = list(tps)
        while pending:
            retry: list[TopicPartition] = []
            for address, group in self._by_leader(pending, retry).items():
                request = pb.ListOffsetsRequest(partitions=[
                    pb.ListOffsetsPartition(topic=t.topic, partition=t.partition,
                                            timestamp=timestamp) for t in group])
                try:
                    response = self._client.call(address, "ListOffsets", request)
                except errors.DeltaBusError as e:
                    if not e.retriable:
                        raise
                    retry.extend(group)
                    continue
                for p in response.partitions:
                    tp = TopicPartition(p.topic, p.partition)
                    if p.error_code:
                        error = errors.error_for_code(p.error_code, p.error_message)
                        if not error.retriable:
                            raise error
                        retry.append(tp)
                    else:
                        out[tp] = p.offset
            if retry and time.monotonic() > deadline:
                raise errors.KafkaTimeoutError(
                    f"could not list offsets of {retry} in {self._client.request_timeout_ms} ms")
            if retry:
                time.sleep(self._client.retry_backoff_ms / 1000)
                self._client.refresh_metadata()
            pending = retry
        return out

    def _by_leader(self, tps: list[TopicPartition],
                   retry: list[TopicPartition]) -> dict[str, list[TopicPartition]]:
        groups: dict[str, list[TopicPartition]] = collections.defaultdict(list)
        for tp in tps:
            try:
                broker, _ = self._client.leader(tp.topic, tp.partition)
            except errors.DeltaBusError as e:
                if not e.retriable:
                    raise
                retry.append(tp)
                continue
            groups[broker.address].append(tp)
        return groups

    # ---- polling -----------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Up to max_poll_records records, in offset order per partition; waits up to timeout_ms
        for the first one."""
        limit = max_records or self.max_poll_records
        out: list[ConsumerRecord] = []
        for tp, table in self._take(limit, timeout_ms).items():
            out.extend(iter_consumer_records(tp.topic, tp.partition, table))
        return out

    def poll_batch(self, timeout_ms: int = 0,
                   max_records: int | None = None) -> dict[TopicPartition, pa.Table]:
        """Like poll, but one Arrow table (the partition table's columns) per partition."""
        return self._take(max_records or 1 << 62, timeout_ms)

    def _take(self, limit: int, timeout_ms: int) -> dict[TopicPartition, pa.Table]:
        if self._closed:
            raise errors.ClientError("the consumer is closed")
        if not self._positions:
            raise errors.ClientError("no partitions assigned: call assign() first")
        deadline = time.monotonic() + timeout_ms / 1000
        while not self._buffer:
            if not self._inflight:
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
                self._send_fetches(min(wait_ms, self.fetch_max_wait_ms))
            self._complete_fetches(deadline)
            if self._buffer or time.monotonic() >= deadline:
                break
        out: dict[TopicPartition, pa.Table] = {}
        while self._buffer and limit > 0:
            tp, table = next(iter(self._buffer.items()))
            part = table.slice(0, limit)
            rest = table.slice(part.num_rows)
            if rest.num_rows:
                self._buffer[tp] = rest
            else:
                del self._buffer[tp]
            out[tp] = part
            limit -= part.num_rows
        if out:  # fetch ahead while the application works on these records
            self._send_fetches(self.fetch_max_wait_ms)
        return out

    def _send_fetches(self, max_wait_ms: int) -> None:
        """Send a fetch to each leader of partitions with nothing buffered or in flight."""
        busy = {tp for _, sent in self._inflight for tp in sent}
        todo = [tp for tp in self._positions if tp not in self._buffer and tp not in busy]
        unknown = [tp for tp in todo if self._positions[tp] is None]
        if unknown:
            self._reset(unknown)
        retry: list[TopicPartition] = []
        for address, group in self._by_leader(todo, retry).items():
            request = pb.FetchRequest(
                max_wait_ms=max_wait_ms, min_bytes=self.fetch_min_bytes,
                max_bytes=self.fetch_max_bytes, replica_id=-1,
                partitions=[self._fetch_partition(t) for t in group])
            try:
                call = self._client.stub(address).Fetch.future(
                    request, timeout=max_wait_ms / 1000 + self._client.request_timeout_ms / 1000)
            except errors.DeltaBusError:
                retry.extend(group)
                continue
            self._inflight.append((call, {t: self._positions[t] for t in group}))
        if retry:
            self._back_off()

    def _complete_fetches(self, deadline: float) -> None:
        """Take the answers of in-flight fetches that complete before the deadline."""
        pending: list[tuple[Any, dict[TopicPartition, int | None]]] = []
        retry: list[TopicPartition] = []
        for call, sent in self._inflight:
            try:
                response = call.result(timeout=max(0.0, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                pending.append((call, sent))
                continue
            except grpc.RpcError as e:
                error = error_from_rpc(e)
                if not error.retriable:
                    self._inflight = pending
                    raise error from None
                retry.extend(sent)
                continue
            self._handle_fetch(response, sent, retry)
        self._inflight = pending
        if retry:
            self._back_off()

    def _back_off(self) -> None:
        time.sleep(self._client.retry_backoff_ms / 1000)
        self._client.refresh_metadata()

    def _fetch_partition(self, tp: TopicPartition) -> pb.FetchPartition:
        state = self._client.image.partition(tp.topic, tp.partition)
        entry = pb.FetchPartition(topic=tp.topic, partition=tp.partition,
                                  fetch_offset=self._positions[tp] or 0,
                                  partition_max_bytes=self.max_partition_fetch_bytes)
        if state is not None:
            entry.current_leader_epoch = state.leader_epoch
        return entry

    def _handle_fetch(self, response: pb.FetchResponse, sent: dict[TopicPartition, int | None],
                      retry: list[TopicPartition]) -> None:
        for p in response.partitions:
            tp = TopicPartition(p.topic, p.partition)
            if tp not in self._positions or self._positions[tp] != sent.get(tp):
                continue  # unassigned or seeked since the fetch was sent
            if p.error_code == errors.OffsetOutOfRangeError.code:
                self._reset([tp])
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
                    self._buffer[tp] = table
                    self._positions[tp] = table.column("offset")[-1].as_py() + 1

    def close(self) -> None:
        self._closed = True
        for call, _ in self._inflight:
            call.cancel()
        self._inflight = []
        self._client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
