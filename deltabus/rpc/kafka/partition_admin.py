"""Kafka's partition admin APIs over the handler calls gRPC's make: ElectLeaders (43, v0-2),
AlterPartitionReassignments (45, v0) and ListPartitionReassignments (46, v0), as
kafka-leader-election.sh, kafka-reassign-partitions.sh and the admin clients send them.

Checks (`KafkaApis._refusal`) are Kafka's: ALTER on the cluster to elect or reassign, DESCRIBE
on the cluster to list; a refusal answers the whole request and each partition named.

A reassignment runs in the controller as `deltabus reassign-partitions` runs it: the answer
comes once it is checked; a Spark job then copies the leader's files into the new replicas,
the controller records them as `adding` (and the replicas to drop as `removing`), and once
they are in sync the target list becomes the replicas. ListPartitionReassignments answers from
the controller's metadata (brokers forward it, as Kafka's do), so it lists a reassignment from
that record until it completes or is cancelled (not while the copy job that precedes it runs).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from deltabus import errors
from deltabus.rpc.access import current_access
from deltabus.rpc.admin_requests import AdminRequests
from deltabus.rpc.kafka.frames import NO_TIME, error_code, load_response_schema, make, nested

ELECT_LEADERS, ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS = 43, 45, 46
SUPPORTED: dict[int, tuple[int, int]] = {
    ELECT_LEADERS: (0, 2),
    ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    LIST_PARTITION_REASSIGNMENTS: (0, 0),
}
ELECTION_TYPES = {0: "preferred", 1: "unclean"}  # Kafka's ElectionType
PartitionResults = dict[tuple[str, int], errors.DeltaBusError | None]


def _message(error: errors.DeltaBusError | None) -> str | None:
    return error.message if error is not None else None


def _by_topic(results: PartitionResults) -> dict[str, list[tuple[int, Any]]]:
    topics: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for (topic, partition), error in results.items():
        topics[topic].append((partition, error))
    return topics


class KafkaPartitionAdminApis:
    """Thread-safe: it holds nothing but the handler."""

    def __init__(self, requests: AdminRequests) -> None:
        self._requests = requests
        self.apis = {
            ELECT_LEADERS: self.elect_leaders,
            ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
        }

    def elect_leaders(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        """PREFERRED: each partition's first replica leads again where it is live and in sync
        (PREFERRED_LEADER_NOT_AVAILABLE where not, ELECTION_NOT_NEEDED where it leads already).
        UNCLEAN: a partition without a live leader gets any live replica. No partitions named:
        all of them, answering only those whose election was needed, as Kafka does."""
        cls = load_response_schema(ELECT_LEADERS, version)
        named = (None if request.topic_partitions is None else list(dict.fromkeys(
            (t.topic, p) for t in request.topic_partitions for p in t.partitions)))
        election_type = ELECTION_TYPES.get(getattr(request, "election_type", 0))
        if refused is None and election_type is None:
            refused = errors.InvalidRequestError(
                f"unknown election type {request.election_type}")
        results: PartitionResults
        if refused is not None or named == []:  # an empty list names none (Kafka's null: all)
            results = dict.fromkeys(named or (), refused)
        else:
            assert election_type is not None
            try:
                results = self._requests.elect_leaders(current_access(), election_type, named)
            except errors.DeltaBusError as e:
                refused, results = e, dict.fromkeys(named or (), e)
            if named is None:
                results = {k: e for k, e in results.items()
                           if not isinstance(e, errors.ElectionNotNeededError)}
        topic_cls, partition_cls = (nested(cls, n) for n in ("ReplicaElectionResult",
                                                              "PartitionResult"))
        if version == 0 and refused is not None and named is None:
            refused = None  # v0 has no top-level error: nothing to answer
        return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                    replica_election_results=tuple(make(
                        topic_cls, topic=topic, partition_result=tuple(make(
                            partition_cls, partition_id=p, error_code=error_code(e),
                            error_message=_message(e)) for p, e in partitions))
                        for topic, partitions in _by_topic(results).items()))

    def alter_partition_reassignments(self, version: int, request: Any,
                                      refused: errors.DeltaBusError | None = None) -> Any:
        """Each partition's new replica list (the leader's files copied into the new replicas,
        which join and then replace the old), or null to cancel the one in progress: its
        replicas go back to those it started from (NO_REASSIGNMENT_IN_PROGRESS where none
        is). An empty list is INVALID_REPLICA_ASSIGNMENT, as in Kafka."""
        cls = load_response_schema(ALTER_PARTITION_REASSIGNMENTS, version)
        topic_cls, partition_cls = (nested(cls, n) for n in ("ReassignableTopicResponse",
                                                              "ReassignablePartitionResponse"))
        targets: dict[tuple[str, int], list[int] | None] = {
            (t.name, p.partition_index): None if p.replicas is None else list(p.replicas)
            for t in request.topics for p in t.partitions}
        results: PartitionResults = dict.fromkeys(targets, refused)
        if refused is None:
            for key in [k for k, r in targets.items() if r == []]:
                del targets[key]
                results[key] = errors.InvalidReplicaAssignmentError(
                    f"The proposed assignment for {key[0]}-{key[1]} is empty.")
            if targets:
                results.update(self._requests.reassign_partitions(current_access(), targets))
        return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                    error_message=_message(refused), responses=tuple(make(
                        topic_cls, name=topic, partitions=tuple(make(
                            partition_cls, partition_index=p, error_code=error_code(e),
                            error_message=_message(e)) for p, e in partitions))
                        for topic, partitions in _by_topic(results).items()))

    def list_partition_reassignments(self, version: int, request: Any,
                                     refused: errors.DeltaBusError | None = None) -> Any:
        """The reassignments in progress (the partitions named, or all): the replica list
        (old and new), the replicas being added and those to be removed. None: empty."""
        cls = load_response_schema(LIST_PARTITION_REASSIGNMENTS, version)
        topic_cls, partition_cls = (nested(cls, n) for n in ("OngoingTopicReassignment",
                                                              "OngoingPartitionReassignment"))
        if refused is not None:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                        error_message=refused.message, topics=())
        wanted = (None if request.topics is None
                  else {(t.name, p) for t in request.topics for p in t.partition_indexes})
        names = sorted({t for t, _ in wanted}) if wanted is not None else []
        image = self._requests.reassignment_image(current_access(), names)
        topics = []
        for name in sorted(image.topics):
            ongoing = tuple(
                make(partition_cls, partition_index=p.partition, replicas=p.replicas,
                     adding_replicas=p.adding_replicas, removing_replicas=p.removing_replicas)
                for p in image.topics[name].partitions
                if (p.adding_replicas or p.removing_replicas)
                and (wanted is None or (name, p.partition) in wanted))
            if ongoing:
                topics.append(make(topic_cls, name=name, partitions=ongoing))
        return make(cls, throttle_time=NO_TIME, error_code=error_code(None), error_message=None,
                    topics=tuple(topics))
