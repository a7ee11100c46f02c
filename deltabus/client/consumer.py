"""`Consumer`: Kafka's consumer, in a consumer group (`subscribe`) or on its own (`assign`).

Not thread-safe (as Kafka's KafkaConsumer): one thread polls. The consumer keeps a position per
assigned partition: the offset of the next record `poll` returns. A partition with no position
starts at the group's committed offset, else where `auto_offset_reset` says (earliest or latest);
one whose position fell out of range is reset the same way.

A position also knows the leader epoch of the record before it. After a leader change (the
metadata shows a new leader epoch) the consumer validates its position with the new leader
before fetching again (OffsetForLeaderEpoch, Kafka's KIP-320): only when the new leader's log
ends that epoch below the position, records the consumer read were truncated away (an unclean
election), and it moves to where the logs part, saying so in its log. A clean failover never
moves a position: a new leader whose high watermark still lags answers with no records.

With a `group_id`, `subscribe` makes the consumer a member of the group (see
`consumer_coordinator`): partitions are assigned by the group, `poll` takes part in rebalances,
and positions are committed to `__consumer_offsets` (automatically every
`auto_commit_interval_ms`, at the next poll: at-least-once, as Kafka's auto-commit; or by
`commit`).

`poll` returns ConsumerRecords; `poll_batch` returns one Arrow table per partition, the zero-copy
path for bulk readers (Spark, pandas).
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Unpack

import grpc
import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors, trace
from deltabus.client.assignors import Assignor, assignor
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.consumer_coordinator import (
    CommitFailedError,
    ConsumerCoordinator,
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    TopicPartition,
    matching_topics,
)
from deltabus.client.security import ClientSecurity, SecuritySettings
from deltabus.metadata import MetadataImage
from deltabus.records import ConsumerRecord, from_ipc, iter_consumer_records
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb

__all__ = ["CommitFailedError", "Consumer", "ConsumerRebalanceListener", "OffsetAndMetadata",
           "TopicPartition"]

log = logging.getLogger(__name__)


class ConsumerRebalanceListener:
    """Called on the polling thread around rebalances (Kafka's ConsumerRebalanceListener):
    commit in `on_partitions_revoked` so the next owner starts where you stopped."""

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        pass

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        pass


ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}  # Kafka's, on the wire


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
        metadata_max_age_ms: int = 300_000,
        client_id: str = "deltabus-consumer",
        group_id: str | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        partition_assignment_strategy: Iterable[str | Assignor] = ("range",),
        isolation_level: str = "read_uncommitted",
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
        **security: Unpack[SecuritySettings],
    ) -> None:
        """`security`: Kafka's client security configs (deltabus.client.security).
        `isolation_level` as Kafka's: read_committed reads up to the last stable offset and
        never a record of an aborted transaction (end_offsets are the last stable offsets).
        `key_deserializer`, `value_deserializer`: as kafka-python's, a callable from a record's
        bytes to the key or value `poll` returns (`SchemaDeserializer` for a typed topic's);
        a null key or value stays None, as Kafka's deserializers give null for null.
        `poll_batch` keeps the bytes."""
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise errors.InvalidConfigError(
                f"auto_offset_reset must be earliest, latest or none, not {auto_offset_reset!r}")
        if isolation_level not in ISOLATION_LEVELS:
            raise errors.InvalidConfigError(
                "isolation_level must be read_uncommitted or read_committed, not "
                f"{isolation_level!r}")
        self.isolation_level = isolation_level
        self._isolation = ISOLATION_LEVELS[isolation_level]
        assignors = [assignor(a) if isinstance(a, str) else a
                     for a in partition_assignment_strategy]
        if not assignors:
            raise errors.InvalidConfigError("partition_assignment_strategy names no assignor")
        self.group_id = group_id
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_poll_records = max_poll_records
        self._deserializers = (key_deserializer, value_deserializer)
        self._client = ClusterClient(bootstrap_servers, request_timeout_ms=request_timeout_ms,
                                     retry_backoff_ms=retry_backoff_ms,
                                     metadata_max_age_ms=metadata_max_age_ms, client_id=client_id,
                                     security=ClientSecurity.from_settings(**security))
        self._group: ConsumerCoordinator | None = None
        if group_id is not None:
            self._group = ConsumerCoordinator(
                self._client, group_id, session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=heartbeat_interval_ms,
                max_poll_interval_ms=max_poll_interval_ms, assignors=assignors,
                client_id=client_id)
        self._subscription: list[str] | re.Pattern[str] | None = None
        self._listener: ConsumerRebalanceListener | None = None
        self._next_auto_commit_s = time.monotonic() + auto_commit_interval_ms / 1000
        self._committer: ThreadPoolExecutor | None = None  # commit_async, in call order
        self._positions: dict[TopicPartition, int | None] = {}
        # The leader epoch of the record before each position (-1: unknown, not validated), and
        # the leader epoch of the leader that position is known to be valid with.
        self._position_epochs: dict[TopicPartition, int] = {}
        self._validated_epochs: dict[TopicPartition, int] = {}
        self._consumed_epochs: dict[TopicPartition, int] = {}  # of the last record poll returned
        self._buffer: collections.OrderedDict[TopicPartition, pa.Table] = collections.OrderedDict()
        # Fetches sent ahead: (gRPC future, the fetch offset of each partition it asks for).
        self._inflight: list[tuple[Any, dict[TopicPartition, int | None]]] = []
        self._fetch_addresses: dict[Any, str] = {}  # an in-flight fetch -> its broker
        # broker address -> time.monotonic() before which we fetch nothing from it: its answer
        # said we are over a quota (throttle_time_ms), as Kafka's consumer waits
        self._throttled_until: dict[str, float] = {}
        self._closed = False

    # ---- assignment and positions ------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join the consumer group for these topics (or every topic matching `pattern`); the
        group assigns the partitions, at the next poll. Needs a group_id."""
        if self._group is None:
            raise errors.InvalidConfigError("subscribe needs a group_id: use assign() without one")
        if self._subscription is None and self._positions:
            raise errors.ClientError("Subscription to topics, partitions and pattern are "
                                     "mutually exclusive: this consumer has assign()ed")
        if (topics is None) == (pattern is None):
            raise errors.ClientError("subscribe to a list of topics or to a pattern")
        self._subscription = (re.compile(pattern) if pattern is not None
                              else sorted(set(topics or ())))
        self._listener = listener
        self._group.rejoin_needed = True

    def subscription(self) -> set[str]:
        return set(self._subscribed_topics()) if self._subscription is not None else set()

    def _subscribed_topics(self) -> list[str]:
        if isinstance(self._subscription, re.Pattern):
            return matching_topics(self._subscription, list(self._client.metadata().topics))
        return list(self._subscription or [])

    def unsubscribe(self) -> None:
        """Leave the group and drop the assignment."""
        if self._group is not None and self._subscription is not None:
            self._revoke(sorted(self._positions))
            self._group.leave()
        self._subscription = None
        self._positions = {}
        self._buffer.clear()

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions (replacing any earlier assignment)."""
        if self._subscription is not None:
            raise errors.ClientError("Subscription to topics, partitions and pattern are "
                                     "mutually exclusive: this consumer has subscribe()d")
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

    def metadata(self) -> MetadataImage:
        """The cluster's metadata, refreshed: topics with their leaders, replicas and ISR (Kafka's
        listTopics), and where the partition tables live."""
        return self._client.refresh_metadata()

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
        self._set_position(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, -2)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, -1)

    def _seek_to(self, partitions: Iterable[TopicPartition], timestamp: int) -> None:
        tps = [self._check_assigned(tp) for tp in partitions] or list(self._positions)
        for tp, offset in self._list_offsets(tps, timestamp).items():
            self._set_position(tp, offset)

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

    def _reset(self, tps: list[TopicPartition], *, committed: bool = True) -> None:
        """Positions for partitions with none: the group's committed offsets, else
        auto_offset_reset (Kafka's order: committed offsets win over the reset policy). A
        position out of range (below a log start offset retention moved) follows the policy
        alone (`committed` False): the committed offset may be that very position."""
        if self._group is not None and committed:
            for tp, om in self._group.committed(tps).items():
                if om is not None:  # validated before the first fetch when it has an epoch
                    self._set_position(tp, om.offset, epoch=om.leader_epoch)
            tps = [tp for tp in tps if self._positions.get(tp) is None]
            if not tps:
                return
        if self.auto_offset_reset == "none":
            raise errors.OffsetOutOfRangeError(
                f"no position for {[f'{t.topic}-{t.partition}' for t in tps]} and "
                "auto_offset_reset is none")
        timestamp = -2 if self.auto_offset_reset == "earliest" else -1
        for tp, offset in self._list_offsets(tps, timestamp).items():
            self._set_position(tp, offset)

    def _set_position(self, tp: TopicPartition, offset: int, *, epoch: int = -1,
                      validated_epoch: int = -1) -> None:
        """Move a position other than by fetching (seek, reset, committed offset, truncation):
        what was fetched ahead of the old position goes."""
        self._positions[tp] = offset
        self._position_epochs[tp] = epoch
        self._validated_epochs[tp] = validated_epoch
        self._consumed_epochs.pop(tp, None)
        self._buffer.pop(tp, None)

    def _list_offsets(self, tps: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        """ListOffsets against each partition's leader, retrying while leaders move."""
        out: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + self._client.request_timeout_ms / 1000
        pending = list(tps)
        while pending:
            retry: list[TopicPartition] = []
            for tp, answer in self._ask_leaders(pending, "ListOffsets", lambda group: (
                    pb.ListOffsetsRequest(isolation_level=self._isolation, partitions=[
                        pb.ListOffsetsPartition(topic=t.topic, partition=t.partition,
                                                timestamp=timestamp) for t in group])), retry):
                out[tp] = answer.offset
            if retry and time.monotonic() > deadline:
                raise errors.KafkaTimeoutError(
                    f"could not list offsets of {retry} in {self._client.request_timeout_ms} ms")
            if retry:
                time.sleep(self._client.retry_backoff_ms / 1000)
                self._client.refresh_metadata()
            pending = retry
        return out

    def _ask_leaders(self, tps: list[TopicPartition], method: str,
                     request_for: Callable[[list[TopicPartition]], Any],
                     retry: list[TopicPartition]) -> Iterator[tuple[TopicPartition, Any]]:
        """One `method` call to each leader of `tps`; yields each partition's answer that
        carries no error. Partitions whose leader is unknown, unreachable or answered a
        retriable error go to `retry`; any other error raises."""
        for address, group in self._by_leader(tps, retry).items():
            try:
                response = self._client.call(address, method, request_for(group))
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
                    yield tp, p

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
        epochs = dict(self._consumed_epochs)
        taken = list(self._take(limit, timeout_ms).items())
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
                        self._consumed_epochs[tp] = table.column("leader_epoch")[j - 1].as_py()
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
        for tp, table in untaken:
            rest = self._buffer.pop(tp, None)
            self._buffer[tp] = table if rest is None else pa.concat_tables([table, rest])
            if tp in epochs:
                self._consumed_epochs[tp] = epochs[tp]
            else:
                self._consumed_epochs.pop(tp, None)
        for tp, _ in reversed(untaken):
            self._buffer.move_to_end(tp, last=False)

    def poll_batch(self, timeout_ms: int = 0,
                   max_records: int | None = None) -> dict[TopicPartition, pa.Table]:
        """Like poll, but one Arrow table (the partition table's columns) per partition."""
        return self._take(max_records or 1 << 62, timeout_ms)

    def _take(self, limit: int, timeout_ms: int) -> dict[TopicPartition, pa.Table]:
        if self._closed:
            raise errors.ClientError("the consumer is closed")
        deadline = time.monotonic() + timeout_ms / 1000
        if self._subscription is not None:
            self._maybe_auto_commit()
            assert self._group is not None
            self._group.ensure_active(self._subscribed_topics(), self._revoke, self._assigned,
                                      deadline)
            if not self._positions:  # nothing assigned (more members than partitions)
                time.sleep(max(0.0, min(deadline - time.monotonic(), 0.1)))
                return {}
        elif not self._positions:
            raise errors.ClientError("no partitions assigned: call assign() or subscribe() first")
        while not self._buffer:
            if not self._inflight:
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
                self._send_fetches(min(wait_ms, self.fetch_max_wait_ms))
                if not self._inflight:
                    self._wait_out_throttles(deadline)
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
            self._consumed_epochs[tp] = part.column("leader_epoch")[-1].as_py()
            limit -= part.num_rows
        if out:  # fetch ahead while the application works on these records
            self._send_fetches(self.fetch_max_wait_ms)
        return out

    def _wait_out_throttles(self, deadline: float) -> None:
        """Nothing could be fetched: every leader asked us to wait. Wait for the first to
        be free again (or the poll's deadline)."""
        now = time.monotonic()
        pending = [t for t in self._throttled_until.values() if t > now]
        if pending:
            time.sleep(max(0.0, min(min(pending), deadline) - now))

    def _send_fetches(self, max_wait_ms: int) -> None:
        """Send a fetch to each leader of partitions with nothing buffered or in flight."""
        busy = {tp for _, sent in self._inflight for tp in sent}
        todo = [tp for tp in self._positions if tp not in self._buffer and tp not in busy]
        unknown = [tp for tp in todo if self._positions[tp] is None]
        if unknown:
            self._reset(unknown)
        retry = self._validate_positions([tp for tp in todo if self._needs_validation(tp)])
        todo = [tp for tp in todo if tp not in retry]
        now = time.monotonic()
        for address, group in self._by_leader(todo, retry).items():
            if self._throttled_until.get(address, 0.0) > now:
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
                self._validated_epochs[t] = self._leader_epoch(t)
            self._inflight.append((call, {t: self._positions[t] for t in group}))
            self._fetch_addresses[call] = address
        if retry:
            self._back_off()

    def _leader_epoch(self, tp: TopicPartition) -> int:
        """The partition's leader epoch in the cached metadata (-1: unknown)."""
        state = self._client.image.partition(tp.topic, tp.partition)
        return state.leader_epoch if state is not None else -1

    def _needs_validation(self, tp: TopicPartition) -> bool:
        """A position with a known epoch not yet checked against the current leader."""
        return (self._position_epochs.get(tp, -1) >= 0
                and self._validated_epochs.get(tp) != self._leader_epoch(tp))

    def _validate_positions(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Check positions against their new leaders (OffsetForLeaderEpoch); returns the
        partitions that could not be checked yet (not fetched until they are)."""
        retry: list[TopicPartition] = []
        current = {tp: self._leader_epoch(tp) for tp in tps}
        for tp, answer in self._ask_leaders(tps, "OffsetForLeaderEpoch", lambda group: (
                pb.OffsetForLeaderEpochRequest(partitions=[
                    pb.OffsetForLeaderEpochPartition(
                        topic=t.topic, partition=t.partition, current_leader_epoch=current[t],
                        leader_epoch=self._position_epochs[t]) for t in group])), retry):
            if tp in current:
                self._complete_validation(tp, answer.leader_epoch, answer.end_offset, current[tp])
        return retry

    def _complete_validation(self, tp: TopicPartition, epoch: int, end_offset: int,
                             leader_epoch: int) -> None:
        """Kafka's rules: a position within the epoch's end in the leader's log stands; one past
        it was truncated and moves back to where the logs part (with auto_offset_reset none,
        LogTruncationError); an epoch the leader does not know resets by auto_offset_reset."""
        position = self._positions[tp]
        assert position is not None
        if epoch >= 0 and end_offset >= position:
            self._validated_epochs[tp] = leader_epoch
            return
        where = f"{tp.topic}-{tp.partition}"
        if self.auto_offset_reset == "none":
            raise errors.LogTruncationError(
                f"Truncation detected for partition {where} at offset {position} (epoch "
                f"{self._position_epochs[tp]}): the leader's log ends that epoch at "
                f"{end_offset}, and auto_offset_reset is none")
        if epoch < 0 or end_offset < 0:
            log.warning("Truncation detected for partition %s at offset %d: the leader knows no "
                        "epoch at or before %d; resetting with auto_offset_reset=%s", where,
                        position, self._position_epochs[tp], self.auto_offset_reset)
            self._reset([tp], committed=False)
            return
        log.warning("Truncation detected for partition %s at offset %d, resetting offset to the "
                    "first offset known to diverge %d", where, position, end_offset)
        self._set_position(tp, end_offset, epoch=epoch, validated_epoch=leader_epoch)

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
                self._throttled_until[address] = (time.monotonic()
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
                if self.auto_offset_reset == "none":
                    raise errors.OffsetOutOfRangeError(
                        f"Fetch position {self._positions[tp]} is out of range for partition "
                        f"{tp.topic}-{tp.partition} (log start offset {p.log_start_offset}, "
                        f"high watermark {p.high_watermark}) and auto_offset_reset is none")
                log.info("fetch position %s of %s-%d is out of range; resetting to %s",
                         self._positions[tp], tp.topic, tp.partition, self.auto_offset_reset)
                self._reset([tp], committed=False)
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
                    if trace.traced(tp.topic):
                        trace.stamp("fetched", tp.topic, tp.partition,
                                    table.column("offset")[0].as_py(),
                                    table.column("offset")[-1].as_py(),
                                    received=trace.now_ns())
                    self._position_epochs[tp] = table.column("leader_epoch")[-1].as_py()
            # Past what the answer read but holds no record of (markers, aborted records).
            if p.next_offset > (self._positions[tp] or 0):
                self._positions[tp] = p.next_offset

    # ---- groups: rebalances and commits ---------------------------------------------------------

    def _revoke(self, revoked: list[TopicPartition]) -> None:
        """Before partitions go: auto-commit what was consumed, let the listener commit."""
        if self.enable_auto_commit:
            try:
                gone = set(revoked)
                self.commit({tp: om for tp, om in self._consumed().items() if tp in gone})
            except (CommitFailedError, errors.DeltaBusError) as e:
                log.warning("auto-commit before a rebalance failed: %s", e)
        if self._listener is not None:
            self._listener.on_partitions_revoked(revoked)
        for tp in revoked:
            self._positions.pop(tp, None)
            self._buffer.pop(tp, None)
        self._inflight = [(call, sent) for call, sent in self._inflight
                          if not any(tp in revoked for tp in sent)]
        self._fetch_addresses = {call: self._fetch_addresses[call] for call, _ in self._inflight
                                 if call in self._fetch_addresses}

    def _assigned(self, added: list[TopicPartition]) -> None:
        for tp in added:
            self._positions[tp] = None  # committed offset, else auto_offset_reset
        if self._listener is not None:
            self._listener.on_partitions_assigned(added)

    def _has_position(self, tp: TopicPartition) -> bool:
        return tp in self._buffer or self._positions.get(tp) is not None

    def _consumed(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Every position, with the leader epoch of the last record poll returned (the next
        owner validates the committed offset with it after a leader change)."""
        return {tp: OffsetAndMetadata(self.position(tp), "", self._consumed_epochs.get(tp, -1))
                for tp in self._positions if self._has_position(tp)}

    def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit or time.monotonic() < self._next_auto_commit_s:
            return
        self._next_auto_commit_s = time.monotonic() + self.auto_commit_interval_ms / 1000
        try:
            self.commit()
        except (CommitFailedError, errors.DeltaBusError) as e:  # the records come again
            log.warning("auto-commit failed: %s", e)

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group and membership, for a transactional producer's
        send_offsets_to_transaction (confluent-kafka's consumer_group_metadata)."""
        if self._group is None:
            raise errors.InvalidConfigError("consumer_group_metadata needs a group_id")
        if self._subscription is None:  # outside group management: no membership to check
            return ConsumerGroupMetadata(self._group.group_id)
        return ConsumerGroupMetadata(self._group.group_id, self._group.generation_id,
                                     self._group.member_id)

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None
               ) -> None:
        """Commit offsets to the group, synchronously: by default the position of every assigned
        partition (everything poll returned counts as processed). Raises CommitFailedError
        when the group has rebalanced meanwhile."""
        if self._group is None:
            raise errors.InvalidConfigError("commit needs a group_id")
        chosen = self._consumed() if offsets is None else {
            TopicPartition(*tp): om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(om)
            for tp, om in offsets.items()}
        if self._subscription is None:  # a consumer outside group management
            self._group.generation_id, self._group.member_id = -1, ""
        self._group.commit(chosen)

    def commit_async(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None,
                     callback: Callable[[dict, BaseException | None], None] | None = None
                     ) -> Future[None]:
        """Commit in the background (the positions now, unless `offsets` says otherwise), in
        call order; the callback (if any) gets the offsets and the error or None, on the
        committing thread. The returned future resolves the same way."""
        chosen: dict[TopicPartition, OffsetAndMetadata | int] = (
            dict(self._consumed()) if offsets is None else dict(offsets))
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="deltabus-commit")

        def run() -> None:
            error: BaseException | None = None
            try:
                self.commit(chosen)
            except errors.DeltaBusError as e:
                error = e
                log.info("async commit failed: %s", e)
            if callback is not None:
                callback(chosen, error)
            if error is not None:
                raise error

        return self._committer.submit(run)

    def committed(self, partitions: TopicPartition | Iterable[TopicPartition]
                  ) -> Any:
        """The group's committed offset of a partition (an OffsetAndMetadata, or None), or a dict
        of them for several partitions."""
        if self._group is None:
            raise errors.InvalidConfigError("committed needs a group_id")
        if isinstance(partitions, TopicPartition):
            return self._group.committed([partitions])[partitions]
        return self._group.committed([TopicPartition(*tp) for tp in partitions])

    def close(self, autocommit: bool = True) -> None:
        """Commit (with auto-commit on), leave the group at once (its partitions move without
        waiting for the session timeout) and release the connections."""
        if self._closed:
            return
        if self._committer is not None:
            self._committer.shutdown(wait=True)  # async commits land before we leave
        if self._group is not None:
            if autocommit and self.enable_auto_commit and self._subscription is not None:
                try:
                    self.commit()
                except errors.DeltaBusError as e:
                    log.warning("the last auto-commit failed: %s", e)
            self._group.close()
        self._closed = True
        for call, _ in self._inflight:
            call.cancel()
        self._inflight = []
        self._client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
