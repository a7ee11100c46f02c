"""Group membership for both protocols: Kafka's GroupMetadataManager.

Holds every group in memory, classic (`ClassicGroup`: JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) and KIP-848's (`ConsumerGroup`: ConsumerGroupHeartbeat), and applies the
coordinator's limits before a group or member is made. Separate from the offsets
(`OffsetMetadataManager`) as in Kafka: membership is soft state, what a restarted coordinator
forgets (members join again and get UNKNOWN_MEMBER_ID meanwhile), while committed offsets are
durable. It reads `__consumer_offsets` only to know which groups have committed offsets: those
count toward group.max.groups and are not dropped when empty.

Runs in the driver. Thread-safe through the coordinator's lock, shared with the
`OffsetMetadataManager` and passed in: a public method without "Lock held" takes it; one with
"Lock held" expects the caller to hold it (the offset manager looks groups up and checks
commits with it held, so a check and the state it checked never come apart).

Invariants:
- What the coordinator keeps is bounded: at most group.max.groups groups, group.max.size members
  a group (counting member ids handed out) and group.max.pending.members ids handed out in all; a
  group with no members, ids handed out or offsets is dropped. A request past a limit
  (config.GroupConfig, config.GROUP_ID_LENGTH_MAX) is refused before anything changes.
- A group id is of one protocol while it has members: a classic request to a consumer group
  with members, or the reverse, is INCONSISTENT_GROUP_PROTOCOL.
- A member waiting in JoinGroup or SyncGroup is never expired: it is in the middle of the protocol.
"""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future

from deltabus import config as cfg
from deltabus import errors
from deltabus.metadata import GroupDescription, MetadataImage
from deltabus.offsets.classic_group import (
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    ClassicGroup,
    JoinResult,
    Member,
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
from deltabus.offsets.group_limits import LONG_POLL_SLACK_S, check_group_id, shown
from deltabus.offsets.offset_store import OffsetStore

log = logging.getLogger(__name__)


class GroupMetadataManager:
    """Every group's membership, both protocols; in the driver, thread-safe with `lock`."""

    def __init__(self, store: OffsetStore, config: cfg.GroupConfig, clock: Callable[[], float],
                 metadata: Callable[[], MetadataImage], lock: threading.Lock) -> None:
        """`store` is read only (which groups have committed offsets); `metadata` gives the
        partition counts KIP-848's assignors spread; `lock` is the coordinator's."""
        self._store = store
        self._config = config
        self._clock = clock
        self._metadata = metadata
        self._lock = lock
        self._groups: dict[str, ClassicGroup] = {}
        self._consumer_groups: dict[str, ConsumerGroup] = {}  # KIP-848's
        # Whether a group id is a share group's (lock held): set by the coordinator.
        self.is_share_group: Callable[[str], bool] = lambda group_id: False

    # ---- lookups for the offset manager (lock held) --------------------------------------------

    def classic_group(self, group_id: str) -> ClassicGroup | None:
        """Lock held."""
        return self._groups.get(group_id)

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        """Lock held."""
        return self._consumer_groups.get(group_id)

    def remove_classic_group(self, group_id: str) -> None:
        """Lock held. The group is forgotten (deleted, or its offsets expired)."""
        self._groups.pop(group_id, None)

    # ---- classic groups: JoinGroup -------------------------------------------------------------

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
            group = self._groups.get(group_id) or self.new_group(group_id)
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

    # ---- classic groups: the limits ------------------------------------------------------------

    def new_group(self, group_id: str) -> ClassicGroup:
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

    # ---- classic groups: SyncGroup, Heartbeat, LeaveGroup --------------------------------------

    def sync_group(self, group_id: str, generation_id: int, member_id: str,
                   assignments: dict[str, bytes],
                   group_instance_id: str | None = None) -> Future[bytes]:
        """SyncGroup: the leader hands in every member's assignment; each member's future
        completes with its own once the leader's has arrived."""
        future: Future[bytes] = Future()
        with self._lock:
            group, member = self.member(group_id, member_id, generation_id, group_instance_id)
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
            group, member = self.member(group_id, member_id, generation_id, group_instance_id)
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

    def member(self, group_id: str, member_id: str, generation_id: int,
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
            self._check_not_share_group(group_id)
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

    def describe_consumer_group(self, group_id: str) -> ConsumerGroup:
        """ConsumerGroupDescribe: a copy of a KIP-848 group (GROUP_ID_NOT_FOUND for any other,
        a classic group included, as Kafka answers)."""
        check_group_id(group_id)
        with self._lock:
            group = self._consumer_groups.get(group_id)
            if group is None:
                raise errors.GroupIdNotFoundError(f"group {group_id} is not a consumer group")
            return copy.deepcopy(group)

    def has_group(self, group_id: str) -> bool:
        """Lock held. Whether the id is a classic or consumer group's (with members or
        committed offsets), so no share group may take it."""
        return (group_id in self._groups or group_id in self._consumer_groups
                or self._store.has_group(group_id))

    def group_count(self) -> int:
        """Lock held. The classic and consumer groups kept, toward group.max.groups."""
        return self._group_count() + len(self._consumer_groups)

    def _check_not_share_group(self, group_id: str) -> None:
        """Lock held. A consumer group's request for a share group's id is refused."""
        if self.is_share_group(group_id):
            raise errors.InconsistentGroupProtocolError(
                f"group {group_id} is a share group (ShareGroupHeartbeat)")

    def _check_not_consumer_group(self, group_id: str) -> None:
        """Lock held. A classic request to a KIP-848 group with members is refused."""
        self._check_not_share_group(group_id)
        group = self._consumer_groups.get(group_id)
        if group is not None and group.members:
            raise errors.InconsistentGroupProtocolError(
                f"group {group_id} is a consumer group (ConsumerGroupHeartbeat) with members")

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
        """DescribeGroups: a classic group as it is now; one known only by its committed
        offsets is Empty, any other Dead."""
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                state = EMPTY if group_id in self._store.groups() else DEAD
                return GroupDescription(group_id, state, "", "", -1, "", [])
            return group.description()

    # ---- time ----------------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """The timer's turn: silent members and unused member ids go, join phases end at their
        deadline, empty groups are dropped."""
        with self._lock:
            self._expire_members(now)
            self._expire_consumers(now)
            self._drop_empty_groups()

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

    def _drop_empty_groups(self) -> None:
        """Lock held. A group with no members, no member ids handed out and no committed
        offsets is gone (Kafka's cleanup of such groups): it no longer counts toward
        group.max.groups, so ids asked for and never used do not take up room for ever."""
        empty = [g.group_id for g in self._groups.values()
                 if g.state == EMPTY and not g.members and not g.pending_members]
        for group_id in empty:
            if not self._store.has_group(group_id):
                del self._groups[group_id]

    def close(self) -> None:
        """Fail every waiting member: the coordinator is going away."""
        with self._lock:
            for group in self._groups.values():
                for member in group.members.values():
                    for waiter in (member.join, member.sync):
                        if waiter is not None and not waiter.done():
                            waiter.set_exception(errors.CoordinatorNotAvailableError(
                                "the group coordinator is shutting down"))
