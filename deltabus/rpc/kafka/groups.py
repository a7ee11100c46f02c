"""Kafka's consumer-group APIs over the request layer (rpc/group_requests.py, where the rules
and ACLs live) and the cluster's group coordinator: the same groups, members
and committed offsets (`__consumer_offsets`) as through gRPC, so a Kafka client and a deltabus
client can share one group. The coordinator lives in the Spark driver. Kafka clients see only
brokers, as Kafka's own: FindCoordinator names a live broker for each group
(`admin.coordinator_for`), and a broker's listener passes the group APIs on to the driver
(`listener`, Kafka's Envelope). The driver's own listener (the bootstrap) answers them itself.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from deltabus import errors
from deltabus.offsets.group_coordinator import HeartbeatResult, JoinResult, PartitionErrors
from deltabus.offsets.offset_store import OffsetAndMetadata
from deltabus.offsets.share_group import ShareHeartbeatResult
from deltabus.rpc.access import Access, current_access
from deltabus.rpc.group_requests import (
    GROUP,
    ConsumerGroupHeartbeatRequest,
    DescribedGroup,
    FetchedOffset,
    GroupRequests,
    JoinGroupRequest,
    OffsetCommitRequest,
)
from deltabus.rpc.kafka.admin import KafkaEndpoint
from deltabus.rpc.kafka.delayed import DelayedResponse, result_of
from deltabus.rpc.kafka.frames import (
    NO_TIME,
    error_code,
    load_response_schema,
    make,
    millis,
    nested,
)

(FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH,
 LIST_GROUPS, DESCRIBE_GROUPS) = 10, 11, 14, 12, 13, 8, 9, 16, 15
DELETE_GROUPS, OFFSET_DELETE, CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 42, 47, 68, 69
SUPPORTED: dict[int, tuple[int, int]] = {
    FIND_COORDINATOR: (0, 3),
    JOIN_GROUP: (0, 7),
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 4),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 7),
    LIST_GROUPS: (0, 4),
    DESCRIBE_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
}


class KafkaGroupApis:
    """The group APIs, codecs around the request layer's (rpc/group_requests.py). A broker
    has no coordinator (everything but FindCoordinator then answers NOT_COORDINATOR, unless
    its listener forwards them to the driver)."""

    def __init__(self, requests: GroupRequests) -> None:
        self._requests = requests
        # The broker FindCoordinator names for a key, on this listener (None: no broker is up).
        self.coordinator_for: Callable[[str], KafkaEndpoint | None] = lambda key: None
        # Whether broker `node` coordinates a group, for a broker's ListGroups.
        self.coordinated_by: Callable[[str, int], bool] = lambda key, node: True
        # Every topic's id by name and the reverse, as Metadata tells clients (KIP-848's
        # assignments name topics by id).
        self.topic_ids: Callable[[], tuple[dict[str, uuid.UUID], dict[uuid.UUID, str]]] = \
            lambda: ({}, {})
        self.apis = {
            FIND_COORDINATOR: self.find_coordinator, JOIN_GROUP: self.join_group,
            SYNC_GROUP: self.sync_group, HEARTBEAT: self.heartbeat,
            LEAVE_GROUP: self.leave_group, OFFSET_COMMIT: self.offset_commit,
            OFFSET_FETCH: self.offset_fetch, LIST_GROUPS: self.list_groups,
            DESCRIBE_GROUPS: self.describe_groups, DELETE_GROUPS: self.delete_groups,
            OFFSET_DELETE: self.offset_delete,
            CONSUMER_GROUP_HEARTBEAT: self.consumer_group_heartbeat,
            CONSUMER_GROUP_DESCRIBE: self.consumer_group_describe,
        }

    def find_coordinator(self, version: int, request: Any,
                         refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(FIND_COORDINATOR, version)
        error = refused
        if error is None:
            try:
                self._requests.check_find_coordinator(current_access(), request.key,
                                                      getattr(request, "key_type", GROUP))
            except errors.DeltaBusError as e:
                error = e
        found = self.coordinator_for(request.key) if error is None else None
        if error is None and found is None:
            error = errors.CoordinatorNotAvailableError("no broker is up to coordinate "
                                                        f"{request.key!r}")
        return make(cls, throttle_time=NO_TIME, error_code=error_code(error),
                    error_message=error.message if error else None,
                    node_id=found.node_id if found else -1,
                    host=found.host if found else "", port=found.port if found else -1)

    def join_group(self, version: int, request: Any, refused: errors.DeltaBusError | None = None,
                   client: tuple[str, str] = ("", "")) -> Any:
        """A DelayedResponse completed when the join phase ends (or an answer at once where
        the coordinator refuses). `client`: the request header's client id and the client's
        host, as consumer-groups --describe shows them."""
        cls = load_response_schema(JOIN_GROUP, version)
        session_ms = millis(request.session_timeout)
        rebalance_ms = millis(getattr(request, "rebalance_timeout", None), session_ms)
        member_id = request.member_id
        try:
            if refused is not None:
                raise refused
            protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]

            def join(member: str) -> tuple[Future[JoinResult], float]:
                return self._requests.join_group(current_access(), JoinGroupRequest(
                    request.group_id, member, request.protocol_type, protocols,
                    session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                    client_id=client[0], client_host=client[1],
                    group_instance_id=getattr(request, "group_instance_id", None)))

            try:
                future, timeout_s = join(member_id)
            except errors.MemberIdRequiredError as e:
                if version >= 4:  # the client joins again with its new id (KIP-394)
                    raise
                member_id = e.member_id  # type: ignore[attr-defined]
                future, timeout_s = join(member_id)
        except errors.DeltaBusError as e:
            return _join_failed(cls, version, e, member_id)
        return DelayedResponse([future], time.monotonic() + timeout_s, functools.partial(
            _joined, cls, version, request, future, timeout_s, member_id))

    def sync_group(self, version: int, request: Any,
                   refused: errors.DeltaBusError | None = None) -> Any:
        """A DelayedResponse completed when the leader's assignment arrives."""
        cls = load_response_schema(SYNC_GROUP, version)
        try:
            if refused is not None:
                raise refused
            future, timeout_s = self._requests.sync_group(
                current_access(), request.group_id, request.generation_id, request.member_id,
                {a.member_id: bytes(a.assignment) for a in request.assignments},
                getattr(request, "group_instance_id", None))
        except errors.DeltaBusError as e:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(e), assignment=b"")
        return DelayedResponse([future], time.monotonic() + timeout_s, functools.partial(
            _synced, cls, request, future, timeout_s))

    def heartbeat(self, version: int, request: Any,
                  refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(HEARTBEAT, version)
        error = refused
        if error is None:
            try:
                self._requests.heartbeat(current_access(), request.group_id,
                                         request.generation_id, request.member_id,
                                         getattr(request, "group_instance_id", None))
            except errors.DeltaBusError as e:
                error = e
        return make(cls, throttle_time=NO_TIME, error_code=error_code(error))

    def leave_group(self, version: int, request: Any,
                    refused: errors.DeltaBusError | None = None) -> Any:
        """LeaveGroup: v3+ names members by member id and group instance id (a static member,
        or one an admin removes by its instance id alone), each with its own answer."""
        cls = load_response_schema(LEAVE_GROUP, version)
        if version < 3:
            error = refused
            if error is None:
                try:
                    self._requests.leave_group(current_access(), request.group_id,
                                               [request.member_id])
                except errors.DeltaBusError as e:
                    error = e
            return make(cls, throttle_time=NO_TIME, error_code=error_code(error), members=())
        members = [(m.member_id, m.group_instance_id) for m in request.members]
        answers: dict[tuple[str, str | None], errors.DeltaBusError | None] = {}
        try:
            Access.raise_if(refused)
            answers = self._requests.leave_members(current_access(), request.group_id, members)
        except errors.DeltaBusError as e:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(e), members=())
        response_member = nested(cls, "MemberResponse")
        return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none, members=tuple(
            response_member(member_id=m, group_instance_id=i,
                            error_code=error_code(answers[(m, i)])) for m, i in members))

    def offset_commit(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(OFFSET_COMMIT, version)
        topic_cls, partition_cls = (nested(cls, n) for n in ("OffsetCommitResponseTopic",
                                                              "OffsetCommitResponsePartition"))
        answers, error = self._offset_commit(request, refused)
        by_topic: dict[str, list[Any]] = {}
        for t in request.topics:
            for p in t.partitions:
                by_topic.setdefault(t.name, []).append(partition_cls(
                    partition_index=p.partition_index,
                    error_code=error_code(answers.get((t.name, p.partition_index), error))))
        return make(cls, throttle_time=NO_TIME, topics=tuple(
            topic_cls(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))

    def _offset_commit(self, request: Any, refused: errors.DeltaBusError | None
                       ) -> tuple[PartitionErrors, errors.DeltaBusError | None]:
        if refused is not None:
            return {}, refused
        return self._requests.offset_commit(current_access(), OffsetCommitRequest(
            request.group_id, getattr(request, "generation_id_or_member_epoch",
                                      getattr(request, "generation_id", -1)),
            request.member_id, [(t.name, p.partition_index, OffsetAndMetadata(
                p.committed_offset, getattr(p, "committed_leader_epoch", -1),
                p.committed_metadata or "")) for t in request.topics for p in t.partitions],
            getattr(request, "group_instance_id", None)))

    def offset_fetch(self, version: int, request: Any,
                     refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(OFFSET_FETCH, version)
        topic_cls, partition_cls = (nested(cls, n) for n in ("OffsetFetchResponseTopic",
                                                              "OffsetFetchResponsePartition"))
        wanted = (None if request.topics is None else
                  [(t.name, p) for t in request.topics for p in t.partition_indexes])
        fetched, error = ([FetchedOffset(t, p, None) for t, p in wanted or ()], refused)
        if refused is None:
            fetched, error = self._requests.offset_fetch(
                current_access(), request.group_id, wanted,
                bool(getattr(request, "require_stable", False)))
        by_topic: dict[str, list[Any]] = {}
        for f in fetched:
            om = f.committed
            by_topic.setdefault(f.topic, []).append(make(
                partition_cls, partition_index=f.partition,
                committed_offset=om.offset if om else -1,
                committed_leader_epoch=om.leader_epoch if om else -1,
                metadata=om.metadata if om else "", error_code=(
                    ErrorCode.unstable_offset_commit if f.unstable else ErrorCode.none)))
        return make(cls, throttle_time=NO_TIME, error_code=error_code(error), topics=tuple(
            topic_cls(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))

    def list_groups(self, version: int, request: Any,
                    refused: errors.DeltaBusError | None = None, node: int | None = None
                    ) -> Any:
        """The groups the asked broker coordinates (`node`: a broker's forwarded request), as
        Kafka's admin clients list groups from every broker and join the answers; every
        group where the request came to the driver itself."""
        cls = load_response_schema(LIST_GROUPS, version)
        group_cls = nested(cls, "ListedGroup")
        listed: list[tuple[str, str, str]] = []
        error = refused
        if error is None:
            try:
                listed = self._requests.list_groups(
                    current_access(), list(getattr(request, "states_filter", ())),
                    shown=lambda g: node is None or self.coordinated_by(g, node))
            except errors.DeltaBusError as e:
                error = e
        return make(cls, throttle_time=NO_TIME, error_code=error_code(error), groups=tuple(
            make(group_cls, group_id=g, protocol_type=t, group_state=s) for g, t, s in listed))

    def describe_groups(self, version: int, request: Any,
                        refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(DESCRIBE_GROUPS, version)
        group_cls, member_cls = (nested(cls, n) for n in ("DescribedGroup",
                                                          "DescribedGroupMember"))
        described = []
        for found in ([DescribedGroup(g, error=refused) for g in request.groups]
                      if refused is not None
                      else self._requests.describe_groups(current_access(), request.groups)):
            d = found.description
            if d is None:
                described.append(make(group_cls, error_code=error_code(found.error),
                                      group_id=found.group_id, group_state="",
                                      protocol_type="", protocol_data="", members=()))
                continue
            described.append(make(
                group_cls, error_code=ErrorCode.none, group_id=d.group_id, group_state=d.state,
                protocol_type=d.protocol_type, protocol_data=d.protocol, members=tuple(
                    make(member_cls, member_id=m.member_id,
                         group_instance_id=m.group_instance_id,
                         client_id=m.client_id, client_host=m.client_host,
                         member_metadata=m.metadata, member_assignment=m.assignment)
                    for m in d.members)))
        return make(cls, throttle_time=NO_TIME, groups=tuple(described))

    def delete_groups(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        """DeleteGroups (kafka-consumer-groups.sh --delete): each empty group and its committed
        offsets go (NON_EMPTY_GROUP while it has members, GROUP_ID_NOT_FOUND for none), for a
        principal allowed DELETE on it."""
        cls = load_response_schema(DELETE_GROUPS, version)
        result_cls = nested(cls, "DeletableGroupResult")
        results = (dict.fromkeys(request.groups_names, refused) if refused is not None
                   else self._requests.delete_groups(current_access(), request.groups_names))
        return make(cls, throttle_time=NO_TIME, results=tuple(
            make(result_cls, group_id=g, error_code=error_code(e)) for g, e in results.items()))

    def offset_delete(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        """OffsetDelete (kafka-consumer-groups.sh --delete-offsets): the group's committed
        offsets of the named partitions go, for a principal allowed DELETE on the group (the
        whole request: `refused`) and READ on each topic (TOPIC_AUTHORIZATION_FAILED for the
        partitions of others), as Kafka's KafkaApis checks them."""
        cls = load_response_schema(OFFSET_DELETE, version)
        topic_cls, partition_cls = (nested(cls, n) for n in ("OffsetDeleteResponseTopic",
                                                              "OffsetDeleteResponsePartition"))
        named = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
        try:
            Access.raise_if(refused)
            answers = self._requests.offset_delete(current_access(), request.group_id, named)
        except errors.DeltaBusError as e:
            return make(cls, error_code=error_code(e), throttle_time=NO_TIME, topics=())
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), error in answers.items():
            by_topic.setdefault(topic, []).append(make(
                partition_cls, partition_index=partition, error_code=error_code(error)))
        return make(cls, error_code=ErrorCode.none, throttle_time=NO_TIME, topics=tuple(
            make(topic_cls, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))


    def consumer_group_heartbeat(self, version: int, request: Any,
                                 refused: errors.DeltaBusError | None = None,
                                 client: tuple[str, str] = ("", "")) -> Any:
        """ConsumerGroupHeartbeat (KIP-848): the coordinator answers at once with the member's
        epoch and, when it changed, its assignment. READ on the group (`refused`), then
        DESCRIBE on every subscribed topic (TOPIC_AUTHORIZATION_FAILED), as Kafka checks."""
        cls = load_response_schema(CONSUMER_GROUP_HEARTBEAT, version)
        ids, names = self.topic_ids()
        try:
            Access.raise_if(refused)
            _check_heartbeat(version, request)
            owned = None if request.topic_partitions is None else {
                names.get(t.topic_id, ""): frozenset(t.partitions)
                for t in request.topic_partitions}
            result = self._requests.consumer_group_heartbeat(
                current_access(), ConsumerGroupHeartbeatRequest(
                    request.group_id, request.member_id, request.member_epoch,
                    instance_id=request.instance_id, rack_id=request.rack_id,
                    rebalance_timeout_ms=millis(request.rebalance_timeout, -1),
                    subscribed_topic_names=None if request.subscribed_topic_names is None
                    else list(request.subscribed_topic_names),
                    server_assignor=request.server_assignor, owned=owned,
                    client_id=client[0], client_host=client[1]))
        except errors.DeltaBusError as e:
            return heartbeat_response(cls, ids, e, request.member_id)
        return heartbeat_response(cls, ids, result)


    def consumer_group_describe(self, version: int, request: Any,
                                refused: errors.DeltaBusError | None = None) -> Any:
        """ConsumerGroupDescribe (KIP-848): each group's epochs, assignor and members with their
        subscriptions, assignments and targets; DESCRIBE on the group, and on every topic its
        assignments name (TOPIC_AUTHORIZATION_FAILED otherwise), as Kafka checks them."""
        cls = load_response_schema(CONSUMER_GROUP_DESCRIBE, version)
        group_cls, member_cls = nested(cls, "DescribedGroup"), nested(cls, "Member")
        access = current_access()
        ids = self.topic_ids()[0]

        def assignment(a: dict[str, frozenset[int]]) -> Any:
            return make(nested(cls, "Assignment"), topic_partitions=tuple(
                make(nested(cls, "TopicPartitions"), topic_id=ids.get(t), topic_name=t,
                     partitions=tuple(sorted(ps))) for t, ps in sorted(a.items())))

        described = []
        for group_id in request.group_ids:
            try:
                Access.raise_if(refused)
                g = self._requests.describe_consumer_group(access, group_id)
            except errors.DeltaBusError as e:
                described.append(make(group_cls, error_code=error_code(e),
                                      error_message=e.message, group_id=group_id,
                                      group_state="", group_epoch=-1, assignment_epoch=-1,
                                      assignor_name="", members=()))
                continue
            described.append(make(
                group_cls, error_code=ErrorCode.none, error_message=None, group_id=group_id,
                group_state=g.state, group_epoch=g.group_epoch,
                assignment_epoch=g.assignment_epoch, assignor_name=g.assignor(),
                members=tuple(make(
                    member_cls, member_id=m.member_id, instance_id=m.instance_id,
                    rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                    client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                    subscribed_topic_regex=None, assignment=assignment(m.assigned),
                    target_assignment=assignment(g.target.get(m.member_id, {})),
                    member_type=1) for m in g.members.values())))
        return make(cls, throttle_time=NO_TIME, groups=tuple(described))


def _check_heartbeat(version: int, request: Any) -> None:
    """Kafka's validation of a ConsumerGroupHeartbeat before the coordinator sees it."""
    if version >= 1 and not request.member_id:
        raise errors.InvalidRequestError("MemberId can't be empty.")
    if request.member_epoch == 0 and (request.subscribed_topic_names is None
                                      and getattr(request, "subscribed_topic_regex", None) is None
                                      or request.topic_partitions is None
                                      or millis(request.rebalance_timeout, -1) == -1):
        raise errors.InvalidRequestError(
            "a join (member epoch 0) names its subscription, owned partitions and rebalance "
            "timeout")
    if request.member_epoch == -2 and not request.instance_id:
        raise errors.InvalidRequestError("InstanceId can't be null when member epoch is -2.")
    if request.member_epoch < -2:
        raise errors.InvalidRequestError(f"MemberEpoch {request.member_epoch} is invalid.")
    if getattr(request, "subscribed_topic_regex", None):
        raise errors.InvalidRequestError(
            "subscribed_topic_regex is not supported by this coordinator: subscribe by names")


def _join_failed(cls: Any, version: int, error: errors.DeltaBusError, member_id: str) -> Any:
    return make(cls, throttle_time=NO_TIME, error_code=error_code(error), generation_id=-1,
                protocol_type=None, protocol_name=None if version >= 7 else "", leader="",
                member_id=getattr(error, "member_id", member_id), members=())


def _joined(cls: Any, version: int, request: Any, future: Future[JoinResult], timeout_s: float,
            member_id: str) -> Any:
    """JoinGroup's answer once the join phase ended or its time passed (Kafka's DelayedJoin)."""
    try:
        result = result_of(future, timeout_s, "the group coordinator's JoinGroup")
    except errors.DeltaBusError as e:
        return _join_failed(cls, version, e, member_id)
    member_cls = nested(cls, "JoinGroupResponseMember")
    return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none,
                generation_id=result.generation_id, protocol_type=request.protocol_type,
                protocol_name=result.protocol_name, leader=result.leader_id,
                member_id=result.member_id,
                members=tuple(member_cls(member_id=m, group_instance_id=result.instance_ids.get(m),
                                         metadata=md) for m, md in result.members))


def _synced(cls: Any, request: Any, future: Future[bytes], timeout_s: float) -> Any:
    """SyncGroup's answer once the leader's assignment arrived or its time passed."""
    try:
        assignment = result_of(future, timeout_s, "the group coordinator's SyncGroup")
    except errors.DeltaBusError as e:
        return make(cls, throttle_time=NO_TIME, error_code=error_code(e), assignment=b"")
    return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none,
                protocol_type=getattr(request, "protocol_type", None),
                protocol_name=getattr(request, "protocol_name", None), assignment=assignment)


def heartbeat_response(cls: Any, ids: dict[str, uuid.UUID],
                       answer: HeartbeatResult | ShareHeartbeatResult | errors.DeltaBusError,
                       member_id: str = "") -> Any:
    """A ConsumerGroupHeartbeat's or ShareGroupHeartbeat's answer (one shape): the member's
    epoch and, when it changed, its assignment with topics by id; or the error."""
    if isinstance(answer, errors.DeltaBusError):
        return make(cls, throttle_time=NO_TIME, error_code=error_code(answer),
                    error_message=answer.message, member_id=member_id or None,
                    member_epoch=-1, heartbeat_interval=timedelta(0), assignment=None)
    assignment = None
    if answer.assignment is not None:
        tp_cls = nested(cls, "TopicPartitions")
        assignment = make(nested(cls, "Assignment"), topic_partitions=tuple(
            tp_cls(topic_id=ids[t], partitions=tuple(sorted(ps)))
            for t, ps in sorted(answer.assignment.items()) if t in ids))
    return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none, error_message=None,
                member_id=answer.member_id, member_epoch=answer.member_epoch,
                heartbeat_interval=timedelta(milliseconds=answer.heartbeat_interval_ms),
                assignment=assignment)
