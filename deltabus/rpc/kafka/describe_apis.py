"""Kafka's describe APIs a broker answers from what it holds itself, whichever broker the client
sent them to: DescribeLogDirs (its replicas' tables and their sizes), DescribeProducers (the
idempotent producers its replicas know) and DescribeTopicPartitions (its metadata image, paged
by cursor as KIP-966 pages it). Nothing here asks the controller or another broker, so each is
as cheap as a Metadata request; the bootstrap listener (the driver) hosts no replica: it has no
log dir and answers DescribeProducers with NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler, LogDirDescription
from deltabus.metadata import PartitionState, TopicState
from deltabus.rpc.access import current_access
from deltabus.rpc.kafka.admin import kafka_endpoints, topic_uuid
from deltabus.rpc.kafka.frames import NO_TIME, error_code, load_response_schema, make, nested
from deltabus.rpc.request_limits import check_partition_count
from deltabus.security.acls import Operation

DESCRIBE_LOG_DIRS, DESCRIBE_PRODUCERS, DESCRIBE_TOPIC_PARTITIONS = 35, 61, 75
SUPPORTED: dict[int, tuple[int, int]] = {
    DESCRIBE_LOG_DIRS: (1, 4),
    DESCRIBE_PRODUCERS: (0, 0),
    DESCRIBE_TOPIC_PARTITIONS: (0, 0),
}


class KafkaDescribeApis:
    """DescribeLogDirs, DescribeProducers, DescribeTopicPartitions. Thread-safe (no state of
    its own); `listener` names the Kafka listener it answers on, whose endpoints say which
    brokers are live."""

    def __init__(self, handler: DeltaBusHandler, listener: str = "") -> None:
        self._handler = handler
        self._listener = listener
        self.apis = {
            DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            DESCRIBE_PRODUCERS: self.describe_producers,
            DESCRIBE_TOPIC_PARTITIONS: self.describe_topic_partitions,
        }

    def describe_log_dirs(self, version: int, request: Any,
                          refused: errors.DeltaBusError | None = None) -> Any:
        """This broker's log dir and the size of each replica in it (kafka-log-dirs.sh
        --describe), for a principal allowed DESCRIBE on the cluster (`refused`: Kafka then
        answers no log dir, with CLUSTER_AUTHORIZATION_FAILED from v3 on)."""
        cls = load_response_schema(DESCRIBE_LOG_DIRS, version)
        if refused is not None:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(refused), results=())
        wanted = None if request.topics is None else [
            (t.topic, p) for t in request.topics for p in t.partitions]
        dirs = self._handler.describe_log_dirs(wanted)
        return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none,
                    results=tuple(_log_dir(cls, d) for d in dirs))

    def describe_producers(self, version: int, request: Any,
                           refused: errors.DeltaBusError | None = None) -> Any:
        """The idempotent producers of each partition (kafka-transactions.sh
        describe-producers), from this broker's replica of it, for a principal allowed READ on
        the topic. deltabus has no transactions: coordinator epoch and transaction start
        offset are -1."""
        cls = load_response_schema(DESCRIBE_PRODUCERS, version)
        topic_cls, partition_cls, state_cls = (nested(cls, n) for n in (
            "TopicResponse", "PartitionResponse", "ProducerState"))
        try:
            check_partition_count("DescribeProducers",
                                  sum(len(t.partition_indexes) for t in request.topics))
        except errors.DeltaBusError as e:
            refused = refused or e
        access = current_access()
        topics = []
        for t in request.topics:
            denied = refused or access.topic(Operation.READ, t.name)
            parts = []
            for index in t.partition_indexes:
                producers, error = [], denied
                if error is None:
                    try:
                        producers = self._handler.describe_producers(t.name, index)
                    except errors.DeltaBusError as e:
                        error = e
                parts.append(make(
                    partition_cls, partition_index=index, error_code=error_code(error),
                    error_message=error.message if error else None,
                    active_producers=tuple(make(
                        state_cls, producer_id=p.producer_id, producer_epoch=p.producer_epoch,
                        last_sequence=p.last_sequence, last_timestamp=p.last_timestamp_ms,
                        coordinator_epoch=-1, current_txn_start_offset=-1)
                        for p in producers)))
            topics.append(make(topic_cls, name=t.name, partitions=tuple(parts)))
        return make(cls, throttle_time=NO_TIME, topics=tuple(topics))

    def describe_topic_partitions(self, version: int, request: Any,
                                  refused: errors.DeltaBusError | None = None) -> Any:
        """The named topics (none: every topic the caller may DESCRIBE) in name order, with at
        most response_partition_limit partitions (max.request.partition.size.limit at most)
        from the cursor on, and the cursor of the rest, as Kafka's broker pages them. A named
        topic the caller may not DESCRIBE is TOPIC_AUTHORIZATION_FAILED, listed last."""
        cls = load_response_schema(DESCRIBE_TOPIC_PARTITIONS, version)
        every = not request.topics
        image = self._handler.metadata([], False)
        cursor = request.cursor
        first = cursor.topic_name if cursor is not None else ""
        names = sorted(n for n in (image.topics if every else {t.name for t in request.topics})
                       if n >= first)
        if refused is None and cursor is not None and (
                cursor.partition_index < 0 or (not every and cursor.topic_name not in names)):
            refused = errors.InvalidRequestError(
                "the cursor must name a requested topic and a partition index of 0 or more")
        if refused is not None:  # Kafka's error response: each requested topic with it
            return make(cls, throttle_time=NO_TIME, next_cursor=None, topics=tuple(
                _topic(cls, t.name, refused) for t in request.topics))
        access = current_access()
        denied = [n for n in names if access.topic(Operation.DESCRIBE, n) is not None]
        limit = max(1, min(cfg.MAX_REQUEST_PARTITION_SIZE_LIMIT,
                           request.response_partition_limit))
        live = {b.node_id for b in kafka_endpoints(image, self._listener)}
        topics, next_cursor = [], None
        for name in (n for n in names if n not in denied):
            if limit == 0:  # the next page starts with this topic
                next_cursor = make(nested(cls, "Cursor"), topic_name=name, partition_index=0)
                break
            state = image.topics.get(name)
            if state is None:
                if not every:
                    topics.append(_topic(cls, name, errors.UnknownTopicOrPartitionError(
                        f"unknown topic {name}")))
                continue
            start = cursor.partition_index if cursor is not None and name == first else 0
            rest = [p for p in state.partitions if p.partition >= start]
            topics.append(_described(cls, state, rest[:limit], live,
                                     access.topic_operations(name)))
            if len(rest) > limit:
                next_cursor = make(nested(cls, "Cursor"), topic_name=name,
                                   partition_index=rest[limit].partition)
                break
            limit -= len(rest)
        if not every:
            topics += [_topic(cls, n, errors.TopicAuthorizationFailedError(
                f"Not authorized to access topics: [{n}]")) for n in denied]
        return make(cls, throttle_time=NO_TIME, topics=tuple(topics), next_cursor=next_cursor)


def _log_dir(cls: Any, described: LogDirDescription) -> Any:
    """One DescribeLogDirsResult: the dir, its replicas by topic (none is a future replica)."""
    result_cls, topic_cls, partition_cls = (nested(cls, n) for n in (
        "DescribeLogDirsResult", "DescribeLogDirsTopic", "DescribeLogDirsPartition"))
    by_topic: dict[str, list[Any]] = {}
    for r in described.replicas:
        by_topic.setdefault(r.topic, []).append(make(
            partition_cls, partition_index=r.partition, partition_size=r.size_bytes,
            offset_lag=r.offset_lag, is_future_key=False))
    return make(result_cls, error_code=error_code(described.error), log_dir=described.log_dir,
                total_bytes=described.total_bytes, usable_bytes=described.usable_bytes,
                topics=tuple(make(topic_cls, name=t, partitions=tuple(ps))
                             for t, ps in by_topic.items()))


def _topic(cls: Any, name: str, error: errors.DeltaBusError) -> Any:
    """A topic DescribeTopicPartitions does not describe, with why (and no topic id)."""
    return make(nested(cls, "DescribeTopicPartitionsResponseTopic"), error_code=error_code(error),
                name=name, topic_id=None, is_internal=False, partitions=())


def _described(cls: Any, state: TopicState, partitions: list[PartitionState], live: set[int],
               operations: int) -> Any:
    """A topic DescribeTopicPartitions describes, with these of its partitions. deltabus has
    no eligible leader replicas (KIP-966's ELR): those lists are empty."""
    partition_cls = nested(cls, "DescribeTopicPartitionsResponsePartition")
    return make(
        nested(cls, "DescribeTopicPartitionsResponseTopic"), error_code=ErrorCode.none,
        name=state.name, topic_id=topic_uuid(state.topic_id), is_internal=False,
        topic_authorized_operations=operations, partitions=tuple(make(
            partition_cls, partition_index=p.partition,
            error_code=(ErrorCode.none if p.leader in live else ErrorCode.leader_not_available),
            leader_id=p.leader if p.leader in live else -1, leader_epoch=p.leader_epoch,
            replica_nodes=p.replicas, isr_nodes=p.isr, eligible_leader_replicas=(),
            last_known_elr=(), offline_replicas=tuple(r for r in p.replicas if r not in live))
            for p in partitions))
