"""The request layer's consumer-group operations, for both doors (rpc/group_servicer.py and
rpc/kafka/groups.py are their codecs): FindCoordinator's checks, the classic protocol (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup), KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe,
offsets (OffsetCommit, OffsetFetch, OffsetDelete) and the admin calls (ListGroups,
DescribeGroups, DeleteGroups).

ACLs in Kafka's order: READ on the group for a member's calls and commits, then READ on each
topic committed (a refused topic is not committed); DESCRIBE on the group to fetch offsets or
describe it (topics the caller may not DESCRIBE are left out); DELETE on the group to delete it
or its offsets; ListGroups shows every group to DESCRIBE on the cluster, else those the caller
may DESCRIBE. The coordinator lives in the driver: a server without it (a broker) answers
NOT_COORDINATOR, as a Kafka broker does for a group it does not coordinate.

What waits (a join, a sync) comes back as a future and the time to wait for it: a gRPC servicer
waits on its thread, the Kafka door in its purgatory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from deltabus import errors
from deltabus.cluster.handler import TransactionHandler
from deltabus.metadata import GroupDescription
from deltabus.offsets.classic_group import JoinResult
from deltabus.offsets.consumer_group import ConsumerGroup, HeartbeatResult
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.offsets.group_limits import COMMIT_TIMEOUT_S, LONG_POLL_SLACK_S, wait_result
from deltabus.offsets.offset_metadata_manager import PartitionErrors
from deltabus.offsets.offset_store import OffsetAndMetadata
from deltabus.rpc.access import Access
from deltabus.security.acls import Operation

GROUP, TRANSACTION = 0, 1  # FindCoordinator's key types


@dataclass(frozen=True)
class JoinGroupRequest:
    group_id: str
    member_id: str
    protocol_type: str
    protocols: Sequence[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str = ""
    client_host: str = ""  # as consumer-groups --describe shows it (`/127.0.0.1`)
    group_instance_id: str | None = None


@dataclass(frozen=True)
class OffsetCommitRequest:
    group_id: str
    generation_id: int  # or KIP-848's member epoch; -1 with an empty member id: not checked
    member_id: str
    offsets: Sequence[tuple[str, int, OffsetAndMetadata]]  # topic, partition, offset
    group_instance_id: str | None = None


@dataclass(frozen=True)
class FetchedOffset:
    topic: str
    partition: int
    committed: OffsetAndMetadata | None  # None: nothing committed (or not stable yet)
    unstable: bool = False  # an open transaction commits it (KIP-447's require_stable)


@dataclass(frozen=True)
class DescribedGroup:
    group_id: str
    description: GroupDescription | None = None
    error: errors.DeltaBusError | None = None


@dataclass(frozen=True)
class ConsumerGroupHeartbeatRequest:
    """KIP-848's heartbeat, validated by the door that decoded it (its versions' rules)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: list[str] | None
    server_assignor: str | None
    owned: dict[str, frozenset[int]] | None
    client_id: str = ""
    client_host: str = ""


class GroupRequests:
    """Validates, authorizes and carries out the group calls of both doors."""

    def __init__(self, groups: GroupCoordinator | None,
                 transactions: TransactionHandler | None = None) -> None:
        """`groups`: the group coordinator, where this server has it (the driver's);
        `transactions`: the transaction coordinator, whose open transactions make a group's
        offsets unstable for OffsetFetch's require_stable."""
        self._groups = groups
        self._transactions = transactions

    def _coordinator(self) -> GroupCoordinator:
        if self._groups is None:
            raise errors.NotCoordinatorError(
                "this server is not the group coordinator: ask FindCoordinator")
        return self._groups

    @staticmethod
    def check_find_coordinator(access: Access, key: str, key_type: int) -> None:
        """FindCoordinator's checks; which node coordinates is each door's to say (it names
        that node's endpoint on the listener asked)."""
        if key_type not in (GROUP, TRANSACTION):
            raise errors.InvalidRequestError(
                f"unknown coordinator key type {key_type}: groups (0) and transactions (1) "
                "have coordinators")
        Access.raise_if(access.group(Operation.DESCRIBE, key) if key_type == GROUP
                        else access.transactional_id(Operation.DESCRIBE, key))

    # ---- the classic protocol ------------------------------------------------------------

    def join_group(self, access: Access,
                   request: JoinGroupRequest) -> tuple[Future[JoinResult], float]:
        """The join's future and how long to wait for it (group.max.rebalance.timeout.ms caps
        the wait, whatever the member asks for)."""
        Access.raise_if(access.group(Operation.READ, request.group_id))
        coordinator = self._coordinator()
        future = coordinator.join_group(
            request.group_id, request.member_id, request.protocol_type,
            list(request.protocols), session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms, client_id=request.client_id,
            client_host=request.client_host, group_instance_id=request.group_instance_id)
        return future, coordinator.join_wait_s(request.rebalance_timeout_ms,
                                               request.session_timeout_ms)

    def sync_group(self, access: Access, group_id: str, generation_id: int, member_id: str,
                   assignments: dict[str, bytes], group_instance_id: str | None = None
                   ) -> tuple[Future[bytes], float]:
        """The member's assignment, once the leader's arrives, and how long to wait for it."""
        Access.raise_if(access.group(Operation.READ, group_id))
        coordinator = self._coordinator()
        future = coordinator.sync_group(group_id, generation_id, member_id, assignments,
                                        group_instance_id)
        return future, coordinator.rebalance_timeout_s(group_id) + LONG_POLL_SLACK_S

    def heartbeat(self, access: Access, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> None:
        Access.raise_if(access.group(Operation.READ, group_id))
        self._coordinator().heartbeat(group_id, generation_id, member_id, group_instance_id)

    def leave_group(self, access: Access, group_id: str, member_ids: Sequence[str]) -> None:
        """Members leave by member id, all or none (LeaveGroup before v3)."""
        Access.raise_if(access.group(Operation.READ, group_id))
        self._coordinator().leave_group(group_id, list(member_ids))

    def leave_members(self, access: Access, group_id: str,
                      members: Sequence[tuple[str, str | None]]
                      ) -> dict[tuple[str, str | None], errors.DeltaBusError | None]:
        """LeaveGroup v3+: members by member id and group instance id (a static member, or one
        an admin removes by its instance id alone), each with its own answer."""
        Access.raise_if(access.group(Operation.READ, group_id))
        return self._coordinator().leave_members(group_id, list(members))

    # ---- KIP-848 ---------------------------------------------------------------------------

    def consumer_group_heartbeat(self, access: Access,
                                 request: ConsumerGroupHeartbeatRequest) -> HeartbeatResult:
        """READ on the group, then DESCRIBE on every subscribed topic
        (TOPIC_AUTHORIZATION_FAILED), as Kafka checks."""
        Access.raise_if(access.group(Operation.READ, request.group_id))
        for topic in request.subscribed_topic_names or ():
            Access.raise_if(access.topic(Operation.DESCRIBE, topic))
        return self._coordinator().consumer_group_heartbeat(
            request.group_id, request.member_id, request.member_epoch,
            instance_id=request.instance_id, rack_id=request.rack_id,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            subscribed_topic_names=request.subscribed_topic_names,
            server_assignor=request.server_assignor, owned=request.owned,
            client_id=request.client_id, client_host=request.client_host)

    def describe_consumer_group(self, access: Access, group_id: str) -> ConsumerGroup:
        """DESCRIBE on the group, and on every topic its assignments name."""
        Access.raise_if(access.group(Operation.DESCRIBE, group_id))
        group = self._coordinator().describe_consumer_group(group_id)
        for m in group.members.values():
            for t in {*m.assigned, *group.target.get(m.member_id, {})}:
                Access.raise_if(access.topic(Operation.DESCRIBE, t))
        return group

    # ---- offsets ---------------------------------------------------------------------------

    def offset_commit(self, access: Access, request: OffsetCommitRequest
                      ) -> tuple[PartitionErrors, errors.DeltaBusError | None]:
        """Each partition's answer, and the answer of those without one (the refusal of the
        whole request). The request's limits first: a refusal names the group, in every
        partition's answer, so it must not be 200 copies of a 100 KB group id. Then Kafka's
        order: READ on the group, READ on each topic (a refused topic is not committed), the
        coordinator's checks of the member."""
        try:
            coordinator = self._coordinator()
            coordinator.check_offset_commit(request.group_id, len(request.offsets))
            Access.raise_if(access.group(Operation.READ, request.group_id))
        except errors.DeltaBusError as e:
            return {}, e
        denied = {t: refusal for t in {t for t, _, _ in request.offsets}
                  if (refusal := access.topic(Operation.READ, t))}
        answers: PartitionErrors = {(t, p): denied[t] for t, p, _ in request.offsets
                                    if t in denied}
        offsets = {(t, p): om for t, p, om in request.offsets if t not in denied}
        if offsets or not denied:
            try:
                answers |= wait_result(coordinator.commit_offsets(
                    request.group_id, request.generation_id, request.member_id, offsets,
                    request.group_instance_id), COMMIT_TIMEOUT_S)
            except errors.DeltaBusError as e:
                return answers, e
        return answers, None

    def offset_fetch(self, access: Access, group_id: str,
                     wanted: Sequence[tuple[str, int]] | None, require_stable: bool = False
                     ) -> tuple[list[FetchedOffset], errors.DeltaBusError | None]:
        """The committed offsets of `wanted` (None: every partition the group committed), and
        the refusal of the whole request (then nothing is committed for any). Topics the
        caller may not DESCRIBE are left out, as Kafka leaves them out."""
        committed: dict[tuple[str, int], OffsetAndMetadata] = {}
        error = None
        try:
            Access.raise_if(access.group(Operation.DESCRIBE, group_id))
            committed = self._coordinator().fetch_offsets(
                group_id, None if wanted is None else list(wanted))
        except errors.DeltaBusError as e:
            error = e
        unstable: set[tuple[str, int]] = set()
        if error is None and require_stable and self._transactions is not None:
            unstable = self._transactions.pending_txn_offsets(group_id)
        return [FetchedOffset(t, p, None if (t, p) in unstable else committed.get((t, p)),
                              (t, p) in unstable)
                for t, p in (wanted if wanted is not None else sorted(committed))
                if access.topic(Operation.DESCRIBE, t) is None], error

    def offset_delete(self, access: Access, group_id: str,
                      partitions: Sequence[tuple[str, int]]) -> PartitionErrors:
        """The group's committed offsets of `partitions` go, for a principal allowed DELETE on
        the group and READ on each topic (TOPIC_AUTHORIZATION_FAILED for the partitions of
        others), as Kafka checks them."""
        Access.raise_if(access.group(Operation.DELETE, group_id))
        denied = {t: e for t, _ in partitions if (e := access.topic(Operation.READ, t))}
        answers: PartitionErrors = {tp: denied[tp[0]] for tp in partitions if tp[0] in denied}
        return answers | self._coordinator().delete_offsets(
            group_id, [tp for tp in partitions if tp[0] not in denied])

    # ---- admin -----------------------------------------------------------------------------

    def list_groups(self, access: Access, states: Sequence[str] = (),
                    shown: Callable[[str], bool] = lambda group_id: True
                    ) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of the groups in `states` (any case; empty: all)
        that `shown` keeps (a broker lists those FindCoordinator sends to it) and the caller
        may see."""
        listed = self._coordinator().list_groups()
        wanted = {s.lower() for s in states}
        everything = access.cluster(Operation.DESCRIBE) is None
        return [(g, t, s) for g, t, s in listed if (not wanted or s.lower() in wanted)
                and shown(g) and (everything or access.group(Operation.DESCRIBE, g) is None)]

    def describe_groups(self, access: Access,
                        group_ids: Sequence[str]) -> list[DescribedGroup]:
        out = []
        for group_id in group_ids:
            try:
                Access.raise_if(access.group(Operation.DESCRIBE, group_id))
                out.append(DescribedGroup(group_id, self._coordinator().describe_group(group_id)))
            except errors.DeltaBusError as e:
                out.append(DescribedGroup(group_id, error=e))
        return out

    def delete_groups(self, access: Access, group_ids: Sequence[str]
                      ) -> dict[str, errors.DeltaBusError | None]:
        """Each empty group and its committed offsets go (NON_EMPTY_GROUP while it has
        members, GROUP_ID_NOT_FOUND for none), for a principal allowed DELETE on it."""
        results = {g: access.group(Operation.DELETE, g) for g in group_ids}
        allowed = [g for g, e in results.items() if e is None]
        if allowed:
            try:
                results.update(self._coordinator().delete_groups(allowed))
            except errors.DeltaBusError as e:
                results.update(dict.fromkeys(allowed, e))
        return results
