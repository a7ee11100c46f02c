"""The group coordinator: Kafka's classic consumer-group protocol and committed offsets.

Runs in the Spark driver beside the controller, so it lives as long as the cluster and no
executor loss moves it; what it must not forget (committed offsets) is in the `__consumer_offsets`
Delta table (`OffsetStore`). Membership is soft state, as in Kafka after a coordinator moves: a
restarted coordinator answers UNKNOWN_MEMBER_ID and members join again, resuming from their
committed offsets.

Thread-safe: gRPC threads call in; JoinGroup and SyncGroup answer through futures that complete
when the rebalance does. `tick` (called by the coordinator's timer thread) expires sessions, ends
join phases at their deadline and expires old offsets.

Group states and transitions (Kafka's names):

    Empty --join--> PreparingRebalance --all joined / deadline--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable
    Stable / CompletingRebalance --join, leave, session expiry--> PreparingRebalance
    PreparingRebalance --deadline with nobody joined--> Empty

Invariants:
- `generation_id` grows by one with every completed join phase; requests of an older generation
  get ILLEGAL_GENERATION, so a member that missed a rebalance cannot commit or act on a stale
  assignment.
- A commit is acknowledged only once it is durable in `__consumer_offsets`.
- A member waiting in JoinGroup or SyncGroup is never expired: it is in the middle of the protocol.
- What the coordinator keeps is bounded: offsets only for partitions the cluster has (Kafka's
  metadata cache check); at most group.max.groups groups, group.max.size members a group
  (counting member ids handed out) and group.max.pending.members ids handed out in all; a group
  with no members, ids handed out or offsets is dropped. A request past a limit
  (config.GroupConfig, config.GROUP_ID_LENGTH_MAX) is refused before anything is written, and a
  refusal's message never repeats a hostile name, since doors copy it into every partition's
  answer.
- No JoinGroup or SyncGroup waits longer than group.max.rebalance.timeout.ms (and a slack).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

from deltabus import config as cfg
from deltabus import errors
from deltabus.metadata import GroupDescription, MetadataImage
from deltabus.offsets.classic_group import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    ClassicGroup,
    JoinResult,
    Member,
    subscription_topics,
)
from deltabus.offsets.consumer_group import (
    ASSIGNORS,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    UNREVOKED,
    Assignment,
    ConsumerGroup,
    ConsumerMember,
    HeartbeatResult,
)
from deltabus.offsets.group_limits import (
    COMMIT_TIMEOUT_S,
    LONG_POLL_SLACK_S,
    NAME_SHOWN_MAX,
    check_group_id,
    shown,
    wait_result,
)
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetCommit, OffsetStore

log = logging.getLogger(__name__)

# What callers imported from here, still importable from here.
__all__ = [
    "COMMIT_TIMEOUT_S", "COMPLETING_REBALANCE", "DEAD", "EMPTY", "LONG_POLL_SLACK_S",
    "NAME_SHOWN_MAX", "PREPARING_REBALANCE", "STABLE", "GroupCoordinator", "HeartbeatResult",
    "JoinResult", "Member", "PartitionErrors", "subscription_topics", "wait_result",
]

# Each partition's answer to an OffsetCommit: None when committed, else why not.
PartitionErrors = dict[tuple[str, int], errors.DeltaBusError | None]


class GroupCoordinator:
    """Every consumer group of the cluster: membership, rebalances and committed offsets."""

    def __init__(self, store: OffsetStore, config: cfg.GroupConfig,
                 clock: Callable[[], float] = time.monotonic, *,
                 metadata: Callable[[], MetadataImage]) -> None:
        """`metadata`: the cluster's current metadata (Kafka's metadata cache), which says what
        partitions exist; offsets are committed for those only."""
        self._store = store
        self._config = config
        self._clock = clock
        self._metadata = metadata
        self._lock = threading.Lock()
        self._groups: dict[str, ClassicGroup] = {}
        self._consumer_groups: dict[str, ConsumerGroup] = {}  # KIP-848's
        self._next_expiry_check_s = clock() + config.offsets_retention_check_interval_ms / 1000

    # ---- membership ----------------------------------------------------------------------------

    def join_group(self, group_id: str, member_id: str, protocol_type: str,
                   protocols: list[tuple[str, bytes]], *, session_timeout_ms: int,
                   rebalance_timeout_ms: int, client_id: str = "", client_host: str = "",
                   group_instance_id: str | None = None) -> Future[JoinResult]:
        """JoinGroup: the future completes when the join phase ends, with the new generation
        (and, for the leader, every member's metadata to compute the assignment from).

        A static member (`group_instance_id`, KIP-345) that joins again under a new member id
        takes its old place, assignment and all, without a rebalance while the group is
        stable: a restarted consumer gets its partitions back and the others never stop."""
        check_group_id(group_id)
        low = self._config.group_min_session_timeout_ms
        high = self._config.group_max_session_timeout_ms
        if not low <= session_timeout_ms <= high:
            raise errors.InvalidSessionTimeoutError(
                f"session.timeout.ms {session_timeout_ms} is outside [{low}, {high}] "
                "(group.min.session.timeout.ms, group.max.session.timeout.ms)")
        if not protocol_type or not protocols:
            raise errors.InconsistentGroupProtocolError(
                "a member must name its protocol type and at least one protocol")
        rebalance_timeout_ms = self._rebalance_timeout_ms(rebalance_timeout_ms,
                                                          session_timeout_ms)
        future: Future[JoinResult] = Future()
        with self._lock:
            self._check_not_consumer_group(group_id)
            group = self._groups.get(group_id) or self._new_group(group_id)
            now = self._clock()
            leader_before: str | None = None  # a static member's restart: the leader's id
            if group_instance_id and not member_id:
                known = group.static_members.get(group_instance_id)
                group.check_protocols(known or "", protocol_type, protocols)
                member_id = f"{group_instance_id}-{uuid.uuid4()}"
                if known is not None:
                    leader_before = group.leader_id
                    group.replace_static_member(known, member_id)
                else:  # a static member needs no MEMBER_ID_REQUIRED round (KIP-345)
                    self._check_room_for_member(group)
                    group.pending_members[member_id] = now + session_timeout_ms / 1000
            else:
                group.check_protocols(member_id, protocol_type, protocols)
                group.check_instance(member_id, group_instance_id)
            if not member_id:  # Kafka's KIP-394: the member learns its id before it waits
                self._check_room_for_member(group)
                member_id = f"{client_id or 'consumer'}-{uuid.uuid4()}"
                group.pending_members[member_id] = now + session_timeout_ms / 1000
                error = errors.MemberIdRequiredError(
                    f"join group {group_id} again with the member id {member_id}")
                error.member_id = member_id  # type: ignore[attr-defined]
                raise error
            member = self._joining_member(group, member_id, protocol_type, protocols,
                                          session_timeout_ms, rebalance_timeout_ms,
                                          client_id, client_host, now)
            if group_instance_id:
                member.group_instance_id = group_instance_id
                group.static_members[group_instance_id] = member_id
            member.last_heartbeat_s = now
            if leader_before is not None and \
                    group.rejoined_without_rebalance(member, future, leader_before):
                return future
            member.join = future
            if group.state != PREPARING_REBALANCE:
                group.prepare_rebalance(f"member {member_id} joined", now,
                                        self._config.group_initial_rebalance_delay_ms)
            elif group.join_not_before_s > now:  # a new group: wait a little more for others
                group.join_not_before_s = min(
                    now + self._config.group_initial_rebalance_delay_ms / 1000,
                    group.join_deadline_s)
            group.maybe_complete_join(now)
        return future

    def _joining_member(self, group: ClassicGroup, member_id: str, protocol_type: str,
                        protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                        rebalance_timeout_ms: int, client_id: str, client_host: str,
                        now: float) -> Member:
        """Lock held. The member a JoinGroup is for: a known one with its new protocols and
        timeouts, or a new one with an id it was handed."""
        group_id = group.group_id
        if member_id in group.members:
            member = group.members[member_id]
            if member.join is not None and not member.join.done():
                member.join.set_exception(errors.RebalanceInProgressError(
                    "a newer JoinGroup of this member replaced this one"))
            member.protocols, member.session_timeout_ms = protocols, session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
            return member
        if group.pending_members.pop(member_id, None) is None:
            raise errors.UnknownMemberIdError(f"member {member_id} is not in group {group_id}")
        if len(group.members) >= self._config.group_max_size:
            raise errors.GroupMaxSizeReachedError(
                f"group {group_id} has {len(group.members)} members, the most "
                f"group.max.size ({self._config.group_max_size}) allows")
        member = Member(member_id, client_id, client_host, session_timeout_ms,
                        rebalance_timeout_ms, protocol_type, protocols, now)
        group.members[member_id] = member
        if not group.protocol_type:
            group.protocol_type = protocol_type
        return member

    def _rebalance_timeout_ms(self, rebalance_timeout_ms: int, session_timeout_ms: int) -> int:
        """A member's rebalance timeout: as asked (the session timeout if not), up to
        group.max.rebalance.timeout.ms."""
        asked = rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms
        return min(asked, self._config.group_max_rebalance_timeout_ms)

    def join_wait_s(self, rebalance_timeout_ms: int, session_timeout_ms: int) -> float:
        """How long a door waits for a JoinGroup's answer: the member's timeouts, never more
        than group.max.rebalance.timeout.ms (by then the join phase has ended), and a slack."""
        asked = max(rebalance_timeout_ms, session_timeout_ms)
        return min(asked, self._config.group_max_rebalance_timeout_ms) / 1000 + LONG_POLL_SLACK_S

    def _new_group(self, group_id: str) -> ClassicGroup:
        """Lock held. A group the coordinator does not hold in memory yet, unless it holds
        group.max.groups (those with committed offsets count too)."""
        limit = self._config.group_max_groups
        if not self._store.has_group(group_id) and self._group_count() >= limit:
            raise errors.GroupMaxSizeReachedError(
                f"the coordinator holds {self._group_count()} groups, the most "
                f"group.max.groups ({limit}) allows: no new group {group_id}")
        group = self._groups[group_id] = ClassicGroup(group_id)
        return group

    def _group_count(self) -> int:
        """Lock held. Groups with committed offsets, and those in memory only."""
        stored = self._store.group_count()
        if stored + len(self._groups) < self._config.group_max_groups:
            return stored + len(self._groups)  # an upper bound, and room enough
        return stored + sum(1 for g in self._groups if not self._store.has_group(g))

    def _check_room_for_member(self, group: ClassicGroup) -> None:
        """Lock held. Before a member id is handed out: the group stays within group.max.size
        counting the ids handed out, and the ids handed out within group.max.pending.members."""
        size, limit = len(group.members) + len(group.pending_members), self._config.group_max_size
        if size >= limit:
            raise errors.GroupMaxSizeReachedError(
                f"group {group.group_id} has {size} members and member ids handed out, the "
                f"most group.max.size ({limit}) allows")
        pending = sum(len(g.pending_members) for g in self._groups.values())
        if pending >= self._config.group_max_pending_members:
            raise errors.GroupMaxSizeReachedError(
                f"{pending} member ids are handed out and not joined with, the most "
                f"group.max.pending.members ({self._config.group_max_pending_members}) allows")

    def sync_group(self, group_id: str, generation_id: int, member_id: str,
                   assignments: dict[str, bytes],
                   group_instance_id: str | None = None) -> Future[bytes]:
        """SyncGroup: the leader hands in every member's assignment; each member's future
        completes with its own once the leader's has arrived."""
        future: Future[bytes] = Future()
        with self._lock:
            group, member = self._member(group_id, member_id, generation_id, group_instance_id)
            if group.state == PREPARING_REBALANCE:
                raise errors.RebalanceInProgressError(f"group {group_id} is rebalancing")
            if group.state == STABLE:
                future.set_result(member.assignment)
                return future
            member.sync = future
            if member_id == group.leader_id:
                group.assign(assignments)
        return future

    def rebalance_timeout_s(self, group_id: str) -> float:
        """How long a SyncGroup may wait: the longest rebalance timeout of the group's members."""
        with self._lock:
            group = self._groups.get(group_id)
            members = group.members.values() if group is not None else []
            return max((m.rebalance_timeout_ms for m in members), default=0) / 1000

    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> None:
        """Heartbeat: keeps the member's session; REBALANCE_IN_PROGRESS tells it to join again."""
        with self._lock:
            group, member = self._member(group_id, member_id, generation_id, group_instance_id)
            member.last_heartbeat_s = self._clock()
            if group.state == PREPARING_REBALANCE:
                raise errors.RebalanceInProgressError(
                    f"group {group_id} is rebalancing: join again")

    def leave_group(self, group_id: str, member_ids: list[str]) -> None:
        """LeaveGroup: the members go at once, so their partitions move without waiting for
        their sessions to expire."""
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                raise errors.UnknownMemberIdError(f"group {group_id} has no members")
            unknown = [m for m in member_ids if m not in group.members]
            if unknown:
                raise errors.UnknownMemberIdError(
                    f"{unknown} are not members of group {group_id}")
            for member_id in member_ids:
                self._remove_member(group, member_id, "left the group")

    def leave_members(self, group_id: str, members: list[tuple[str, str | None]]
                      ) -> dict[tuple[str, str | None], errors.DeltaBusError | None]:
        """LeaveGroup v3+: each (member id, group instance id) goes, with its own answer. A
        static member named by its instance id alone (no member id: an admin's
        removeMembersFromConsumerGroup) goes whatever its member id; one whose member id is
        not the instance's holder is FENCED_INSTANCE_ID."""
        answers: dict[tuple[str, str | None], errors.DeltaBusError | None] = {}
        with self._lock:
            group = self._groups.get(group_id)
            for key in members:
                member_id, instance_id = key
                try:
                    if group is None:
                        raise errors.UnknownMemberIdError(f"group {group_id} has no members")
                    if instance_id and not member_id:
                        member_id = group.static_members.get(instance_id, "")
                    else:
                        group.check_instance(member_id, instance_id)
                    if member_id not in group.members:
                        raise errors.UnknownMemberIdError(
                            f"{member_id or instance_id} is not a member of group {group_id}")
                    self._remove_member(group, member_id, "left the group")
                    answers[key] = None
                except errors.DeltaBusError as e:
                    answers[key] = e
        return answers

    def _remove_member(self, group: ClassicGroup, member_id: str, why: str) -> None:
        """Lock held."""
        group.remove(member_id, why)
        now = self._clock()
        group.rebalance_after_removal(f"member {member_id} {why}", now,
                                      self._config.group_initial_rebalance_delay_ms)

    def _member(self, group_id: str, member_id: str, generation_id: int,
                group_instance_id: str | None = None) -> tuple[ClassicGroup, Member]:
        """Lock held. The group and member a request names, checked against the member that
        holds its instance id (a static member's) and the generation."""
        group = self._groups.get(group_id)
        if group is not None:
            group.check_instance(member_id, group_instance_id)
        if group is None or member_id not in group.members:
            raise errors.UnknownMemberIdError(f"member {member_id} is not in group {group_id}")
        if generation_id != group.generation_id:
            raise errors.IllegalGenerationError(
                f"generation {generation_id} of group {group_id} is not the current one "
                f"({group.generation_id})")
        return group, group.members[member_id]

    # ---- KIP-848's consumer groups -------------------------------------------------------------

    def consumer_group_heartbeat(
            self, group_id: str, member_id: str, member_epoch: int, *,
            instance_id: str | None = None, rack_id: str | None = None,
            rebalance_timeout_ms: int = -1, subscribed_topic_names: list[str] | None = None,
            server_assignor: str | None = None, owned: Assignment | None = None,
            client_id: str = "", client_host: str = "") -> HeartbeatResult:
        """ConsumerGroupHeartbeat: join (epoch 0), heartbeat, or leave (-1; -2 for a static
        member that comes back); the answer carries the member's next epoch and assignment,
        computed here (the coordinator assigns, not a leader). None of these fields but the
        ids and epoch are sent when unchanged since the last heartbeat, so None keeps them."""
        check_group_id(group_id)
        if server_assignor is not None and server_assignor not in ASSIGNORS:
            raise errors.UnsupportedAssignorError(
                f"the coordinator's assignors are {list(ASSIGNORS)}, not {shown(server_assignor)}")
        interval_ms = self._config.group_consumer_heartbeat_interval_ms
        with self._lock:
            classic = self._groups.get(group_id)
            if classic is not None and classic.members:
                raise errors.InconsistentGroupProtocolError(
                    f"group {group_id} is a classic group with members (JoinGroup)")
            now = self._clock()
            if member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                self._consumer_leave(group_id, member_id, member_epoch, now)
                return HeartbeatResult(member_id, member_epoch, interval_ms, None)
            group, member = self._consumer_member(group_id, member_id, member_epoch,
                                                  instance_id, owned, now)
            before = dict(member.assigned)
            member.last_heartbeat_s = now
            member.client_id, member.client_host = client_id, client_host
            member.rack_id = rack_id if rack_id is not None else member.rack_id
            if rebalance_timeout_ms > 0:
                member.rebalance_timeout_ms = min(
                    rebalance_timeout_ms, self._config.group_max_rebalance_timeout_ms)
            if subscribed_topic_names is not None and \
                    tuple(sorted(set(subscribed_topic_names))) != member.subscribed_topic_names:
                member.subscribed_topic_names = tuple(sorted(set(subscribed_topic_names)))
                group.changed = True
            if server_assignor is not None and server_assignor != member.server_assignor:
                member.server_assignor = server_assignor
                group.changed = True
            image = self._metadata()
            group.refresh_partition_counts(
                lambda t: len(image.topics[t].partitions) if t in image.topics else 0)
            group.update_target()
            group.reconcile(member, owned, now)
            full = member_epoch == 0 or (rebalance_timeout_ms != -1 and owned is not None
                                         and subscribed_topic_names is not None)
            changed = full or member.assigned != before
            return HeartbeatResult(member.member_id, member.member_epoch, interval_ms,
                                   dict(member.assigned) if changed else None)

    def _consumer_member(self, group_id: str, member_id: str, member_epoch: int,
                         instance_id: str | None, owned: Assignment | None,
                         now: float) -> tuple[ConsumerGroup, ConsumerMember]:
        """Lock held. The member a heartbeat is for: a new one (epoch 0), a static member
        taking its place back (epoch 0 and its instance id), or a known one at its epoch."""
        group = self._consumer_groups.get(group_id)
        if member_epoch != 0:
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None or member.left_static:
                raise errors.UnknownMemberIdError(
                    f"member {member_id} is not in consumer group {group_id}")
            group.check_epoch(member, member_epoch, owned)
            return group, member
        if group is None:
            if not self._store.has_group(group_id) and \
                    self._group_count() + len(self._consumer_groups) >= \
                    self._config.group_max_groups:
                raise errors.GroupMaxSizeReachedError(
                    f"the coordinator holds the most groups group.max.groups "
                    f"({self._config.group_max_groups}) allows: no new group {group_id}")
            group = self._consumer_groups[group_id] = ConsumerGroup(group_id)
        member_id = member_id or str(uuid.uuid4())  # v0: the coordinator names new members
        if member_id in group.members:  # a rejoin: it keeps its place (a static one too)
            group.members[member_id].left_static = False
            return group, group.members[member_id]
        if len(group.members) >= self._config.group_max_size:
            raise errors.GroupMaxSizeReachedError(
                f"group {group_id} has the most members group.max.size "
                f"({self._config.group_max_size}) allows")
        member = ConsumerMember(member_id, now, instance_id=instance_id)
        group.add_member(member)
        return group, member

    def _consumer_leave(self, group_id: str, member_id: str, member_epoch: int,
                        now: float) -> None:
        """Lock held. A member leaves (epoch -1) and its partitions go to others; a static
        member that will come back (-2) keeps them for its session timeout."""
        group = self._consumer_groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            raise errors.UnknownMemberIdError(
                f"member {member_id} is not in consumer group {group_id}")
        if member_epoch == STATIC_LEAVE_EPOCH and member.instance_id:
            member.left_static, member.last_heartbeat_s = True, now
            return
        group.fence(member, "left the group")

    def _expire_consumers(self, now: float) -> None:
        """Lock held. Members silent past group.consumer.session.timeout.ms, and those that
        did not revoke partitions within their rebalance timeout, are fenced; empty groups
        without committed offsets go."""
        session_s = self._config.group_consumer_session_timeout_ms / 1000
        for group in list(self._consumer_groups.values()):
            for member in list(group.members.values()):
                if now - member.last_heartbeat_s > session_s:
                    group.fence(member, "missed its session timeout")
                elif member.state == UNREVOKED and now > member.revoke_deadline_s:
                    group.fence(member, "did not revoke its partitions in time")
            if not group.members and not self._store.has_group(group.group_id):
                del self._consumer_groups[group.group_id]

    def describe_consumer_group(self, group_id: str) -> ConsumerGroup:
        """ConsumerGroupDescribe: a copy of a KIP-848 group (GROUP_ID_NOT_FOUND for any other,
        a classic group included, as Kafka answers)."""
        check_group_id(group_id)
        with self._lock:
            group = self._consumer_groups.get(group_id)
            if group is None:
                raise errors.GroupIdNotFoundError(f"group {group_id} is not a consumer group")
            return copy.deepcopy(group)

    def _check_not_consumer_group(self, group_id: str) -> None:
        """Lock held. A classic request to a KIP-848 group with members is refused."""
        group = self._consumer_groups.get(group_id)
        if group is not None and group.members:
            raise errors.InconsistentGroupProtocolError(
                f"group {group_id} is a consumer group (ConsumerGroupHeartbeat) with members")

    # ---- offsets -------------------------------------------------------------------------------

    def check_offset_commit(self, group_id: str, partitions: int) -> None:
        """The limits of a whole OffsetCommit: its group id, and how many partitions it names.
        Doors call this before anything else, so a request past them costs nothing more."""
        check_group_id(group_id)
        limit = self._config.offset_commit_partitions_max
        if partitions > limit:
            raise errors.InvalidRequestError(
                f"an OffsetCommit names {partitions} partitions, more than the "
                f"{limit} of offset.commit.partitions.max")

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                       offsets: dict[tuple[str, int], OffsetAndMetadata],
                       group_instance_id: str | None = None) -> Future[PartitionErrors]:
        """OffsetCommit: members of the current generation, or a standalone consumer
        (generation -1, no member id) while the group has no members. Resolves once durable,
        with each partition's answer: partitions the cluster does not have get
        UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers them, and are not written."""
        self.check_offset_commit(group_id, len(offsets))
        for (topic, partition), om in offsets.items():
            if om.offset < 0 or partition < 0:
                raise errors.InvalidCommitOffsetSizeError(
                    f"cannot commit offset {om.offset} of {shown(topic)}-{partition}")
        unknown = _unknown_partitions(self._metadata(), list(offsets))
        known = {tp: om for tp, om in offsets.items() if tp not in unknown}
        answers: PartitionErrors = {**dict.fromkeys(known), **unknown}
        if offsets and not known:  # Kafka asks the coordinator nothing: no group is made
            return _resolved(answers)
        with self._lock:
            consumers = self._consumer_groups.get(group_id)
            group = self._groups.get(group_id)
            if consumers is not None and (consumers.members or member_id):
                consumers.validate_offset_commit(member_id, generation_id, self._clock())
            elif generation_id < 0 and not member_id:
                if group is not None and group.members:
                    raise errors.UnknownMemberIdError(
                        f"group {group_id} has active members: a consumer outside it cannot "
                        "commit its offsets")
            else:
                group, member = self._member(group_id, member_id, generation_id,
                                             group_instance_id)
                if group.state == COMPLETING_REBALANCE:
                    raise errors.RebalanceInProgressError(
                        f"group {group_id} is completing a rebalance")
                member.last_heartbeat_s = self._clock()
            if group is None and consumers is None:
                self._new_group(group_id)
        now_ms = int(time.time() * 1000)
        stored = self._store.commit([
            OffsetCommit(group_id, topic, partition,
                         OffsetAndMetadata(om.offset, om.leader_epoch, om.metadata, now_ms),
                         member_id, generation_id)
            for (topic, partition), om in known.items()])
        return _once_stored(stored, answers)

    def check_txn_offset_commit(self, group_id: str, member_id: str, generation_id: int,
                                group_instance_id: str | None = None) -> None:
        """TxnOffsetCommit's check of the consumer that sent it (KIP-447), as Kafka's: a member
        id the group does not have is UNKNOWN_MEMBER_ID, a generation (>= 0) not the group's
        ILLEGAL_GENERATION, a replaced static member FENCED_INSTANCE_ID; a producer that names
        no member (generation -1, "") is not checked. A zombie consumer's producer cannot
        commit offsets for partitions the group gave to another member since."""
        check_group_id(group_id)
        with self._lock:
            consumers = self._consumer_groups.get(group_id)
            if consumers is not None and member_id:  # KIP-848: the generation is the epoch
                consumers.validate_offset_commit(member_id, generation_id, self._clock())
                return
            group = self._groups.get(group_id)
            if group is not None:
                group.check_instance(member_id, group_instance_id)
            if member_id and (group is None or member_id not in group.members):
                raise errors.UnknownMemberIdError(f"member {member_id} is not in group {group_id}")
            if generation_id >= 0 and generation_id != (group.generation_id if group else -1):
                raise errors.IllegalGenerationError(
                    f"generation {generation_id} of group {group_id} is not the current one")

    def commit_transactional_offsets(self, group_id: str,
                                     offsets: dict[tuple[str, int], OffsetAndMetadata]
                                     ) -> Future[None]:
        """A committed transaction's offsets (TxnOffsetCommit) become the group's committed
        offsets, whatever its members and generation now: the transaction coordinator checked
        the producer when it took them, as Kafka's group coordinator materializes them on the
        commit marker. Resolves once durable."""
        now_ms = int(time.time() * 1000)
        return self._store.commit([
            OffsetCommit(group_id, topic, partition,
                         OffsetAndMetadata(om.offset, om.leader_epoch, om.metadata, now_ms))
            for (topic, partition), om in offsets.items()])

    def fetch_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], OffsetAndMetadata]:
        """OffsetFetch: the committed offsets of a group (all, or of these partitions)."""
        check_group_id(group_id)
        committed = self._store.offsets(group_id)
        if partitions is None:
            return committed
        return {tp: committed[tp] for tp in partitions if tp in committed}

    # ---- administration ------------------------------------------------------------------------

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group, with members or offsets."""
        with self._lock:
            known = {g.group_id: (g.group_id, g.protocol_type or "consumer", g.state)
                     for g in self._groups.values()}
            known |= {g.group_id: (g.group_id, "consumer", g.state)
                      for g in self._consumer_groups.values()}
        for group_id in self._store.groups():
            known.setdefault(group_id, (group_id, "consumer", EMPTY))
        return sorted(known.values())

    def describe_group(self, group_id: str) -> GroupDescription:
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                state = EMPTY if group_id in self._store.groups() else DEAD
                return GroupDescription(group_id, state, "", "", -1, "", [])
            return group.description()

    def delete_groups(self, group_ids: list[str]) -> dict[str, errors.DeltaBusError | None]:
        """DeleteGroups: only empty groups (NON_EMPTY_GROUP otherwise); their offsets go too."""
        results: dict[str, errors.DeltaBusError | None] = {}
        stored = set(self._store.groups())
        for group_id in group_ids:
            with self._lock:
                group = self._groups.get(group_id)
                if group is None and group_id not in stored:
                    results[group_id] = errors.GroupIdNotFoundError(
                        f"group {group_id} does not exist")
                    continue
                if group is not None and group.members:
                    results[group_id] = errors.NonEmptyGroupError(
                        f"group {group_id} has {len(group.members)} active members")
                    continue
                self._groups.pop(group_id, None)
            try:
                self._store.delete_group(group_id).result()
                results[group_id] = None
            except errors.DeltaBusError as e:
                results[group_id] = e
        return results

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]
                       ) -> PartitionErrors:
        """OffsetDelete (kafka-consumer-groups.sh --delete-offsets): tombstones in
        `__consumer_offsets` for the named partitions' committed offsets, durable before it
        returns, but for topics the group's members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC:
        they would commit them again). Raises GROUP_ID_NOT_FOUND for a group with neither
        members nor offsets, and NON_EMPTY_GROUP for one whose members are not consumers
        (their subscriptions cannot be read), as Kafka's coordinator."""
        self.check_offset_commit(group_id, len(partitions))
        with self._lock:
            group = self._groups.get(group_id)
            if group is None and not self._store.has_group(group_id):
                raise errors.GroupIdNotFoundError(f"group {group_id} does not exist")
            subscribed = group.subscribed_topics() if group is not None else set()
        committed = self._store.offsets(group_id)
        topics = self._metadata().topics
        answers: PartitionErrors = {}
        tombstones = []
        for topic, partition in partitions:
            if topic not in topics:  # as Kafka's KafkaApis, from its metadata cache
                answers[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                    f"unknown topic {shown(topic)}")
            elif subscribed is None or topic in subscribed:
                answers[(topic, partition)] = errors.GroupSubscribedToTopicError(
                    f"group {group_id} has members subscribed to {shown(topic)}")
            else:
                answers[(topic, partition)] = None
                if (topic, partition) in committed:
                    tombstones.append(OffsetCommit(group_id, topic, partition, None))
        wait_result(self._store.commit(tombstones), COMMIT_TIMEOUT_S)
        return answers

    # ---- time ----------------------------------------------------------------------------------

    def tick(self) -> None:
        """Expire silent members and unused member ids, end join phases at their deadline, drop
        empty groups, expire old offsets."""
        now = self._clock()
        with self._lock:
            self._expire_members(now)
            self._expire_consumers(now)
            self._drop_empty_groups()
        if now >= self._next_expiry_check_s:
            self._next_expiry_check_s = now + \
                self._config.offsets_retention_check_interval_ms / 1000
            self.expire_offsets()

    def _expire_members(self, now: float) -> None:
        """Lock held. Member ids handed out and not used within their session timeout, and
        members silent past theirs, go; join phases past their deadline end."""
        for group in list(self._groups.values()):
            for member_id, expiry in list(group.pending_members.items()):
                if now > expiry:  # handed an id, never came back with it
                    del group.pending_members[member_id]
            for member in list(group.members.values()):
                waiting = member.join is not None or member.sync is not None
                if not waiting and \
                        now - member.last_heartbeat_s > member.session_timeout_ms / 1000:
                    log.info("group %s: member %s missed heartbeats past "
                             "session.timeout.ms; removed", group.group_id, member.member_id)
                    self._remove_member(group, member.member_id,
                                        "missed heartbeats past session.timeout.ms")
            group.maybe_complete_join(now)

    def _drop_empty_groups(self) -> None:
        """Lock held. A group with no members, no member ids handed out and no committed
        offsets is gone (Kafka's cleanup of such groups): it no longer counts toward
        group.max.groups, so ids asked for and never used do not take up room for ever."""
        empty = [g.group_id for g in self._groups.values()
                 if g.state == EMPTY and not g.members and not g.pending_members]
        for group_id in empty:
            if not self._store.has_group(group_id):
                del self._groups[group_id]

    def expire_offsets(self) -> list[str]:
        """Drop the offsets of groups empty (and not committing) for offsets.retention.minutes.
        Returns the groups whose offsets expired."""
        retention_s = self._config.offsets_retention_minutes * 60
        now = time.time()
        expired = []
        for group_id in self._store.groups():
            with self._lock:
                group = self._groups.get(group_id)
                consumers = self._consumer_groups.get(group_id)
                if group is not None and group.members or consumers is not None and \
                        consumers.members:
                    continue
                idle_since = max(self._store.last_commit_ms(group_id) / 1000,
                                 group.empty_since_s if group is not None else 0.0)
                if now - idle_since <= retention_s:
                    continue
                self._groups.pop(group_id, None)
            self._store.delete_group(group_id).result()
            expired.append(group_id)
            log.info("offsets of group %s expired (offsets.retention.minutes)", group_id)
        return expired

    def close(self) -> None:
        """Fail every waiting member (the coordinator is going away) and flush the store."""
        with self._lock:
            for group in self._groups.values():
                for member in group.members.values():
                    for waiter in (member.join, member.sync):
                        if waiter is not None and not waiter.done():
                            waiter.set_exception(errors.CoordinatorNotAvailableError(
                                "the group coordinator is shutting down"))
        self._store.close()






def _unknown_partitions(image: MetadataImage, partitions: list[tuple[str, int]]
                        ) -> dict[tuple[str, int], errors.DeltaBusError]:
    """UNKNOWN_TOPIC_OR_PARTITION for each partition `image` does not have, as Kafka's
    KafkaApis answers an OffsetCommit from its metadata cache."""
    unknown: dict[tuple[str, int], errors.DeltaBusError] = {}
    for topic, partition in partitions:
        if image.partition(topic, partition) is not None:
            continue
        if len(topic) > cfg.TOPIC_NAME_LENGTH_MAX:
            unknown[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                f"a topic name has at most {cfg.TOPIC_NAME_LENGTH_MAX} characters, not "
                f"{len(topic)}")
        else:
            unknown[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                f"This server does not host this topic-partition: {topic}-{partition}")
    return unknown


def _resolved(answers: PartitionErrors) -> Future[PartitionErrors]:
    future: Future[PartitionErrors] = Future()
    future.set_result(answers)
    return future


def _once_stored(stored: Future[None], answers: PartitionErrors) -> Future[PartitionErrors]:
    """`answers` once the store's future resolves; its failure if it fails."""
    future: Future[PartitionErrors] = Future()

    def done(f: Future[None]) -> None:
        if f.cancelled():
            future.set_exception(errors.KafkaStorageError("the offset commit was cancelled"))
        elif f.exception() is not None:
            future.set_exception(f.exception())
        else:
            future.set_result(answers)

    stored.add_done_callback(done)
    return future



