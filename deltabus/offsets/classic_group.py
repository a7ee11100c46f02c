"""Kafka's classic groups (JoinGroup, SyncGroup, Heartbeat, LeaveGroup): one group's state machine.

Separate from the managers as Kafka's `ClassicGroup` is: the group owns its members, generation,
chosen protocol and the join/sync phases, and the rules that move it between states need nothing
but the group itself and the time. The `GroupMetadataManager` finds groups, applies the
coordinator's limits and calls in; it holds the coordinator's lock while it does, so this state
is not thread-safe by itself. Runs in the driver.

States and transitions (Kafka's names):

    Empty --join--> PreparingRebalance --all joined / deadline--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable
    Stable / CompletingRebalance --join, leave, session expiry--> PreparingRebalance
    PreparingRebalance --deadline with nobody joined--> Empty

Invariants:
- `generation_id` grows by one with every completed join phase; requests of an older generation
  get ILLEGAL_GENERATION, so a member that missed a rebalance cannot act on a stale assignment.
- A member waiting in JoinGroup or SyncGroup is never expired: it is in the middle of the protocol.
- A static member's instance id is held by one member id at a time (`static_members`); a request
  from an older holder is FENCED_INSTANCE_ID.
"""

from __future__ import annotations

import collections
import logging
import struct
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from deltabus import errors
from deltabus.metadata import GroupDescription, MemberDescription
from deltabus.offsets.group_limits import shown

log = logging.getLogger(__name__)

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"


@dataclass
class Member:
    """One member of a group, as the coordinator knows it."""

    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (assignor name, subscription metadata), by preference
    last_heartbeat_s: float
    assignment: bytes = b""
    join: Future[JoinResult] | None = None  # waiting in JoinGroup
    sync: Future[bytes] | None = None  # waiting in SyncGroup
    group_instance_id: str | None = None  # a static member's (KIP-345)

    def metadata(self, protocol: str) -> bytes:
        return next(m for name, m in self.protocols if name == protocol)


@dataclass(frozen=True)
class JoinResult:
    generation_id: int
    protocol_name: str
    leader_id: str
    member_id: str
    members: list[tuple[str, bytes]]  # (member id, metadata): only the leader gets them
    # The static members among them: member id -> group instance id.
    instance_ids: dict[str, str] = field(default_factory=dict)


@dataclass
class ClassicGroup:
    """A classic group: its members, generation, protocol and join/sync phases. Not
    thread-safe: the coordinator's lock is held around every call."""

    group_id: str
    state: str = EMPTY
    generation_id: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader_id: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    join_deadline_s: float = 0.0  # the join phase ends by then, joined or not
    join_not_before_s: float = 0.0  # a new group's first join phase waits for more members
    empty_since_s: float = field(default_factory=time.time)
    # Member ids handed out with MEMBER_ID_REQUIRED, not joined yet: id -> expiry time.
    pending_members: dict[str, float] = field(default_factory=dict)
    # Static members: group.instance.id -> the member id that holds it now.
    static_members: dict[str, str] = field(default_factory=dict)

    # ---- checks of a request against the group -------------------------------------------------

    def check_instance(self, member_id: str, group_instance_id: str | None) -> None:
        """A request of a static member must come from the member that holds its instance id
        now: an older one (replaced by a restart) is FENCED_INSTANCE_ID."""
        if not group_instance_id:
            return
        holder = self.static_members.get(group_instance_id)
        if holder is None:
            if member_id and member_id not in self.members \
                    and member_id not in self.pending_members:
                raise errors.UnknownMemberIdError(
                    f"member {member_id} is not in group {self.group_id}")
            return
        if holder != member_id:
            raise errors.FencedInstanceIdError(
                f"instance id {group_instance_id} of group {self.group_id} belongs to a "
                f"newer member than {member_id}")

    def check_protocols(self, member_id: str, protocol_type: str,
                        protocols: list[tuple[str, bytes]]) -> None:
        """A joining member must share the group's protocol type and at least one assignor
        with every other member (INCONSISTENT_GROUP_PROTOCOL), or no protocol could be chosen."""
        others = [m for mid, m in self.members.items() if mid != member_id]
        if not others:
            return
        if protocol_type != self.protocol_type:
            raise errors.InconsistentGroupProtocolError(
                f"group {self.group_id} uses protocol type {self.protocol_type}, "
                f"not {protocol_type}")
        names = {name for name, _ in protocols}
        if not all(names & {name for name, _ in m.protocols} for m in others):
            raise errors.InconsistentGroupProtocolError(
                f"none of the assignors {sorted(names)} is supported by every member of group "
                f"{self.group_id}")

    # ---- static members ------------------------------------------------------------------------

    def replace_static_member(self, old_id: str, new_id: str) -> None:
        """A static member joined again without its member id (a restart): the member it
        replaces keeps its place under `new_id`, and whatever still uses `old_id` is fenced
        (FENCED_INSTANCE_ID), as Kafka's replaceStaticMember does."""
        member = self.members.pop(old_id)
        for waiter in (member.join, member.sync):
            if waiter is not None and not waiter.done():
                waiter.set_exception(errors.FencedInstanceIdError(
                    f"member {old_id} was replaced by a newer member with instance id "
                    f"{member.group_instance_id}"))
        member.join = member.sync = None
        member.member_id = new_id
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        log.info("group %s: static member %s rejoined as %s", self.group_id,
                 member.group_instance_id, new_id)

    def rejoined_without_rebalance(self, member: Member, future: Future[JoinResult],
                                   leader_before: str) -> bool:
        """A static member that took its old place in a stable group, without changing the
        protocol the group would choose, gets the current generation at once and its old
        assignment at SyncGroup; a leader is told the old leader id, so that it does not assign
        again (Kafka's updateStaticMemberAndRebalance, before KIP-814's skipAssignment).
        Elsewhere, the group rebalances as for any join."""
        if self.state != STABLE or \
                _choose_protocol(list(self.members.values())) != self.protocol_name:
            return False
        future.set_result(JoinResult(self.generation_id, self.protocol_name, leader_before,
                                     member.member_id, []))
        return True

    # ---- the join and sync phases --------------------------------------------------------------

    def prepare_rebalance(self, why: str, now: float, initial_rebalance_delay_ms: int) -> None:
        """Start a join phase: members must join again by the deadline; an empty group's first
        one waits group.initial.rebalance.delay.ms for more members."""
        for member in self.members.values():  # a sync in flight belongs to a dead generation
            if member.sync is not None and not member.sync.done():
                member.sync.set_exception(errors.RebalanceInProgressError(
                    f"group {self.group_id} is rebalancing: {why}"))
            member.sync = None
        timeout_s = max((m.rebalance_timeout_ms for m in self.members.values()), default=0) / 1000
        self.join_deadline_s = now + timeout_s
        self.join_not_before_s = 0.0
        if self.state == EMPTY:  # Kafka's group.initial.rebalance.delay.ms
            self.join_not_before_s = min(
                now + initial_rebalance_delay_ms / 1000, self.join_deadline_s)
        log.info("group %s rebalancing (generation %d): %s", self.group_id,
                 self.generation_id, why)
        self.state = PREPARING_REBALANCE

    def maybe_complete_join(self, now: float) -> None:
        """End the join phase once every member has joined, or at its deadline (members that
        did not join by then are out)."""
        if self.state != PREPARING_REBALANCE or now < self.join_not_before_s:
            return
        waiting = [m for m in self.members.values() if m.join is None]
        if waiting and now < self.join_deadline_s:
            return
        for member in waiting:
            log.info("group %s: member %s did not join in time; removed", self.group_id,
                     member.member_id)
            del self.members[member.member_id]
        self.generation_id += 1
        if not self.members:
            self.become_empty()
            return
        self.protocol_name = _choose_protocol(list(self.members.values()))
        if self.leader_id not in self.members:
            self.leader_id = next(iter(self.members))
        self.state = COMPLETING_REBALANCE
        everyone = [(m.member_id, m.metadata(self.protocol_name))
                    for m in self.members.values()]
        instance_ids = {m.member_id: m.group_instance_id for m in self.members.values()
                        if m.group_instance_id}
        log.info("group %s generation %d: %d members, protocol %s, leader %s", self.group_id,
                 self.generation_id, len(self.members), self.protocol_name, self.leader_id)
        for member in self.members.values():
            member.assignment = b""
            member.last_heartbeat_s = now
            join, member.join = member.join, None
            assert join is not None
            leader = member.member_id == self.leader_id
            join.set_result(JoinResult(
                self.generation_id, self.protocol_name, self.leader_id, member.member_id,
                everyone if leader else [], instance_ids if leader else {}))

    def become_empty(self) -> None:
        """No members left: nothing of the last generation's protocol stays, and the offsets'
        retention (offsets.retention.minutes) counts from now."""
        self.state = EMPTY
        self.protocol_name = self.leader_id = ""
        self.protocol_type = ""
        self.empty_since_s = time.time()
        log.info("group %s is empty (generation %d)", self.group_id, self.generation_id)

    def assign(self, assignments: dict[str, bytes]) -> None:
        """The leader's SyncGroup: every member's assignment (empty for one the leader left
        out); the group is stable and every member waiting in SyncGroup gets its own."""
        for mid, m in self.members.items():
            m.assignment = assignments.get(mid, b"")
        self.state = STABLE
        log.info("group %s generation %d is stable", self.group_id, self.generation_id)
        for m in self.members.values():
            if m.sync is not None:
                m.sync.set_result(m.assignment)
                m.sync = None

    # ---- members leaving -----------------------------------------------------------------------

    def remove(self, member_id: str, why: str) -> None:
        """The member is out (left, or its session expired): its instance id is free and
        whatever it waits for fails with UNKNOWN_MEMBER_ID."""
        member = self.members.pop(member_id)
        if member.group_instance_id and \
                self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        for waiter in (member.join, member.sync):
            if waiter is not None and not waiter.done():
                waiter.set_exception(errors.UnknownMemberIdError(f"member {member_id} {why}"))

    def rebalance_after_removal(self, why: str, now: float,
                                initial_rebalance_delay_ms: int) -> None:
        """After `remove`: a group that had an assignment rebalances (or, with nobody left,
        becomes empty in a new generation); a join phase may now be complete."""
        if self.state in (STABLE, COMPLETING_REBALANCE):
            if self.members:
                self.prepare_rebalance(why, now, initial_rebalance_delay_ms)
            else:
                self.generation_id += 1
                self.become_empty()
        self.maybe_complete_join(now)

    # ---- what others read ----------------------------------------------------------------------

    def subscribed_topics(self) -> set[str] | None:
        """The topics the group's members subscribe to (their JoinGroup metadata); None when a
        member's cannot be read: every topic counts as subscribed then, as Kafka's classic
        groups answer. NON_EMPTY_GROUP for members of another protocol than consumer."""
        topics: set[str] = set()
        for member in self.members.values():
            if member.protocol_type != "consumer":
                raise errors.NonEmptyGroupError(
                    f"group {self.group_id} has {len(self.members)} members of protocol "
                    f"{shown(member.protocol_type)}")
            for _, metadata in member.protocols:
                named = subscription_topics(metadata)
                if named is None:
                    return None
                topics.update(named)
        return topics

    def description(self) -> GroupDescription:
        """The group as DescribeGroups answers it: assignments only once stable."""
        members = [MemberDescription(
            m.member_id, m.client_id, m.client_host,
            m.metadata(self.protocol_name) if self.protocol_name else b"",
            m.assignment if self.state == STABLE else b"", m.group_instance_id)
            for m in self.members.values()]
        return GroupDescription(self.group_id, self.state, self.protocol_type,
                                self.protocol_name, self.generation_id, self.leader_id,
                                members)


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a ConsumerProtocolSubscription (every version opens with its version and
    topic list), None when it is malformed."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos, topics = 6, []
        for _ in range(count):  # each takes 2 bytes at least: the data bounds the loop
            (size,) = struct.unpack_from(">h", metadata, pos)
            if size < 0 or pos + 2 + size > len(metadata):
                return None
            topics.append(metadata[pos + 2:pos + 2 + size].decode())
            pos += 2 + size
    except (struct.error, UnicodeDecodeError):
        return None
    return topics


def _choose_protocol(members: list[Member]) -> str:
    """Kafka's vote: among the protocols every member supports, each member votes for the one it
    prefers most; the most votes wins (ties go to the first member's preference)."""
    common = set.intersection(*({name for name, _ in m.protocols} for m in members))
    votes: collections.Counter[str] = collections.Counter()
    for m in members:
        votes[next(name for name, _ in m.protocols if name in common)] += 1
    first = [name for name, _ in members[0].protocols if name in common]
    return max(first, key=lambda name: (votes[name], -first.index(name)))
