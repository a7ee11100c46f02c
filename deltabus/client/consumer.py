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

Split as Kafka's client is: the positions and what was fetched ahead of them live in a
`SubscriptionState`, resets, offset lookups and position validation in the `OffsetFetcher`, the
fetches in the `Fetcher`, the group in the `ConsumerCoordinator`; this class is the public API
over them, and the group's rebalances and commits.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Unpack

import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
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
from deltabus.client.fetcher import Fetcher
from deltabus.client.offset_fetcher import OffsetFetcher
from deltabus.client.security import ClientSecurity, SecuritySettings
from deltabus.client.subscription_state import SubscriptionState
from deltabus.metadata import MetadataImage
from deltabus.records import ConsumerRecord

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
        default_api_timeout_ms: int = cfg.DEFAULT_API_TIMEOUT_MS,
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
        `poll_batch` keeps the bytes. `default_api_timeout_ms`: how long `commit` retries
        retriable errors when its call gives no timeout (Kafka's default.api.timeout.ms)."""
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise errors.InvalidConfigError(
                f"auto_offset_reset must be earliest, latest or none, not {auto_offset_reset!r}")
        if isolation_level not in ISOLATION_LEVELS:
            raise errors.InvalidConfigError(
                "isolation_level must be read_uncommitted or read_committed, not "
                f"{isolation_level!r}")
        if default_api_timeout_ms < 0:
            raise errors.InvalidConfigError(
                f"default_api_timeout_ms must not be negative: {default_api_timeout_ms}")
        self.default_api_timeout_ms = default_api_timeout_ms
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
        # Positions, their leader epochs and what was fetched ahead of them (Kafka's
        # SubscriptionState); resets, offset lookups and validation (OffsetFetcher); fetches.
        self._assignment = SubscriptionState()
        self._offsets = OffsetFetcher(self._client, self._assignment, self._group,
                                      auto_offset_reset=auto_offset_reset,
                                      isolation=self._isolation)
        self._fetcher = Fetcher(
            self._client, self._assignment, self._offsets, fetch_max_wait_ms=fetch_max_wait_ms,
            fetch_min_bytes=fetch_min_bytes, fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes, isolation=self._isolation,
            auto_offset_reset=auto_offset_reset,
            deserializers=(key_deserializer, value_deserializer))
        self._closed = False

    @property
    def _throttled_until(self) -> dict[str, float]:
        """Broker address -> when its throttle ends (the fetcher's; tests look at it)."""
        return self._fetcher.throttled_until

    # ---- assignment and positions ------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join the consumer group for these topics (or every topic matching `pattern`); the
        group assigns the partitions, at the next poll. Needs a group_id."""
        if self._group is None:
            raise errors.InvalidConfigError("subscribe needs a group_id: use assign() without one")
        if self._subscription is None and self._assignment.positions:
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
            self._revoke(sorted(self._assignment.positions))
            self._group.leave()
        self._subscription = None
        self._assignment.positions = {}
        self._assignment.buffer.clear()

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions (replacing any earlier assignment)."""
        if self._subscription is not None:
            raise errors.ClientError("Subscription to topics, partitions and pattern are "
                                     "mutually exclusive: this consumer has subscribe()d")
        wanted = [TopicPartition(*tp) for tp in partitions]
        # Named, so a topic this user may not describe fails as Kafka's consumer does
        # (TOPIC_AUTHORIZATION_FAILED), not as a topic that does not exist.
        image = self._client.refresh_metadata(sorted({tp.topic for tp in wanted}))
        for tp in wanted:
            if image.partition(tp.topic, tp.partition) is None:
                raise errors.UnknownTopicOrPartitionError(
                    f"{tp.topic}-{tp.partition} does not exist")
        self._assignment.positions = {tp: self._assignment.positions.get(tp) for tp in wanted}
        self._assignment.buffer = collections.OrderedDict(
            (tp, t) for tp, t in self._assignment.buffer.items()
            if tp in self._assignment.positions)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment.positions)

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
        if tp not in self._assignment.positions:
            raise errors.ClientError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return tp

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        tp = self._check_assigned(partition)  # type: ignore[arg-type]
        if offset < 0:
            raise errors.ClientError(f"seek offset must not be negative: {offset}")
        self._assignment.set_position(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, -2)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, -1)

    def _seek_to(self, partitions: Iterable[TopicPartition], timestamp: int) -> None:
        tps = [self._check_assigned(tp) for tp in partitions] or list(self._assignment.positions)
        for tp, offset in self._offsets.list_offsets(tps, timestamp).items():
            self._assignment.set_position(tp, offset)

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record poll will return for this partition."""
        tp = self._check_assigned(partition)  # type: ignore[arg-type]
        buffered = self._assignment.buffer.get(tp)
        if buffered is not None:  # fetched ahead, not yet returned by poll
            return int(buffered.column("offset")[0].as_py())
        if self._assignment.positions[tp] is None:
            self._offsets.reset([tp])
        position = self._assignment.positions[tp]
        assert position is not None
        return position

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets.list_offsets([TopicPartition(*tp) for tp in partitions], -2)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets.list_offsets([TopicPartition(*tp) for tp in partitions], -1)

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The earliest offset whose timestamp is at or after the given ms (-1 when none)."""
        out = {}
        for tp, ts in timestamps.items():
            out.update(self._offsets.list_offsets([TopicPartition(*tp)], ts))
        return out

    # ---- polling -----------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Up to max_poll_records records, in offset order per partition; waits up to timeout_ms
        for the first one."""
        limit = max_records or self.max_poll_records
        epochs = dict(self._assignment.consumed_epochs)
        taken = list(self._take(limit, timeout_ms).items())
        return self._fetcher.records(taken, epochs)

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
            if not self._assignment.positions:  # nothing assigned (members outnumber partitions)
                time.sleep(max(0.0, min(deadline - time.monotonic(), 0.1)))
                return {}
        elif not self._assignment.positions:
            raise errors.ClientError("no partitions assigned: call assign() or subscribe() first")
        return self._fetcher.collect(limit, deadline)

    # ---- groups: rebalances and commits ---------------------------------------------------------

    def _revoke(self, revoked: list[TopicPartition]) -> None:
        """Before partitions go: auto-commit what was consumed, let the listener commit."""
        if self.enable_auto_commit:
            try:
                gone = set(revoked)
                self._commit({tp: om for tp, om in self._consumed().items() if tp in gone})
            except (CommitFailedError, errors.DeltaBusError) as e:
                log.warning("auto-commit before a rebalance failed: %s", e)
        if self._listener is not None:
            self._listener.on_partitions_revoked(revoked)
        for tp in revoked:
            self._assignment.positions.pop(tp, None)
            self._assignment.buffer.pop(tp, None)
        self._fetcher.forget(revoked)

    def _assigned(self, added: list[TopicPartition]) -> None:
        for tp in added:
            self._assignment.positions[tp] = None  # committed offset, else auto_offset_reset
        if self._listener is not None:
            self._listener.on_partitions_assigned(added)

    def _consumed(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Every position, with the leader epoch of the last record poll returned (the next
        owner validates the committed offset with it after a leader change)."""
        return {tp: OffsetAndMetadata(self.position(tp), "",
                                      self._assignment.consumed_epochs.get(tp, -1))
                for tp in self._assignment.positions if self._assignment.has_position(tp)}

    def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit or time.monotonic() < self._next_auto_commit_s:
            return
        self._next_auto_commit_s = time.monotonic() + self.auto_commit_interval_ms / 1000
        try:
            self._commit(None)
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

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None,
               timeout_ms: int | None = None) -> None:
        """Commit offsets to the group, synchronously (Kafka's commitSync): by default the
        position of every assigned partition (everything poll returned counts as processed).
        A retriable error (the coordinator moved or is loading, a timeout, a failed call) is
        tried again every retry_backoff_ms, the coordinator looked up again where it may have
        moved, until `timeout_ms` (default: default_api_timeout_ms) runs out; then
        KafkaTimeoutError. Raises CommitFailedError at once when the group has rebalanced
        meanwhile, and any other error that is not retriable at once."""
        if timeout_ms is not None and timeout_ms < 0:
            raise errors.ClientError(f"The timeout cannot be negative: {timeout_ms}")
        self._commit(offsets, self.default_api_timeout_ms if timeout_ms is None else timeout_ms)

    def _commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None,
                timeout_ms: int | None = None) -> None:
        """`commit`'s work; `timeout_ms` None: one try (commit_async, auto-commit)."""
        if self._group is None:
            raise errors.InvalidConfigError("commit needs a group_id")
        chosen = self._consumed() if offsets is None else {
            TopicPartition(*tp): om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(om)
            for tp, om in offsets.items()}
        if self._subscription is None:  # a consumer outside group management
            self._group.generation_id, self._group.member_id = -1, ""
        self._group.commit(chosen, timeout_ms)

    def commit_async(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None,
                     callback: Callable[[dict, BaseException | None], None] | None = None
                     ) -> Future[None]:
        """Commit in the background (the positions now, unless `offsets` says otherwise), in
        call order, each with one try as Kafka's commitAsync (no retries: a later commit carries
        the offsets on). The callback (if any) gets the offsets and the error or None, on the
        committing thread. The returned future resolves the same way."""
        chosen: dict[TopicPartition, OffsetAndMetadata | int] = (
            dict(self._consumed()) if offsets is None else dict(offsets))
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="deltabus-commit")

        def run() -> None:
            error: BaseException | None = None
            try:
                self._commit(chosen)
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
                    self._commit(None)
                except errors.DeltaBusError as e:
                    log.warning("the last auto-commit failed: %s", e)
            self._group.close()
        self._closed = True
        self._fetcher.close()
        self._client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
