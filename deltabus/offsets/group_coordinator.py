"""The group coordinator: Kafka's consumer-group protocols and committed offsets, one door.

Runs in the Spark driver beside the controller, so it lives as long as the cluster and no
executor loss moves it; what it must not forget (committed offsets) is in the `__consumer_offsets`
Delta table (`OffsetStore`). Membership is soft state, as in Kafka after a coordinator moves: a
restarted coordinator answers UNKNOWN_MEMBER_ID and members join again, resuming from their
committed offsets.

Split as Kafka's group coordinator is: `GroupCoordinator` here is the front the doors call, and
routes each request to
- `GroupMetadataManager` (group_metadata_manager.py): membership for both protocols, the classic
  one (JoinGroup, SyncGroup, Heartbeat, LeaveGroup; each group a `ClassicGroup`, classic_group.py,
  that owns its join/sync state machine) and KIP-848's (ConsumerGroupHeartbeat; each group a
  `ConsumerGroup`, consumer_group.py);
- `OffsetMetadataManager` (offset_metadata_manager.py): OffsetCommit, transactional offsets,
  OffsetFetch, OffsetDelete and the expiry of offsets.
What spans both (DeleteGroups, the timer's `tick`, `close`) stays here, as in Kafka's
GroupCoordinatorShard. The limits every request is held to are in group_limits.py.

Thread-safe: gRPC threads call in; one lock, made here and shared by both managers, guards every
group, as the single coordinator lock did before the split; nothing waits on Delta while holding
it. JoinGroup and SyncGroup answer through futures that complete when the rebalance does. `tick`
(called by the coordinator's timer thread) expires sessions, ends join phases at their deadline
and expires old offsets.

Invariants (each module states its own in full):
- `generation_id` grows by one with every completed join phase; requests of an older generation
  get ILLEGAL_GENERATION, so a member that missed a rebalance cannot commit or act on a stale
  assignment.
- A commit is acknowledged only once it is durable in `__consumer_offsets`.
- What the coordinator keeps is bounded (group.max.groups, group.max.size,
  group.max.pending.members, offsets only for partitions the cluster has), and a request past a
  limit is refused before anything is written.
- No JoinGroup or SyncGroup waits longer than group.max.rebalance.timeout.ms (and a slack).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from deltabus import config as cfg
from deltabus import errors
from deltabus.metadata import GroupDescription, MetadataImage
from deltabus.offsets.classic_group import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    JoinResult,
    Member,
    subscription_topics,
)
from deltabus.offsets.consumer_group import Assignment, ConsumerGroup, HeartbeatResult
from deltabus.offsets.group_limits import (
    COMMIT_TIMEOUT_S,
    LONG_POLL_SLACK_S,
    NAME_SHOWN_MAX,
    check_group_id,
    wait_result,
)
from deltabus.offsets.group_metadata_manager import GroupMetadataManager
from deltabus.offsets.offset_metadata_manager import OffsetMetadataManager, PartitionErrors
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetStore
from deltabus.offsets.share_group import ShareGroup, ShareGroupManager, ShareHeartbeatResult
from deltabus.offsets.share_state_store import ACKNOWLEDGED, ARCHIVED, ShareStateStore

# What callers imported from here before the split, still importable from here.
__all__ = [
    "COMMIT_TIMEOUT_S", "COMPLETING_REBALANCE", "DEAD", "EMPTY", "LONG_POLL_SLACK_S",
    "NAME_SHOWN_MAX", "PREPARING_REBALANCE", "STABLE", "GroupCoordinator", "HeartbeatResult",
    "JoinResult", "Member", "PartitionErrors", "subscription_topics", "wait_result",
]


@dataclass(frozen=True)
class ShareOffset:
    """A share group's place in a partition (DescribeShareGroupOffsets)."""

    start_offset: int  # -1: the group never started the partition
    leader_epoch: int
    lag: int  # -1: not known


SHARE_PROTOCOL = "share"  # ListGroups' protocol and group type of a share group
EMPTY_SHARE = "Empty"


class GroupCoordinator:
    """Every consumer group of the cluster: membership, rebalances and committed offsets. In
    the driver; thread-safe."""

    def __init__(self, store: OffsetStore, config: cfg.GroupConfig,
                 clock: Callable[[], float] = time.monotonic, *,
                 metadata: Callable[[], MetadataImage],
                 share_state: ShareStateStore | None = None,
                 high_watermarks: Callable[[], dict[tuple[str, int], int]] = dict) -> None:
        """`metadata`: the cluster's current metadata (Kafka's metadata cache), which says what
        partitions exist; offsets are committed for those only. `share_state`: the share
        groups' `__share_group_state`, which the partitions' leaders write through the driver
        (None: no share group has durable state, as in tests of other groups);
        `high_watermarks`: what the leaders last reported, for share groups' lag."""
        self._store = store
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()  # the managers' one lock
        self._groups = GroupMetadataManager(store, config, clock, metadata, self._lock)
        self._offsets = OffsetMetadataManager(store, config, clock, metadata, self._lock,
                                              self._groups)
        self.share_state = share_state
        self._metadata = metadata
        self._high_watermarks = high_watermarks
        self._shares = ShareGroupManager(config, clock, metadata, self._lock,
                                         other_kind=self._groups.has_group,
                                         group_count=self._groups.group_count)
        self._groups.is_share_group = lambda g: self._shares.share_group(g) is not None
        self._next_expiry_check_s = clock() + config.offsets_retention_check_interval_ms / 1000

    # ---- membership: GroupMetadataManager ------------------------------------------------------

    def join_group(self, group_id: str, member_id: str, protocol_type: str,
                   protocols: list[tuple[str, bytes]], *, session_timeout_ms: int,
                   rebalance_timeout_ms: int, client_id: str = "", client_host: str = "",
                   group_instance_id: str | None = None) -> Future[JoinResult]:
        """JoinGroup: the future completes when the join phase ends, with the new generation
        (and, for the leader, every member's metadata); see GroupMetadataManager.join_group."""
        return self._groups.join_group(
            group_id, member_id, protocol_type, protocols,
            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            client_id=client_id, client_host=client_host, group_instance_id=group_instance_id)

    def join_wait_s(self, rebalance_timeout_ms: int, session_timeout_ms: int) -> float:
        """How long a door waits for a JoinGroup's answer."""
        return self._groups.join_wait_s(rebalance_timeout_ms, session_timeout_ms)

    def sync_group(self, group_id: str, generation_id: int, member_id: str,
                   assignments: dict[str, bytes],
                   group_instance_id: str | None = None) -> Future[bytes]:
        """SyncGroup: each member's future completes with its assignment once the leader's
        SyncGroup has handed them in."""
        return self._groups.sync_group(group_id, generation_id, member_id, assignments,
                                       group_instance_id)

    def rebalance_timeout_s(self, group_id: str) -> float:
        """How long a SyncGroup may wait: the longest rebalance timeout of the group's members."""
        return self._groups.rebalance_timeout_s(group_id)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> None:
        """Heartbeat: keeps the member's session; REBALANCE_IN_PROGRESS tells it to join again."""
        self._groups.heartbeat(group_id, generation_id, member_id, group_instance_id)

    def leave_group(self, group_id: str, member_ids: list[str]) -> None:
        """LeaveGroup: the members go at once."""
        self._groups.leave_group(group_id, member_ids)

    def leave_members(self, group_id: str, members: list[tuple[str, str | None]]
                      ) -> dict[tuple[str, str | None], errors.DeltaBusError | None]:
        """LeaveGroup v3+: each (member id, group instance id) goes, with its own answer."""
        return self._groups.leave_members(group_id, members)

    def consumer_group_heartbeat(
            self, group_id: str, member_id: str, member_epoch: int, *,
            instance_id: str | None = None, rack_id: str | None = None,
            rebalance_timeout_ms: int = -1, subscribed_topic_names: list[str] | None = None,
            server_assignor: str | None = None, owned: Assignment | None = None,
            client_id: str = "", client_host: str = "") -> HeartbeatResult:
        """ConsumerGroupHeartbeat (KIP-848): join (epoch 0), heartbeat, or leave (-1, -2); the
        answer carries the member's next epoch and the assignment the coordinator computed."""
        return self._groups.consumer_group_heartbeat(
            group_id, member_id, member_epoch, instance_id=instance_id, rack_id=rack_id,
            rebalance_timeout_ms=rebalance_timeout_ms,
            subscribed_topic_names=subscribed_topic_names, server_assignor=server_assignor,
            owned=owned, client_id=client_id, client_host=client_host)

    def describe_consumer_group(self, group_id: str) -> ConsumerGroup:
        """ConsumerGroupDescribe: a copy of a KIP-848 group."""
        return self._groups.describe_consumer_group(group_id)

    # ---- share groups (KIP-932): ShareGroupManager ------------------------------------------

    def share_group_heartbeat(self, group_id: str, member_id: str, member_epoch: int, *,
                              rack_id: str | None = None,
                              subscribed_topic_names: list[str] | None = None,
                              client_id: str = "", client_host: str = ""
                              ) -> ShareHeartbeatResult:
        """ShareGroupHeartbeat: join (epoch 0), heartbeat, or leave (-1); the answer carries
        the member's epoch and, when it changed, its assignment."""
        return self._shares.heartbeat(group_id, member_id, member_epoch, rack_id=rack_id,
                                      subscribed_topic_names=subscribed_topic_names,
                                      client_id=client_id, client_host=client_host)

    def describe_share_group(self, group_id: str) -> ShareGroup:
        """ShareGroupDescribe: a copy of a share group."""
        return self._shares.describe(group_id)

    def share_groups(self) -> list[tuple[str, str]]:
        """(group id, state) of every share group: with members, or with state in
        `__share_group_state` (Empty)."""
        known = dict(self._shares.groups())
        for group_id in self.share_state.groups() if self.share_state is not None else ():
            known.setdefault(group_id, EMPTY_SHARE)
        return sorted(known.items())

    def describe_share_group_offsets(self, group_id: str,
                                     partitions: list[tuple[str, int]] | None = None
                                     ) -> dict[tuple[str, int], ShareOffset]:
        """DescribeShareGroupOffsets: where the group is in each partition it started (all, or
        these: a partition it never started has start offset -1). Lag counts the records
        past the start offset not yet acknowledged or archived, to the high watermark the
        partition's leader last reported (-1 where none did yet)."""
        check_group_id(group_id)
        states = self.share_state.states(group_id) if self.share_state is not None else {}
        watermarks = self._high_watermarks()
        asked = sorted(states) if partitions is None else partitions
        offsets = {}
        for tp in asked:
            state = states.get(tp)
            if state is None:
                offsets[tp] = ShareOffset(-1, -1, -1)
                continue
            done = sum(b.last_offset - b.first_offset + 1 for b in state.batches
                       if b.delivery_state in (ACKNOWLEDGED, ARCHIVED))
            hw = watermarks.get(tp)
            lag = -1 if hw is None else max(0, hw - state.start_offset - done)
            offsets[tp] = ShareOffset(state.start_offset, state.leader_epoch, lag)
        return offsets

    def alter_share_group_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]
                                  ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """AlterShareGroupOffsets: the group (it must have no members: NON_EMPTY_GROUP) starts
        over at these offsets, nothing in flight. A partition the cluster does not have is
        UNKNOWN_TOPIC_OR_PARTITION; durable before it returns."""
        check_group_id(group_id)
        store = self._share_store()
        with self._lock:
            if self._groups.has_group(group_id):
                raise errors.GroupIdNotFoundError(f"group {group_id} is not a share group")
            group = self._shares.share_group(group_id)
            if group is not None and group.members:
                raise errors.NonEmptyGroupError(
                    f"share group {group_id} has {len(group.members)} active members")
        image = self._metadata()
        results: dict[tuple[str, int], errors.DeltaBusError | None] = {}
        written = {}
        for (topic, partition), offset in offsets.items():
            state = image.topics.get(topic)
            if state is None or not 0 <= partition < len(state.partitions):
                results[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                    f"{topic}-{partition} does not exist")
            elif offset < 0:
                results[(topic, partition)] = errors.InvalidRequestError(
                    f"{topic}-{partition}: start offset {offset} is negative")
            else:
                written[(topic, partition)] = store.alter(group_id, topic, partition, offset)
        for tp, future in written.items():
            try:
                future.result(COMMIT_TIMEOUT_S)
                results[tp] = None
            except errors.DeltaBusError as e:
                results[tp] = e
        return results

    def delete_share_group_offsets(self, group_id: str, topics: list[str]
                                   ) -> dict[str, errors.DeltaBusError | None]:
        """DeleteShareGroupOffsets: the group's state in every partition of these topics goes
        (it starts again by share.auto.offset.reset). The group must exist
        (GROUP_ID_NOT_FOUND) and have no members (NON_EMPTY_GROUP); a topic with no state is
        UNKNOWN_TOPIC_OR_PARTITION."""
        check_group_id(group_id)
        store = self._share_store()
        if not self.is_share_group(group_id):
            raise errors.GroupIdNotFoundError(f"Group {group_id} not found.")
        with self._lock:
            group = self._shares.share_group(group_id)
            if group is not None and group.members:
                raise errors.NonEmptyGroupError(
                    f"share group {group_id} has {len(group.members)} active members")
        started = {t for t, _ in store.states(group_id)}
        results: dict[str, errors.DeltaBusError | None] = {
            t: None if t in started else errors.UnknownTopicOrPartitionError(
                "There is no offset information to delete.") for t in topics}
        doomed = [tp for tp in store.states(group_id) if tp[0] in topics]
        if doomed:
            try:
                store.delete(group_id, doomed).result(COMMIT_TIMEOUT_S)
            except errors.DeltaBusError as e:
                results.update({t: e for t in {t for t, _ in doomed}})
        return results

    def _share_store(self) -> ShareStateStore:
        if self.share_state is None:
            raise errors.CoordinatorNotAvailableError("share groups have no state store here")
        return self.share_state

    def is_share_group(self, group_id: str) -> bool:
        with self._lock:
            if self._shares.share_group(group_id) is not None:
                return True
        return self.share_state is not None and bool(self.share_state.states(group_id))

    # ---- offsets: OffsetMetadataManager --------------------------------------------------------

    def check_offset_commit(self, group_id: str, partitions: int) -> None:
        """The limits of a whole OffsetCommit, which doors check before anything else."""
        self._offsets.check_offset_commit(group_id, partitions)

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                       offsets: dict[tuple[str, int], OffsetAndMetadata],
                       group_instance_id: str | None = None) -> Future[PartitionErrors]:
        """OffsetCommit: resolves once durable, with each partition's answer."""
        return self._offsets.commit_offsets(group_id, generation_id, member_id, offsets,
                                            group_instance_id)

    def check_txn_offset_commit(self, group_id: str, member_id: str, generation_id: int,
                                group_instance_id: str | None = None) -> None:
        """TxnOffsetCommit's check of the consumer that sent it (KIP-447)."""
        self._offsets.check_txn_offset_commit(group_id, member_id, generation_id,
                                              group_instance_id)

    def commit_transactional_offsets(self, group_id: str,
                                     offsets: dict[tuple[str, int], OffsetAndMetadata]
                                     ) -> Future[None]:
        """A committed transaction's offsets become the group's; resolves once durable."""
        return self._offsets.commit_transactional_offsets(group_id, offsets)

    def fetch_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], OffsetAndMetadata]:
        """OffsetFetch: the committed offsets of a group (all, or of these partitions)."""
        return self._offsets.fetch_offsets(group_id, partitions)

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]
                       ) -> PartitionErrors:
        """OffsetDelete: the named partitions' committed offsets go, but for subscribed
        topics; durable before it returns."""
        return self._offsets.delete_offsets(group_id, partitions)

    def expire_offsets(self) -> list[str]:
        """Drop the offsets of groups empty (and not committing) for offsets.retention.minutes.
        Returns the groups whose offsets expired."""
        return self._offsets.expire_offsets()

    # ---- administration ------------------------------------------------------------------------

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group, with members or offsets; share
        groups' protocol type is "share"."""
        return sorted(self._groups.list_groups()
                      + [(g, SHARE_PROTOCOL, state) for g, state in self.share_groups()])

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups: a classic group as it is now."""
        return self._groups.describe_group(group_id)

    def delete_groups(self, group_ids: list[str]) -> dict[str, errors.DeltaBusError | None]:
        """DeleteGroups: only empty groups (NON_EMPTY_GROUP otherwise); their offsets go too.
        Here, not in a manager, because it ends both a group and its offsets."""
        results: dict[str, errors.DeltaBusError | None] = {}
        stored = set(self._store.groups())
        for group_id in group_ids:
            if self.is_share_group(group_id):
                results[group_id] = self._delete_share_group(group_id)
                continue
            with self._lock:
                group = self._groups.classic_group(group_id)
                if group is None and group_id not in stored:
                    results[group_id] = errors.GroupIdNotFoundError(
                        f"group {group_id} does not exist")
                    continue
                if group is not None and group.members:
                    results[group_id] = errors.NonEmptyGroupError(
                        f"group {group_id} has {len(group.members)} active members")
                    continue
                self._groups.remove_classic_group(group_id)
            try:
                self._store.delete_group(group_id).result()
                results[group_id] = None
            except errors.DeltaBusError as e:
                results[group_id] = e
        return results

    def _delete_share_group(self, group_id: str) -> errors.DeltaBusError | None:
        """An empty share group goes with its state in every partition."""
        with self._lock:
            group = self._shares.share_group(group_id)
            if group is not None and group.members:
                return errors.NonEmptyGroupError(
                    f"share group {group_id} has {len(group.members)} active members")
        try:
            if self.share_state is not None:
                self.share_state.delete(group_id).result(COMMIT_TIMEOUT_S)
        except errors.DeltaBusError as e:
            return e
        with self._lock:
            self._shares.forget(group_id)
        return None

    # ---- time ----------------------------------------------------------------------------------

    def tick(self) -> None:
        """Expire silent members and unused member ids, end join phases at their deadline, drop
        empty groups, expire old offsets."""
        now = self._clock()
        self._groups.expire(now)
        with self._lock:
            self._shares.expire(now)
        if now >= self._next_expiry_check_s:
            self._next_expiry_check_s = now + \
                self._config.offsets_retention_check_interval_ms / 1000
            self.expire_offsets()

    def close(self) -> None:
        """Fail every waiting member (the coordinator is going away) and flush the store."""
        self._groups.close()
        self._store.close()
        if self.share_state is not None:
            self.share_state.close()
