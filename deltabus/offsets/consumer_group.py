"""KIP-848's consumer groups (ConsumerGroupHeartbeat): the coordinator assigns partitions.

Pure state, driven by the GroupMetadataManager under the coordinator's lock (not thread-safe by
itself): a group owns its members and epochs, and the moves between them (a member joining or
taking a static member's place back, a member fenced, a commit checked against its epoch). Each
group has a group epoch, bumped whenever membership, a subscription or the partition count of
a subscribed topic changes; a target assignment, computed by a server assignor (`uniform` or
`range`) for the group epoch; and members that each move toward their target one step at a
time (Kafka's CurrentAssignmentBuilder):

    member's partitions not in its target --> revoked first: the member keeps its epoch
        (UNREVOKED_PARTITIONS) until a heartbeat shows it no longer owns them
    then --> the member takes the target's epoch and the target's partitions that no other
        member still holds (UNRELEASED_PARTITIONS until they are all free), else STABLE

Invariants:
- A partition is held (assigned or waiting to be revoked) by at most one member: a member is
  only given partitions nobody else holds, so two consumers never read one partition at once.
- A member's epoch never exceeds the group's target assignment epoch; a request with an epoch
  the coordinator does not hold for the member is FENCED_MEMBER_EPOCH (or UNKNOWN_MEMBER_ID for
  a member it does not have): the consumer drops its partitions and joins again with epoch 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from deltabus import errors

log = logging.getLogger(__name__)

STABLE, UNREVOKED, UNRELEASED = "STABLE", "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS"
ASSIGNORS = ("uniform", "range")  # Kafka's group.consumer.assignors; the first is the default
LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2

Assignment = dict[str, frozenset[int]]  # topic -> partitions


@dataclass(frozen=True)
class HeartbeatResult:
    """ConsumerGroupHeartbeat's answer: the member's epoch and, when it changed or the member
    sent a full request, its assignment."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None


@dataclass
class ConsumerMember:
    """One member of a consumer group."""

    member_id: str
    last_heartbeat_s: float
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    server_assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: str = STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    revoke_deadline_s: float = 0.0  # fenced if it still holds `revoking` by then
    left_static: bool = False  # a static member gone for now (epoch -2): keeps its partitions


@dataclass
class ConsumerGroup:
    """A group of KIP-848 members: epochs, subscriptions, the target assignment."""

    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Assignment] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)  # of subscribed topics
    changed: bool = False  # within one heartbeat: the group epoch is bumped once at its end

    @property
    def state(self) -> str:
        """Kafka's consumer group states: Empty, Assigning, Reconciling, Stable."""
        if not self.members:
            return "Empty"
        if self.assignment_epoch < self.group_epoch:
            return "Assigning"
        if any(m.member_epoch != self.assignment_epoch or m.state != STABLE
               for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def assignor(self) -> str:
        """The server assignor most members ask for (Kafka's choice), else the default."""
        asked = [m.server_assignor for m in self.members.values() if m.server_assignor]
        return max(ASSIGNORS, key=lambda a: (asked.count(a), -ASSIGNORS.index(a)))

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topic_names}

    def refresh_partition_counts(self, counts: Callable[[str], int]) -> None:
        """Bump the group epoch when a subscribed topic's partition count changed (it was
        created, deleted or grew), so the target assignment covers its partitions."""
        now = {t: counts(t) for t in sorted(self.subscribed_topics())}
        if now != self.partition_counts:
            self.partition_counts = now
            self.changed = True

    def update_target(self) -> None:
        """A new group epoch if this heartbeat changed the group, and a new target assignment
        for the group epoch, if it has none yet."""
        if self.changed:
            self.group_epoch, self.changed = self.group_epoch + 1, False
        if self.assignment_epoch == self.group_epoch:
            return
        subs = {mid: set(m.subscribed_topic_names) for mid, m in self.members.items()}
        assign = range_assign if self.assignor() == "range" else uniform_assign
        self.target = assign(subs, self.partition_counts, self.target)
        self.assignment_epoch = self.group_epoch

    def holder(self, topic: str, partition: int, besides: str) -> str | None:
        """The member other than `besides` that holds a partition (assigned or revoking)."""
        for mid, m in self.members.items():
            if mid != besides and (partition in m.assigned.get(topic, ())
                                   or partition in m.revoking.get(topic, ())):
                return mid
        return None

    def reconcile(self, member: ConsumerMember, owned: Assignment | None, now: float) -> None:
        """One step of a member toward its target (`owned`: what its heartbeat says it owns,
        None when it did not say)."""
        if member.state == UNREVOKED:
            if owned is None or _overlap(owned, member.revoking):
                return
            member.revoking = {}
        if member.member_epoch == self.assignment_epoch and member.state == STABLE:
            return
        target = self.target.get(member.member_id, {})
        kept = _intersect(member.assigned, target)
        revoke = _minus(member.assigned, target)
        if revoke:
            member.assigned, member.revoking, member.state = kept, revoke, UNREVOKED
            member.revoke_deadline_s = now + member.rebalance_timeout_ms / 1000
            return
        free = {t: frozenset(p for p in ps - kept.get(t, frozenset())
                             if self.holder(t, p, member.member_id) is None)
                for t, ps in target.items()}
        member.assigned = {t: ps for t, ps in _union(kept, free).items() if ps}
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        member.state = STABLE if member.assigned == {t: ps for t, ps in target.items() if ps} \
            else UNRELEASED

    def add_member(self, member: ConsumerMember) -> None:
        """A new member joins (epoch 0): a new group epoch, unless it is a static member that
        comes back (its instance id held by a member gone with epoch -2), which takes that
        member's place, epoch and partitions without a rebalance. UNRELEASED_INSTANCE_ID while
        the instance id's holder is live."""
        member_id, instance_id = member.member_id, member.instance_id
        holder = self.static_members.get(instance_id) if instance_id else None
        if holder is not None:
            old = self.members[holder]
            if not old.left_static:
                raise errors.UnreleasedInstanceIdError(
                    f"instance id {instance_id} is held by live member {holder}")
            del self.members[holder]  # the static member is back: same epoch, same partitions
            member.member_epoch, member.previous_member_epoch = old.member_epoch, -1
            member.assigned, member.revoking, member.state = old.assigned, old.revoking, old.state
            member.subscribed_topic_names = old.subscribed_topic_names
            member.server_assignor = old.server_assignor
            self.target[member_id] = self.target.pop(holder, {})
        else:
            self.changed = True
        if instance_id:
            self.static_members[instance_id] = member_id
        self.members[member_id] = member
        log.info("consumer group %s: member %s joined (group epoch %d)", self.group_id,
                 member_id, self.group_epoch)

    def fence(self, member: ConsumerMember, why: str) -> None:
        """The member is out; its partitions go to others in a new group epoch."""
        del self.members[member.member_id]
        self.target.pop(member.member_id, None)
        if member.instance_id and self.static_members.get(member.instance_id) == \
                member.member_id:
            del self.static_members[member.instance_id]
        self.group_epoch += 1
        log.info("consumer group %s: member %s %s (group epoch %d)", self.group_id,
                 member.member_id, why, self.group_epoch)

    def validate_offset_commit(self, member_id: str, member_epoch: int, now: float) -> None:
        """An OffsetCommit to the group: from a member at its epoch (v9's generation field
        carries it), or from outside (epoch -1, no member id) while empty. A member's commit
        counts as a heartbeat."""
        if member_epoch < 0 and not member_id:
            if self.members:
                raise errors.UnknownMemberIdError(
                    f"group {self.group_id} has active members: a consumer outside it cannot "
                    "commit its offsets")
            return
        member = self.members.get(member_id)
        if member is None:
            raise errors.UnknownMemberIdError(
                f"member {member_id} is not in consumer group {self.group_id}")
        if member_epoch > member.member_epoch:
            raise errors.FencedMemberEpochError(
                f"member {member_id} is at epoch {member.member_epoch}, not {member_epoch}")
        if member_epoch < member.member_epoch:
            raise errors.StaleMemberEpochError(
                f"member {member_id} is at epoch {member.member_epoch}, not {member_epoch}")
        member.last_heartbeat_s = now

    def check_epoch(self, member: ConsumerMember, epoch: int, owned: Assignment | None) -> None:
        """A heartbeat's epoch against the member's (Kafka's throwIfMemberEpochIsInvalid): the
        previous epoch is allowed when the member owns nothing it was not given (its last
        answer was lost)."""
        if epoch == member.member_epoch:
            return
        if epoch == member.previous_member_epoch and epoch < member.member_epoch and \
                owned is not None and not _minus(owned, member.assigned):
            return
        raise errors.FencedMemberEpochError(
            f"member {member.member_id} of group {self.group_id} is at epoch "
            f"{member.member_epoch}, not {epoch}: join again with epoch 0")


def uniform_assign(subs: dict[str, set[str]], counts: dict[str, int],
                   previous: dict[str, Assignment]) -> dict[str, Assignment]:
    """Kafka's `uniform` assignor: every member gets as many partitions as it can (of the
    topics it subscribes to), within one of each other, and keeps as many of its previous
    ones as that allows (sticky), so few partitions move."""
    members = sorted(subs)
    total = sum(counts.get(t, 0) for t in {t for s in subs.values() for t in s})
    quota = total // len(members) if members else 0
    out: dict[str, dict[str, set[int]]] = {m: {} for m in members}
    size = dict.fromkeys(members, 0)
    taken: set[tuple[str, int]] = set()
    for m in members:  # keep previous partitions, up to the lower quota
        for t, ps in sorted(previous.get(m, {}).items()):
            for p in sorted(ps):
                if t in subs[m] and p < counts.get(t, 0) and size[m] < quota:
                    out[m].setdefault(t, set()).add(p)
                    size[m] += 1
                    taken.add((t, p))
    owner = {(t, p): m for m, a in previous.items() for t, ps in a.items() for p in ps}
    for t in sorted({t for s in subs.values() for t in s}):
        for p in range(counts.get(t, 0)):
            eligible = [m for m in members if t in subs[m]]
            if (t, p) in taken or not eligible:
                continue
            best = min(eligible, key=lambda m: (size[m], owner.get((t, p)) != m, m))
            out[best].setdefault(t, set()).add(p)
            size[best] += 1
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in out.items()}


def range_assign(subs: dict[str, set[str]], counts: dict[str, int],
                 previous: dict[str, Assignment]) -> dict[str, Assignment]:
    """Kafka's `range` assignor: each topic's partitions in contiguous ranges over the members
    subscribed to it, in member id order (the first ones get one more)."""
    out: dict[str, dict[str, frozenset[int]]] = {m: {} for m in subs}
    for t in sorted({t for s in subs.values() for t in s}):
        eligible = sorted(m for m in subs if t in subs[m])
        n = counts.get(t, 0)
        start = 0
        for i, m in enumerate(eligible):
            size = n // len(eligible) + (1 if i < n % len(eligible) else 0)
            if size:
                out[m][t] = frozenset(range(start, start + size))
            start += size
    return out


def _intersect(a: Assignment, b: Assignment) -> Assignment:
    return {t: ps & b[t] for t, ps in a.items() if t in b and ps & b[t]}


def _minus(a: Assignment, b: Assignment) -> Assignment:
    out = {t: ps - b.get(t, frozenset()) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _union(a: Assignment, b: Assignment) -> Assignment:
    return {t: a.get(t, frozenset()) | b.get(t, frozenset()) for t in set(a) | set(b)}


def _overlap(a: Assignment, b: Assignment) -> bool:
    return any(ps & b.get(t, frozenset()) for t, ps in a.items())
