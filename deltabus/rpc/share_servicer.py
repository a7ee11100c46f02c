"""gRPC servicer methods of the share group calls (KIP-932): decode, call the request layer
(rpc/share_requests.py, where the rules and ACLs live), encode. A ShareFetch with nothing to
acquire waits here, on the server's thread, up to its max wait (while the server has long
polls to spare, as a Fetch does).

Errors travel as Kafka codes in the response (`error_code`, and each partition's
`acknowledge_error_code`), as Kafka's share APIs carry them.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

from deltabus import errors
from deltabus.cluster.handler import (
    AcknowledgementBatch,
    ShareFetchAnswer,
    ShareFetchRequest,
    SharePartitionData,
)
from deltabus.rpc import codec
from deltabus.rpc.access import Access, grpc_client_id
from deltabus.rpc.group_servicer import _peer_host
from deltabus.rpc.request_layer import RequestLayer
from deltabus.rpc.share_requests import ShareGroupHeartbeatRequest
from deltabus.rpc.v1 import deltabus_pb2 as pb


class ShareServicerMixin:
    """The share group calls of `DeltaBusServicer`."""

    _requests: RequestLayer
    _long_polls: threading.BoundedSemaphore

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

    def ShareGroupHeartbeat(self, request: pb.ShareGroupHeartbeatRequest,
                            context: Any) -> pb.ShareGroupHeartbeatResponse:
        try:
            result = self._requests.shares.heartbeat(
                self._access(context), ShareGroupHeartbeatRequest(
                    request.group_id, request.member_id, request.member_epoch,
                    rack_id=request.rack_id if request.HasField("rack_id") else None,
                    subscribed_topic_names=list(request.subscribed_topic_names.names)
                    if request.HasField("subscribed_topic_names") else None,
                    client_id=grpc_client_id(context) if context is not None else "",
                    client_host=_peer_host(context)))
        except errors.DeltaBusError as e:
            return pb.ShareGroupHeartbeatResponse(error_code=e.code, error_message=e.message,
                                                  member_id=request.member_id, member_epoch=-1)
        return pb.ShareGroupHeartbeatResponse(
            member_id=result.member_id, member_epoch=result.member_epoch,
            heartbeat_interval_ms=result.heartbeat_interval_ms,
            assignment_changed=result.assignment is not None,
            assignment=_topic_partitions(result.assignment or {}))

    def ShareGroupDescribe(self, request: pb.ShareGroupDescribeRequest,
                           context: Any) -> pb.ShareGroupDescribeResponse:
        access = self._access(context)
        response = pb.ShareGroupDescribeResponse()
        for group_id in request.group_ids:
            try:
                g = self._requests.shares.describe(access, group_id)
            except errors.DeltaBusError as e:
                response.groups.append(pb.DescribedShareGroup(
                    group_id=group_id, error_code=e.code, error_message=e.message,
                    group_state="Dead"))
                continue
            response.groups.append(pb.DescribedShareGroup(
                group_id=group_id, group_state=g.state, group_epoch=g.group_epoch,
                assignment_epoch=g.assignment_epoch, assignor_name="simple", members=[
                    pb.ShareGroupMember(
                        member_id=m.member_id, rack_id=m.rack_id or "",
                        member_epoch=m.member_epoch, client_id=m.client_id,
                        client_host=m.client_host,
                        subscribed_topic_names=m.subscribed_topic_names,
                        assignment=_topic_partitions(m.assigned))
                    for m in g.members.values()]))
        return response

    def ShareFetch(self, request: pb.ShareFetchRequest,
                   context: Any) -> pb.ShareFetchResponse:
        waits = request.max_wait_ms > 0 and self._long_polls.acquire(blocking=False)
        try:
            answer = self._requests.shares.share_fetch(
                self._access(context), ShareFetchRequest(
                    request.group_id, request.member_id, request.share_session_epoch,
                    max_wait_ms=request.max_wait_ms if waits else 0,
                    min_bytes=request.min_bytes, max_bytes=request.max_bytes or 2**31 - 1,
                    max_records=max(1, request.max_records),
                    added=[(p.topic, p.partition) for p in request.partitions],
                    forgotten=[(tp.topic, p) for tp in request.forgotten
                               for p in tp.partitions],
                    acknowledgements=_acknowledgements(request.partitions)))
            results = _results(answer)
        finally:
            if waits:
                self._long_polls.release()
        if answer.error is not None:
            return pb.ShareFetchResponse(error_code=answer.error.code,
                                         error_message=answer.error.message)
        record_format = request.format if request.HasField("format") else pb.PROTO
        return pb.ShareFetchResponse(
            acquisition_lock_timeout_ms=answer.lock_duration_ms,
            partitions=[_partition(r, record_format) for r in results])

    def ShareAcknowledge(self, request: pb.ShareAcknowledgeRequest,
                         context: Any) -> pb.ShareAcknowledgeResponse:
        answer = self._requests.shares.share_fetch(self._access(context), ShareFetchRequest(
            request.group_id, request.member_id, request.share_session_epoch,
            acknowledgements=_acknowledgements(request.partitions), fetching=False))
        results = _results(answer)
        if answer.error is not None:
            return pb.ShareAcknowledgeResponse(error_code=answer.error.code,
                                               error_message=answer.error.message)
        return pb.ShareAcknowledgeResponse(partitions=[
            _partition(r, pb.PROTO) for r in results if r.acknowledged])

    def DescribeShareGroupOffsets(self, request: pb.DescribeShareGroupOffsetsRequest,
                                  context: Any) -> pb.DescribeShareGroupOffsetsResponse:
        asked = [(tp.topic, p) for tp in request.topic_partitions for p in tp.partitions]
        try:
            found = self._requests.shares.describe_offsets(self._access(context),
                                                           request.group_id, asked or None)
        except errors.DeltaBusError as e:
            return pb.DescribeShareGroupOffsetsResponse(error_code=e.code,
                                                        error_message=e.message)
        response = pb.DescribeShareGroupOffsetsResponse()
        for (topic, partition), offset in sorted(found.items()):
            if isinstance(offset, errors.DeltaBusError):
                response.offsets.append(pb.ShareGroupOffset(
                    topic=topic, partition=partition, start_offset=-1, leader_epoch=-1, lag=-1,
                    error_code=offset.code, error_message=offset.message))
            else:
                response.offsets.append(pb.ShareGroupOffset(
                    topic=topic, partition=partition, start_offset=offset.start_offset,
                    leader_epoch=offset.leader_epoch, lag=offset.lag))
        return response

    def AlterShareGroupOffsets(self, request: pb.AlterShareGroupOffsetsRequest,
                               context: Any) -> pb.AlterShareGroupOffsetsResponse:
        try:
            results = self._requests.shares.alter_offsets(
                self._access(context), request.group_id,
                {(o.topic, o.partition): o.start_offset for o in request.offsets})
        except errors.DeltaBusError as e:
            return pb.AlterShareGroupOffsetsResponse(error_code=e.code, error_message=e.message)
        return pb.AlterShareGroupOffsetsResponse(results=[
            pb.PartitionResult(topic=t, partition=p, error_code=e.code if e else 0,
                               error_message=e.message if e else "")
            for (t, p), e in sorted(results.items())])

    def DeleteShareGroupOffsets(self, request: pb.DeleteShareGroupOffsetsRequest,
                                context: Any) -> pb.DeleteShareGroupOffsetsResponse:
        try:
            results = self._requests.shares.delete_offsets(
                self._access(context), request.group_id, list(request.topics))
        except errors.DeltaBusError as e:
            return pb.DeleteShareGroupOffsetsResponse(error_code=e.code,
                                                      error_message=e.message)
        return pb.DeleteShareGroupOffsetsResponse(results=[
            pb.TopicResult(name=t, error_code=e.code if e else 0,
                           error_message=e.message if e else "")
            for t, e in sorted(results.items())])


def _topic_partitions(assignment: dict[str, frozenset[int]]) -> list[pb.TopicPartitions]:
    return [pb.TopicPartitions(topic=t, partitions=sorted(ps))
            for t, ps in sorted(assignment.items())]


def _acknowledgements(partitions: Any) -> dict[tuple[str, int], list[AcknowledgementBatch]]:
    return {(p.topic, p.partition): [AcknowledgementBatch(b.first_offset, b.last_offset,
                                                          tuple(b.acknowledge_types))
                                     for b in p.acknowledgement_batches]
            for p in partitions if p.acknowledgement_batches}


def _results(answer: ShareFetchAnswer) -> list[SharePartitionData]:
    """The answer's partitions, once what it waits for is done or its deadline passed."""
    if answer.error is not None:
        return []
    pending = [f for f in answer.waiting_on if not f.done()]
    if pending:
        concurrent.futures.wait(pending, timeout=max(0.0, answer.deadline_s - time.monotonic()))
    return answer.complete()


def _partition(r: SharePartitionData, record_format: int) -> pb.SharePartitionData:
    entry = pb.SharePartitionData(
        topic=r.topic, partition=r.partition, error_code=r.error.code if r.error else 0,
        error_message=r.error.message if r.error else "",
        acknowledge_error_code=r.acknowledge_error.code if r.acknowledge_error else 0,
        acknowledge_error_message=r.acknowledge_error.message if r.acknowledge_error else "",
        acquired_records=[pb.AcquiredRecords(first_offset=a.first_offset,
                                             last_offset=a.last_offset,
                                             delivery_count=a.delivery_count)
                          for a in r.acquired])
    if r.acquired and r.records is not None and r.records.num_rows:
        if record_format == pb.PROTO:
            entry.records.extend(codec.table_to_records(r.records))
        else:
            entry.arrow_records = codec.table_to_arrow_records(r.records)
    return entry
