"""KIP-932's share groups on the coordinator: membership and assignment (ShareGroupHeartbeat,
ShareGroupDescribe); records themselves are handed out by the partitions' leaders
(cluster/share_partition_manager.py), which keep the groups' state in `__share_group_state`.

Each group has a group epoch, bumped whenever a member joins or leaves, a subscription changes, or
a subscribed topic's partition count does. Assignment is KIP-932's: many members may read one
partition at once, since each record is acquired by one member at a time, so every member is
given every partition of the topics it subscribes to, and a member never has to give a partition
up before another takes it (no revocation, so no reconciling states: a group is Empty or Stable).
A member's epoch is the group epoch of the assignment it was last given.

Runs in the driver under the group coordinator's lock (`ShareGroupManager`): membership is soft
state, as for consumer groups; a restarted coordinator answers UNKNOWN_MEMBER_ID and members join
again, while what they consumed is durable on the leaders' side.

Invariants:
- A group id is of one kind: a share request for a consumer group (or the reverse) is refused,
  as Kafka refuses it (GROUP_ID_NOT_FOUND: "is not a share group").
- What the coordinator keeps is bounded: group.share.max.size members a group, group.max.groups
  groups in all (with the consumer groups); a silent member goes after its session timeout
  (the group's share.session.timeout.ms, else group.share.session.timeout.ms).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from deltabus import config as cfg
from deltabus import errors
from deltabus.group_configs import ShareGroupSettings, share_group_settings
from deltabus.metadata import MetadataImage
from deltabus.offsets.consumer_group import LEAVE_EPOCH, Assignment
from deltabus.offsets.group_limits import check_group_id

log = logging.getLogger(__name__)

EMPTY, STABLE, DEAD = "Empty", "Stable", "Dead"
ASSIGNOR = "simple"  # Kafka's only share group assignor, group.share.assignors
MEMBER_ID_MAX = 36  # Kafka's: a member id is a UUID the client makes


@dataclass(frozen=True)
class ShareHeartbeatResult:
    """ShareGroupHeartbeat's answer: the member's epoch and, when it changed or the member
    joined, its assignment."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None


@dataclass
class ShareMember:
    member_id: str
    last_heartbeat_s: float
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    member_epoch: int = 0
    assigned: Assignment = field(default_factory=dict)


@dataclass
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)  # of subscribed topics

    @property
    def state(self) -> str:
        return STABLE if self.members else EMPTY

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topic_names}

    def assignment_of(self, member: ShareMember) -> Assignment:
        """Every partition of the topics the member subscribes to."""
        return {t: frozenset(range(self.partition_counts.get(t, 0)))
                for t in member.subscribed_topic_names if self.partition_counts.get(t, 0)}


class ShareGroupManager:
    """Every share group's membership; in the driver, thread-safe with the coordinator's lock."""

    def __init__(self, config: cfg.GroupConfig, clock: Callable[[], float],
                 metadata: Callable[[], MetadataImage], lock: threading.Lock,
                 other_kind: Callable[[str], bool], group_count: Callable[[], int]) -> None:
        """`other_kind(group_id)`: whether the id is a consumer group's (lock held);
        `group_count()`: the consumer groups the coordinator keeps (lock held)."""
        self._config = config
        self._clock = clock
        self._metadata = metadata
        self._lock = lock
        self._other_kind = other_kind
        self._group_count = group_count
        self._groups: dict[str, ShareGroup] = {}

    def _settings(self, group_id: str) -> ShareGroupSettings:
        """The group's configs (kafka-configs.sh --entity-type groups) over the brokers'."""
        return share_group_settings(self._config,
                                    self._metadata().group_configs.get(group_id))

    def share_group(self, group_id: str) -> ShareGroup | None:
        """Lock held."""
        return self._groups.get(group_id)

    def heartbeat(self, group_id: str, member_id: str, member_epoch: int, *,
                  rack_id: str | None = None, subscribed_topic_names: list[str] | None = None,
                  client_id: str = "", client_host: str = "") -> ShareHeartbeatResult:
        """ShareGroupHeartbeat: join (epoch 0), heartbeat, or leave (-1). The subscription and
        rack are sent when they change (None keeps them)."""
        check_group_id(group_id)
        if not member_id or len(member_id) > MEMBER_ID_MAX:
            raise errors.InvalidRequestError(
                f"member id {member_id!r}: 1 to {MEMBER_ID_MAX} characters, as the client "
                f"makes it")
        interval_ms = self._settings(group_id).heartbeat_interval_ms
        with self._lock:
            if self._other_kind(group_id):
                raise errors.GroupIdNotFoundError(f"group {group_id} is not a share group")
            now = self._clock()
            if member_epoch == LEAVE_EPOCH:
                self._leave(group_id, member_id)
                return ShareHeartbeatResult(member_id, LEAVE_EPOCH, interval_ms, None)
            group, member = self._member(group_id, member_id, member_epoch, now)
            changed = member_epoch == 0
            member.last_heartbeat_s = now
            member.client_id, member.client_host = client_id, client_host
            member.rack_id = rack_id if rack_id is not None else member.rack_id
            if subscribed_topic_names is not None:
                subscribed = tuple(sorted(set(subscribed_topic_names)))
                if subscribed != member.subscribed_topic_names:
                    member.subscribed_topic_names = subscribed
                    changed = True
            image = self._metadata()
            counts = {t: len(image.topics[t].partitions) if t in image.topics else 0
                      for t in sorted(group.subscribed_topics())}
            if counts != group.partition_counts:
                group.partition_counts, changed = counts, True
            if changed:
                group.group_epoch += 1
                group.assignment_epoch = group.group_epoch
            assignment = group.assignment_of(member)
            answer = None
            if assignment != member.assigned or member_epoch == 0:
                member.assigned, member.member_epoch = assignment, group.assignment_epoch
                answer = dict(assignment)
            elif member.member_epoch != group.assignment_epoch:
                member.member_epoch = group.assignment_epoch
            return ShareHeartbeatResult(member.member_id, member.member_epoch, interval_ms,
                                        answer)

    def _member(self, group_id: str, member_id: str, member_epoch: int,
                now: float) -> tuple[ShareGroup, ShareMember]:
        """Lock held. The member a heartbeat is for: a new one (epoch 0; a known one that
        joins again keeps its id), or a known one at its epoch (FENCED_MEMBER_EPOCH for an
        epoch it was never given, UNKNOWN_MEMBER_ID for a member the group does not have)."""
        group = self._groups.get(group_id)
        if member_epoch != 0:
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None:
                raise errors.UnknownMemberIdError(
                    f"member {member_id} is not in share group {group_id}")
            if member_epoch > member.member_epoch:
                raise errors.FencedMemberEpochError(
                    f"member {member_id} of share group {group_id}: epoch {member_epoch} is "
                    f"newer than its {member.member_epoch}")
            return group, member
        if group is None:
            if self._group_count() + len(self._groups) >= self._config.group_max_groups:
                raise errors.GroupMaxSizeReachedError(
                    f"the coordinator holds the most groups group.max.groups "
                    f"({self._config.group_max_groups}) allows: no new group {group_id}")
            group = self._groups[group_id] = ShareGroup(group_id)
        member = group.members.get(member_id)
        if member is None:
            if len(group.members) >= self._config.group_share_max_size:
                raise errors.GroupMaxSizeReachedError(
                    f"share group {group_id} has the most members group.share.max.size "
                    f"({self._config.group_share_max_size}) allows")
            member = group.members[member_id] = ShareMember(member_id, now)
            log.info("share group %s: member %s joined", group_id, member_id)
        return group, member

    def _leave(self, group_id: str, member_id: str) -> None:
        group = self._groups.get(group_id)
        if group is None or group.members.pop(member_id, None) is None:
            raise errors.UnknownMemberIdError(
                f"member {member_id} is not in share group {group_id}")
        group.group_epoch += 1
        group.assignment_epoch = group.group_epoch
        log.info("share group %s: member %s left (group epoch %d)", group_id, member_id,
                 group.group_epoch)

    def describe(self, group_id: str) -> ShareGroup:
        """ShareGroupDescribe: a copy of the group (GROUP_ID_NOT_FOUND for any other)."""
        check_group_id(group_id)
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                kind = "is not a share group" if self._other_kind(group_id) else "not found"
                raise errors.GroupIdNotFoundError(f"Group {group_id} {kind}.")
            return copy.deepcopy(group)

    def groups(self) -> list[tuple[str, str]]:
        """(group id, state) of every share group the coordinator holds."""
        with self._lock:
            return sorted((g.group_id, g.state) for g in self._groups.values())

    def forget(self, group_id: str) -> None:
        """Lock held. An empty group goes (DeleteGroups)."""
        group = self._groups.get(group_id)
        if group is not None and not group.members:
            del self._groups[group_id]

    def expire(self, now: float) -> None:
        """Lock held. Members silent past their group's share.session.timeout.ms go."""
        for group in self._groups.values():
            session_s = self._settings(group.group_id).session_timeout_ms / 1000
            silent = [m for m in group.members.values() if now - m.last_heartbeat_s > session_s]
            for member in silent:
                log.info("share group %s: member %s missed its session timeout",
                         group.group_id, member.member_id)
                self._leave(group.group_id, member.member_id)
