"""KIP-848's consumer groups (ConsumerGroupHeartbeat): the coordinator assigns partitions.

Pure state, driven by the group coordinator under its lock (not thread-safe by itself). Each
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

from collections.abc import Callable
from dataclasses import dataclass, field

from deltabus import errors

STABLE, UNREVOKED, UNRELEASED = "STABLE", "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS"
ASSIGNORS = ("uniform", "range")  # Kafka's group.consumer.assignors; the first is the default
LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2

Assignment = dict[str, frozenset[int]]  # topic -> partitions


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
