"""gRPC servicer methods of the consumer-group calls: decode, call the group coordinator, encode.

A server without a coordinator (a broker) answers NOT_COORDINATOR, as a Kafka broker does for a
group it does not coordinate; clients then ask FindCoordinator. Errors travel as Kafka codes in
the response (`error_code`), as Kafka's group APIs carry them; an `optional` field left out
gets Kafka's default (`codec.present_or`).
"""

from __future__ import annotations

from typing import Any

from deltabus import config as cfg
from deltabus import errors
from deltabus.offsets.group_coordinator import (
    COMMIT_TIMEOUT_S,
    LONG_POLL_SLACK_S,
    GroupCoordinator,
    PartitionErrors,
    wait_result,
)
from deltabus.offsets.offset_store import OffsetAndMetadata
from deltabus.rpc.access import Access, peer_host
from deltabus.rpc.codec import present_or
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.security.acls import Operation


class GroupServicerMixin:
    """The group calls of `DeltaBusServicer`; `_groups` is the coordinator, or None."""

    _groups: GroupCoordinator | None

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

    def _group_refusal(self, context: Any, group_id: str,
                       operation: Operation = Operation.READ) -> errors.DeltaBusError | None:
        """Kafka's check of the group calls: READ on the group (DESCRIBE for describing it)."""
        return self._access(context).group(operation, group_id)

    def _coordinator(self) -> GroupCoordinator:
        if self._groups is None:
            raise errors.NotCoordinatorError("this server is not the group coordinator: "
                                             "ask FindCoordinator")
        return self._groups

    def JoinGroup(self, request: pb.JoinGroupRequest, context: Any) -> pb.JoinGroupResponse:
        session_timeout_ms = present_or(request, "session_timeout_ms",
                                        cfg.SESSION_TIMEOUT_MS_DEFAULT)
        try:
            Access.raise_if(self._group_refusal(context, request.group_id))
            coordinator = self._coordinator()
            future = coordinator.join_group(
                request.group_id, request.member_id, request.protocol_type,
                [(p.name, p.metadata) for p in request.protocols],
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
                client_id=request.client_id, client_host=_peer_host(context))
            result = wait_result(future, coordinator.join_wait_s(
                request.rebalance_timeout_ms, session_timeout_ms))
        except errors.DeltaBusError as e:
            return pb.JoinGroupResponse(error_code=e.code, error_message=e.message,
                                        member_id=getattr(e, "member_id", ""))
        return pb.JoinGroupResponse(
            generation_id=result.generation_id, protocol_name=result.protocol_name,
            leader=result.leader_id, member_id=result.member_id,
            members=[pb.JoinGroupMember(member_id=m, metadata=md) for m, md in result.members])

    def SyncGroup(self, request: pb.SyncGroupRequest, context: Any) -> pb.SyncGroupResponse:
        try:
            Access.raise_if(self._group_refusal(context, request.group_id))
            future = self._coordinator().sync_group(
                request.group_id, request.generation_id, request.member_id,
                {a.member_id: a.assignment for a in request.assignments})
            assignment = wait_result(future, self._sync_timeout_s(request.group_id))
        except errors.DeltaBusError as e:
            return pb.SyncGroupResponse(error_code=e.code, error_message=e.message)
        return pb.SyncGroupResponse(assignment=assignment)

    def _sync_timeout_s(self, group_id: str) -> float:
        return self._coordinator().rebalance_timeout_s(group_id) + LONG_POLL_SLACK_S

    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        try:
            Access.raise_if(self._group_refusal(context, request.group_id))
            self._coordinator().heartbeat(request.group_id, request.generation_id,
                                          request.member_id)
        except errors.DeltaBusError as e:
            return pb.HeartbeatResponse(error_code=e.code, error_message=e.message)
        return pb.HeartbeatResponse()

    def LeaveGroup(self, request: pb.LeaveGroupRequest, context: Any) -> pb.LeaveGroupResponse:
        try:
            Access.raise_if(self._group_refusal(context, request.group_id))
            self._coordinator().leave_group(request.group_id, list(request.member_ids))
        except errors.DeltaBusError as e:
            return pb.LeaveGroupResponse(error_code=e.code, error_message=e.message)
        return pb.LeaveGroupResponse()

    def OffsetCommit(self, request: pb.OffsetCommitRequest,
                     context: Any) -> pb.OffsetCommitResponse:
        answers, error = self._offset_commit(request, context)
        return pb.OffsetCommitResponse(results=[
            pb.PartitionResult(topic=p.topic, partition=p.partition,
                               error_code=e.code if e else 0, error_message=e.message if e else "")
            for p in request.partitions
            for e in [answers.get((p.topic, p.partition), error)]])

    def _offset_commit(self, request: pb.OffsetCommitRequest, context: Any
                       ) -> tuple[PartitionErrors, errors.DeltaBusError | None]:
        """Each partition's answer, and the answer of those without one (the refusal of the
        whole request). The request's limits first (a refusal of READ on the group names the
        group, in every partition's answer), then Kafka's order: READ on the group, READ on
        each topic (a refused topic is not committed), the coordinator."""
        try:
            coordinator = self._coordinator()
            coordinator.check_offset_commit(request.group_id, len(request.partitions))
            Access.raise_if(self._group_refusal(context, request.group_id))
        except errors.DeltaBusError as e:
            return {}, e
        access = self._access(context)
        denied = {t: refusal for t in {p.topic for p in request.partitions}
                  if (refusal := access.topic(Operation.READ, t))}
        refused: PartitionErrors = {(p.topic, p.partition): denied[p.topic]
                                    for p in request.partitions if p.topic in denied}
        offsets = {(p.topic, p.partition): OffsetAndMetadata(
            p.committed_offset, present_or(p, "committed_leader_epoch", -1), p.metadata)
            for p in request.partitions if p.topic not in denied}
        try:
            answers: PartitionErrors = {}
            if offsets or not refused:
                answers = wait_result(coordinator.commit_offsets(
                    request.group_id, present_or(request, "generation_id", -1),
                    request.member_id, offsets), COMMIT_TIMEOUT_S)
        except errors.DeltaBusError as e:
            return refused, e
        return {**answers, **refused}, None

    def OffsetFetch(self, request: pb.OffsetFetchRequest, context: Any) -> pb.OffsetFetchResponse:
        wanted = [(tp.topic, p) for tp in request.topic_partitions for p in tp.partitions]
        access = self._access(context)
        try:
            Access.raise_if(self._group_refusal(context, request.group_id, Operation.DESCRIBE))
            committed = self._coordinator().fetch_offsets(request.group_id, wanted or None)
        except errors.DeltaBusError as e:
            return pb.OffsetFetchResponse(error_code=e.code, error_message=e.message)
        response = pb.OffsetFetchResponse()
        for topic, partition in wanted or sorted(committed):
            if access.topic(Operation.DESCRIBE, topic) is not None:
                continue  # Kafka leaves out the topics the caller may not DESCRIBE
            om = committed.get((topic, partition))
            response.partitions.append(pb.OffsetFetchPartition(
                topic=topic, partition=partition,
                committed_offset=om.offset if om else -1,
                committed_leader_epoch=om.leader_epoch if om else -1,
                metadata=om.metadata if om else "",
                commit_timestamp_ms=om.commit_timestamp_ms if om else -1))
        return response

    def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsResponse:
        try:
            groups = self._coordinator().list_groups()
        except errors.DeltaBusError as e:
            return pb.ListGroupsResponse(error_code=e.code, error_message=e.message)
        states = {s.lower() for s in request.states_filter}
        access = self._access(context)
        everything = access.cluster(Operation.DESCRIBE) is None
        return pb.ListGroupsResponse(groups=[
            pb.ListedGroup(group_id=g, protocol_type=t, group_state=s)
            for g, t, s in groups if (not states or s.lower() in states)
            and (everything or access.group(Operation.DESCRIBE, g) is None)])

    def DescribeGroups(self, request: pb.DescribeGroupsRequest,
                       context: Any) -> pb.DescribeGroupsResponse:
        response = pb.DescribeGroupsResponse()
        for group_id in request.group_ids:
            try:
                Access.raise_if(self._group_refusal(context, group_id, Operation.DESCRIBE))
                d = self._coordinator().describe_group(group_id)
            except errors.DeltaBusError as e:
                response.groups.append(pb.DescribedGroup(
                    group_id=group_id, error_code=e.code, error_message=e.message))
                continue
            response.groups.append(pb.DescribedGroup(
                group_id=d.group_id, group_state=d.state, protocol_type=d.protocol_type,
                protocol_data=d.protocol, generation_id=d.generation_id, leader=d.leader_id,
                members=[pb.DescribedGroupMember(
                    member_id=m.member_id, client_id=m.client_id, client_host=m.client_host,
                    member_metadata=m.metadata, member_assignment=m.assignment)
                    for m in d.members]))
        return response

    def DeleteGroups(self, request: pb.DeleteGroupsRequest,
                     context: Any) -> pb.DeleteGroupsResponse:
        refused = {g: e for g in request.group_ids
                   if (e := self._group_refusal(context, g, Operation.DELETE))}
        allowed = [g for g in request.group_ids if g not in refused]
        try:
            results = self._coordinator().delete_groups(allowed) if allowed else {}
        except errors.DeltaBusError as e:
            results = {g: e for g in allowed}
        results = {**refused, **results}
        return pb.DeleteGroupsResponse(results=[
            pb.DeletedGroup(group_id=g, error_code=e.code if e else 0,
                            error_message=e.message if e else "")
            for g, e in results.items()])


def _peer_host(context: Any) -> str:
    """The client's address as Kafka's tools show it (`/127.0.0.1`)."""
    host = peer_host(context) if context is not None else ""
    return "/" + host if host else ""
