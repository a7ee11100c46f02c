"""gRPC servicer methods of the consumer-group calls: decode, call the request layer
(rpc/group_requests.py, where the rules and ACLs live), encode; a join or a sync waits here, on
the server's thread.

Errors travel as Kafka codes in the response (`error_code`), as Kafka's group APIs carry them;
an `optional` field left out gets Kafka's default (`codec.present_or`).
"""

from __future__ import annotations

from typing import Any

from deltabus import config as cfg
from deltabus import errors
from deltabus.offsets.group_coordinator import wait_result
from deltabus.offsets.offset_store import OffsetAndMetadata
from deltabus.rpc import group_requests
from deltabus.rpc.access import Access, peer_host
from deltabus.rpc.codec import present_or
from deltabus.rpc.request_layer import RequestLayer
from deltabus.rpc.v1 import deltabus_pb2 as pb


class GroupServicerMixin:
    """The group calls of `DeltaBusServicer`."""

    _requests: RequestLayer

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

    def JoinGroup(self, request: pb.JoinGroupRequest, context: Any) -> pb.JoinGroupResponse:
        try:
            future, timeout_s = self._requests.groups.join_group(
                self._access(context), group_requests.JoinGroupRequest(
                    request.group_id, request.member_id, request.protocol_type,
                    [(p.name, p.metadata) for p in request.protocols],
                    session_timeout_ms=present_or(request, "session_timeout_ms",
                                                  cfg.SESSION_TIMEOUT_MS_DEFAULT),
                    rebalance_timeout_ms=request.rebalance_timeout_ms,
                    client_id=request.client_id, client_host=_peer_host(context)))
            result = wait_result(future, timeout_s)
        except errors.DeltaBusError as e:
            return pb.JoinGroupResponse(error_code=e.code, error_message=e.message,
                                        member_id=getattr(e, "member_id", ""))
        return pb.JoinGroupResponse(
            generation_id=result.generation_id, protocol_name=result.protocol_name,
            leader=result.leader_id, member_id=result.member_id,
            members=[pb.JoinGroupMember(member_id=m, metadata=md) for m, md in result.members])

    def SyncGroup(self, request: pb.SyncGroupRequest, context: Any) -> pb.SyncGroupResponse:
        try:
            future, timeout_s = self._requests.groups.sync_group(
                self._access(context), request.group_id, request.generation_id,
                request.member_id, {a.member_id: a.assignment for a in request.assignments})
            assignment = wait_result(future, timeout_s)
        except errors.DeltaBusError as e:
            return pb.SyncGroupResponse(error_code=e.code, error_message=e.message)
        return pb.SyncGroupResponse(assignment=assignment)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        try:
            self._requests.groups.heartbeat(self._access(context), request.group_id,
                                            request.generation_id, request.member_id)
        except errors.DeltaBusError as e:
            return pb.HeartbeatResponse(error_code=e.code, error_message=e.message)
        return pb.HeartbeatResponse()

    def LeaveGroup(self, request: pb.LeaveGroupRequest, context: Any) -> pb.LeaveGroupResponse:
        try:
            self._requests.groups.leave_group(self._access(context), request.group_id,
                                              list(request.member_ids))
        except errors.DeltaBusError as e:
            return pb.LeaveGroupResponse(error_code=e.code, error_message=e.message)
        return pb.LeaveGroupResponse()

    def OffsetCommit(self, request: pb.OffsetCommitRequest,
                     context: Any) -> pb.OffsetCommitResponse:
        answers, error = self._requests.groups.offset_commit(
            self._access(context), group_requests.OffsetCommitRequest(
                request.group_id, present_or(request, "generation_id", -1), request.member_id,
                [(p.topic, p.partition, OffsetAndMetadata(
                    p.committed_offset, present_or(p, "committed_leader_epoch", -1),
                    p.metadata)) for p in request.partitions]))
        return pb.OffsetCommitResponse(results=[
            pb.PartitionResult(topic=p.topic, partition=p.partition,
                               error_code=e.code if e else 0, error_message=e.message if e else "")
            for p in request.partitions
            for e in [answers.get((p.topic, p.partition), error)]])

    def OffsetFetch(self, request: pb.OffsetFetchRequest, context: Any) -> pb.OffsetFetchResponse:
        wanted = [(tp.topic, p) for tp in request.topic_partitions for p in tp.partitions]
        fetched, error = self._requests.groups.offset_fetch(self._access(context),
                                                            request.group_id, wanted or None)
        if error is not None:
            return pb.OffsetFetchResponse(error_code=error.code, error_message=error.message)
        return pb.OffsetFetchResponse(partitions=[pb.OffsetFetchPartition(
            topic=f.topic, partition=f.partition,
            committed_offset=f.committed.offset if f.committed else -1,
            committed_leader_epoch=f.committed.leader_epoch if f.committed else -1,
            metadata=f.committed.metadata if f.committed else "",
            commit_timestamp_ms=f.committed.commit_timestamp_ms if f.committed else -1)
            for f in fetched])

    def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsResponse:
        try:
            groups = self._requests.groups.list_groups(self._access(context),
                                                       list(request.states_filter))
        except errors.DeltaBusError as e:
            return pb.ListGroupsResponse(error_code=e.code, error_message=e.message)
        return pb.ListGroupsResponse(groups=[
            pb.ListedGroup(group_id=g, protocol_type=t, group_state=s) for g, t, s in groups])

    def DescribeGroups(self, request: pb.DescribeGroupsRequest,
                       context: Any) -> pb.DescribeGroupsResponse:
        response = pb.DescribeGroupsResponse()
        for described in self._requests.groups.describe_groups(self._access(context),
                                                               list(request.group_ids)):
            d = described.description
            if d is None:
                error = described.error or errors.UnknownServerError("no description")
                response.groups.append(pb.DescribedGroup(
                    group_id=described.group_id, error_code=error.code,
                    error_message=error.message))
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
        results = self._requests.groups.delete_groups(self._access(context),
                                                      list(request.group_ids))
        return pb.DeleteGroupsResponse(results=[
            pb.DeletedGroup(group_id=g, error_code=e.code if e else 0,
                            error_message=e.message if e else "")
            for g, e in results.items()])


def _peer_host(context: Any) -> str:
    """The client's address as Kafka's tools show it (`/127.0.0.1`)."""
    host = peer_host(context) if context is not None else ""
    return "/" + host if host else ""
