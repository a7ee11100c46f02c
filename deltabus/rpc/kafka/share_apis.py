"""Kafka's share group APIs (KIP-932, "Queues for Kafka") over the request layer's
(rpc/share_requests.py): ShareGroupHeartbeat and ShareGroupDescribe go to the group
coordinator in the driver (brokers forward them, as the other group APIs), ShareFetch and
ShareAcknowledge to the partitions' leaders, whose SharePartitionManager hands records out.

What librdkafka's share consumer relies on, kept here: topics are named by id; a partition's
`records` is never null (empty bytes instead); a ShareFetch with nothing to acquire waits for
its max wait (the client fetches again at once); a topic listed twice in one request (the client
lists added partitions and acknowledged ones apart) is merged; every partition that carried
acknowledgements is answered, with its acknowledge error.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from deltabus import errors
from deltabus.cluster.handler import (
    AcknowledgementBatch,
    ShareFetchAnswer,
    ShareFetchRequest,
    SharePartitionData,
)
from deltabus.rpc.access import Access, current_access
from deltabus.rpc.kafka import batches
from deltabus.rpc.kafka.delayed import DelayedResponse
from deltabus.rpc.kafka.frames import (
    NO_TIME,
    error_code,
    load_response_schema,
    make,
    millis,
    nested,
)
from deltabus.rpc.kafka.groups import heartbeat_response
from deltabus.rpc.share_requests import ShareGroupHeartbeatRequest, ShareRequests

SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79
DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS = 90, 91, 92
SUPPORTED: dict[int, tuple[int, int]] = {
    SHARE_GROUP_HEARTBEAT: (1, 1),
    SHARE_GROUP_DESCRIBE: (1, 1),
    SHARE_FETCH: (1, 1),
    SHARE_ACKNOWLEDGE: (1, 1),
    DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),
    ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    DELETE_SHARE_GROUP_OFFSETS: (0, 0),
}
COORDINATOR_APIS = frozenset({SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE,
                              DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS,
                              DELETE_SHARE_GROUP_OFFSETS})
ASSIGNOR = "simple"

TopicIds = tuple[dict[str, uuid.UUID], dict[uuid.UUID, str]]
Acknowledgements = dict[tuple[str, int], list[AcknowledgementBatch]]


class KafkaShareApis:
    """The share group APIs, codecs around the request layer's."""

    def __init__(self, requests: ShareRequests, topic_ids: Callable[[], TopicIds]) -> None:
        self._requests = requests
        self._topic_ids = topic_ids
        self.apis = {SHARE_GROUP_HEARTBEAT: self.share_group_heartbeat,
                     SHARE_GROUP_DESCRIBE: self.share_group_describe,
                     SHARE_FETCH: self.share_fetch, SHARE_ACKNOWLEDGE: self.share_acknowledge,
                     DESCRIBE_SHARE_GROUP_OFFSETS: self.describe_share_group_offsets,
                     ALTER_SHARE_GROUP_OFFSETS: self.alter_share_group_offsets,
                     DELETE_SHARE_GROUP_OFFSETS: self.delete_share_group_offsets}

    # ---- the coordinator's ---------------------------------------------------------------------

    def share_group_heartbeat(self, version: int, request: Any,
                              refused: errors.DeltaBusError | None = None,
                              client: tuple[str, str] = ("", "")) -> Any:
        cls = load_response_schema(SHARE_GROUP_HEARTBEAT, version)
        ids = self._topic_ids()[0]
        try:
            Access.raise_if(refused)
            result = self._requests.heartbeat(current_access(), ShareGroupHeartbeatRequest(
                request.group_id, request.member_id, request.member_epoch,
                rack_id=request.rack_id,
                subscribed_topic_names=None if request.subscribed_topic_names is None
                else list(request.subscribed_topic_names),
                client_id=client[0], client_host=client[1]))
        except errors.DeltaBusError as e:
            return heartbeat_response(cls, ids, e, request.member_id)
        return heartbeat_response(cls, ids, result)

    def share_group_describe(self, version: int, request: Any,
                             refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(SHARE_GROUP_DESCRIBE, version)
        group_cls, member_cls = nested(cls, "DescribedGroup"), nested(cls, "Member")
        ids = self._topic_ids()[0]
        described = []
        for group_id in request.group_ids:
            try:
                Access.raise_if(refused)
                g = self._requests.describe(current_access(), group_id)
            except errors.DeltaBusError as e:
                described.append(make(group_cls, error_code=error_code(e),
                                      error_message=e.message, group_id=group_id,
                                      group_state="Dead", group_epoch=-1, assignment_epoch=-1,
                                      assignor_name="", members=(),
                                      authorized_operations=-(2**31)))
                continue
            described.append(make(
                group_cls, error_code=ErrorCode.none, error_message=None, group_id=group_id,
                group_state=g.state, group_epoch=g.group_epoch,
                assignment_epoch=g.assignment_epoch, assignor_name=ASSIGNOR,
                authorized_operations=-(2**31), members=tuple(make(
                    member_cls, member_id=m.member_id, rack_id=m.rack_id,
                    member_epoch=m.member_epoch, client_id=m.client_id,
                    client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                    assignment=make(nested(cls, "Assignment"), topic_partitions=tuple(
                        make(nested(cls, "TopicPartitions"), topic_id=ids.get(t), topic_name=t,
                             partitions=tuple(sorted(ps)))
                        for t, ps in sorted(m.assigned.items()))))
                    for m in g.members.values())))
        return make(cls, throttle_time=NO_TIME, groups=tuple(described))

    def describe_share_group_offsets(self, version: int, request: Any,
                                     refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(DESCRIBE_SHARE_GROUP_OFFSETS, version)
        group_cls, topic_cls, partition_cls = (nested(cls, n) for n in (
            "DescribeShareGroupOffsetsResponseGroup", "DescribeShareGroupOffsetsResponseTopic",
            "DescribeShareGroupOffsetsResponsePartition"))
        ids = self._topic_ids()[0]
        groups = []
        for g in request.groups:
            asked = None if g.topics is None else [(t.topic_name, p) for t in g.topics
                                                   for p in t.partitions]
            try:
                Access.raise_if(refused)
                found = self._requests.describe_offsets(current_access(), g.group_id, asked)
            except errors.DeltaBusError as e:
                groups.append(make(group_cls, group_id=g.group_id, topics=(),
                                   error_code=error_code(e), error_message=e.message))
                continue
            by_topic: dict[str, list[Any]] = {}
            for (topic, p), offset in sorted(found.items()):
                failed = offset if isinstance(offset, errors.DeltaBusError) else None
                start, epoch, lag = ((-1, -1, -1) if isinstance(offset, errors.DeltaBusError)
                                     else (offset.start_offset, offset.leader_epoch, offset.lag))
                by_topic.setdefault(topic, []).append(make(
                    partition_cls, partition_index=p, start_offset=start, leader_epoch=epoch,
                    lag=lag, error_code=error_code(failed),
                    error_message=failed.message if failed else None))
            groups.append(make(group_cls, group_id=g.group_id, error_code=ErrorCode.none,
                               error_message=None, topics=tuple(
                                   make(topic_cls, topic_name=t, topic_id=ids.get(t),
                                        partitions=tuple(ps)) for t, ps in by_topic.items())))
        return make(cls, throttle_time=NO_TIME, groups=tuple(groups))

    def alter_share_group_offsets(self, version: int, request: Any,
                                  refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(ALTER_SHARE_GROUP_OFFSETS, version)
        topic_cls, partition_cls = (nested(cls, n) for n in (
            "AlterShareGroupOffsetsResponseTopic", "AlterShareGroupOffsetsResponsePartition"))
        ids = self._topic_ids()[0]
        offsets = {(t.topic_name, p.partition_index): p.start_offset
                   for t in request.topics for p in t.partitions}
        try:
            Access.raise_if(refused)
            results = self._requests.alter_offsets(current_access(), request.group_id, offsets)
        except errors.DeltaBusError as e:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(e),
                        error_message=e.message, responses=())
        by_topic: dict[str, list[Any]] = {}
        for (topic, p), error in sorted(results.items()):
            by_topic.setdefault(topic, []).append(make(
                partition_cls, partition_index=p, error_code=error_code(error),
                error_message=error.message if error else None))
        return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none, error_message=None,
                    responses=tuple(make(topic_cls, topic_name=t, topic_id=ids.get(t),
                                         partitions=tuple(ps)) for t, ps in by_topic.items()))

    def delete_share_group_offsets(self, version: int, request: Any,
                                   refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(DELETE_SHARE_GROUP_OFFSETS, version)
        topic_cls = nested(cls, "DeleteShareGroupOffsetsResponseTopic")
        ids = self._topic_ids()[0]
        try:
            Access.raise_if(refused)
            results = self._requests.delete_offsets(
                current_access(), request.group_id, [t.topic_name for t in request.topics])
        except errors.DeltaBusError as e:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(e),
                        error_message=e.message, responses=())
        return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none, error_message=None,
                    responses=tuple(make(topic_cls, topic_name=t, topic_id=ids.get(t),
                                         error_code=error_code(error),
                                         error_message=error.message if error else None)
                                    for t, error in sorted(results.items())))

    # ---- the leaders' --------------------------------------------------------------------------

    def share_fetch(self, version: int, request: Any,
                    refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(SHARE_FETCH, version)
        names = self._topic_ids()[1]
        unknown: set[tuple[uuid.UUID | None, int]] = set()
        added, acks = _partitions(request.topics, names, unknown)
        forgotten = [(names[t.topic_id], p) for t in request.forgotten_topics_data
                     for p in t.partitions if t.topic_id in names]
        answer = self._answer(refused, ShareFetchRequest(
            request.group_id or "", request.member_id or "", request.share_session_epoch,
            max_wait_ms=millis(request.max_wait, 0), min_bytes=request.min_bytes,
            max_bytes=request.max_bytes, max_records=max(1, request.max_records),
            added=added, forgotten=forgotten, acknowledgements=acks))
        return self._respond(answer, lambda: _share_fetch_response(
            cls, answer, self._topic_ids()[0], unknown))

    def share_acknowledge(self, version: int, request: Any,
                          refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(SHARE_ACKNOWLEDGE, version)
        names = self._topic_ids()[1]
        unknown: set[tuple[uuid.UUID | None, int]] = set()
        _, acks = _partitions(request.topics, names, unknown)
        answer = self._answer(refused, ShareFetchRequest(
            request.group_id or "", request.member_id or "", request.share_session_epoch,
            acknowledgements=acks, fetching=False))
        return self._respond(answer, lambda: _share_acknowledge_response(
            cls, answer, self._topic_ids()[0], unknown))

    def _answer(self, refused: errors.DeltaBusError | None,
                request: ShareFetchRequest) -> ShareFetchAnswer:
        if refused is not None:
            return ShareFetchAnswer(refused, [], 0.0, lambda: [])
        if not request.member_id:
            return ShareFetchAnswer(errors.InvalidRequestError("a share fetch names its member"),
                                    [], 0.0, lambda: [])
        try:
            return self._requests.share_fetch(current_access(), request)
        except errors.DeltaBusError as e:
            return ShareFetchAnswer(e, [], 0.0, lambda: [])

    @staticmethod
    def _respond(answer: ShareFetchAnswer, build: Callable[[], Any]) -> Any:
        pending = [f for f in answer.waiting_on if not f.done()]
        if not pending:
            return build()
        return DelayedResponse(pending, max(answer.deadline_s, time.monotonic()), build)


def _partitions(topics: Any, names: dict[uuid.UUID, str],
                unknown: set[tuple[uuid.UUID | None, int]]
                ) -> tuple[list[tuple[str, int]], Acknowledgements]:
    """The partitions a request names (a topic listed more than once merged), and their
    acknowledgements; partitions of topic ids the cluster does not have go to `unknown`."""
    added: list[tuple[str, int]] = []
    acks: Acknowledgements = {}
    for topic in topics:
        for p in topic.partitions:
            if topic.topic_id not in names:
                unknown.add((topic.topic_id, p.partition_index))
                continue
            tp = (names[topic.topic_id], p.partition_index)
            if tp not in added:
                added.append(tp)
            for b in p.acknowledgement_batches:
                acks.setdefault(tp, []).append(AcknowledgementBatch(
                    b.first_offset, b.last_offset, tuple(b.acknowledge_types)))
    for batch_list in acks.values():
        batch_list.sort(key=lambda b: b.first_offset)
    return added, acks


def _results(answer: ShareFetchAnswer) -> list[SharePartitionData]:
    return [] if answer.error is not None else answer.complete()


def _by_topic(results: list[SharePartitionData], ids: dict[str, uuid.UUID]
              ) -> dict[uuid.UUID | None, list[SharePartitionData]]:
    grouped: dict[uuid.UUID | None, list[SharePartitionData]] = {}
    for r in sorted(results, key=lambda r: (r.topic, r.partition)):
        grouped.setdefault(ids.get(r.topic), []).append(r)
    return grouped


def _share_fetch_response(cls: Any, answer: ShareFetchAnswer, ids: dict[str, uuid.UUID],
                          unknown: set[tuple[uuid.UUID | None, int]]) -> Any:
    topic_cls, partition_cls, acquired_cls, leader_cls = (nested(cls, n) for n in (
        "ShareFetchableTopicResponse", "PartitionData", "AcquiredRecords", "LeaderIdAndEpoch"))
    no_leader = leader_cls(leader_id=-1, leader_epoch=-1)

    def partition(r: SharePartitionData) -> Any:
        records = b""
        if r.acquired and r.records is not None and r.records.num_rows:
            records = batches.encode_fetch(r.records)
        return make(partition_cls, partition_index=r.partition, error_code=error_code(r.error),
                    error_message=r.error.message if r.error else None,
                    acknowledge_error_code=error_code(r.acknowledge_error).value,
                    acknowledge_error_message=(r.acknowledge_error.message
                                               if r.acknowledge_error else None),
                    current_leader=no_leader, records=records, acquired_records=tuple(
                        acquired_cls(first_offset=a.first_offset, last_offset=a.last_offset,
                                     delivery_count=a.delivery_count) for a in r.acquired))

    results = _results(answer)
    topics = [make(topic_cls, topic_id=topic_id, partitions=tuple(partition(r) for r in rs))
              for topic_id, rs in _by_topic(results, ids).items()]
    missing = errors.UnknownTopicIdError("the cluster has no topic of this id")
    topics += [make(topic_cls, topic_id=topic_id, partitions=(make(
        partition_cls, partition_index=p, error_code=error_code(missing),
        error_message=missing.message, acknowledge_error_code=error_code(missing).value,
        acknowledge_error_message=missing.message, current_leader=no_leader, records=b"",
        acquired_records=()),)) for topic_id, p in sorted(unknown, key=str)]
    return make(cls, throttle_time=NO_TIME, error_code=error_code(answer.error),
                error_message=answer.error.message if answer.error else None,
                acquisition_lock_timeout=timedelta(milliseconds=answer.lock_duration_ms),
                responses=tuple(topics), node_endpoints=())


def _share_acknowledge_response(cls: Any, answer: ShareFetchAnswer, ids: dict[str, uuid.UUID],
                                unknown: set[tuple[uuid.UUID | None, int]]) -> Any:
    topic_cls, partition_cls, leader_cls = (nested(cls, n) for n in (
        "ShareAcknowledgeTopicResponse", "PartitionData", "LeaderIdAndEpoch"))
    no_leader = leader_cls(leader_id=-1, leader_epoch=-1)
    results = [r for r in _results(answer) if r.acknowledged]
    topics = [make(topic_cls, topic_id=topic_id, partitions=tuple(make(
        partition_cls, partition_index=r.partition, error_code=error_code(r.acknowledge_error),
        error_message=r.acknowledge_error.message if r.acknowledge_error else None,
        current_leader=no_leader) for r in rs)) for topic_id, rs in _by_topic(results, ids).items()]
    missing = errors.UnknownTopicIdError("the cluster has no topic of this id")
    topics += [make(topic_cls, topic_id=topic_id, partitions=(make(
        partition_cls, partition_index=p, error_code=error_code(missing),
        error_message=missing.message, current_leader=no_leader),))
        for topic_id, p in sorted(unknown, key=str)]
    return make(cls, throttle_time=NO_TIME, error_code=error_code(answer.error),
                error_message=answer.error.message if answer.error else None,
                responses=tuple(topics), node_endpoints=())
