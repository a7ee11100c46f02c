"""What each Kafka API does, in terms of the same handler the gRPC server calls (a broker, or the
controller for the bootstrap listener): the Kafka door and the gRPC door reach the same
partitions, offsets and producer ids.

Each API answers every version kio has a schema for, one code path building the response with
the fields that version has (`frames.make`). The versions advertised through ApiVersions are the
ones current clients negotiate and the tests drive; a request outside them gets
UNSUPPORTED_VERSION in its response, as a Kafka broker answers it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import (
    DeltaBusHandler,
    FetchSpec,
    TransactionHandler,
)
from deltabus.log_tables.transactions import READ_UNCOMMITTED
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.records import UnpackBudget
from deltabus.rpc import request_layer, throttling
from deltabus.rpc.access import Access, current_access
from deltabus.rpc.admin_requests import AdminRequests
from deltabus.rpc.fetch_size import FetchBudget
from deltabus.rpc.kafka import (
    acl_apis,
    admin,
    batches,
    config_apis,
    describe_apis,
    groups,
    partition_admin,
    quota_apis,
    sasl,
    share_apis,
    txn_apis,
)
from deltabus.rpc.kafka.admin import (
    KafkaEndpoint,
    controller_id,
    coordinator_for,
    kafka_endpoints,
    topic_uuid,
)
from deltabus.rpc.kafka.delayed import DelayedResponse
from deltabus.rpc.kafka.fetch_sessions import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchContext,
    FetchSessionCache,
)
from deltabus.rpc.kafka.frames import (
    NO_TIME,
    error_code,
    load_response_schema,
    make,
    millis,
    nested,
)
from deltabus.security.acls import Authorizer

API_VERSIONS, METADATA, PRODUCE, FETCH, LIST_OFFSETS, INIT_PRODUCER_ID = 18, 3, 0, 1, 2, 22
OFFSET_FOR_LEADER_EPOCH, DELETE_RECORDS = 23, 21
# Kafka's cluster-wide APIs, by the request layer's names for them.
_CLUSTER_APIS = {
    partition_admin.ELECT_LEADERS: "ElectLeaders",
    partition_admin.ALTER_PARTITION_REASSIGNMENTS: "AlterPartitionReassignments",
    partition_admin.LIST_PARTITION_REASSIGNMENTS: "ListPartitionReassignments",
    admin.ALTER_USER_SCRAM_CREDENTIALS: "AlterUserScramCredentials",
    admin.DESCRIBE_USER_SCRAM_CREDENTIALS: "DescribeUserScramCredentials",
    acl_apis.CREATE_ACLS: "CreateAcls", acl_apis.DELETE_ACLS: "DeleteAcls",
    acl_apis.DESCRIBE_ACLS: "DescribeAcls",
    quota_apis.ALTER_CLIENT_QUOTAS: "AlterClientQuotas",
    quota_apis.DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas",
    admin.DESCRIBE_CLUSTER: "DescribeCluster", describe_apis.DESCRIBE_LOG_DIRS: "DescribeLogDirs",
}
OPERATIONS_NOT_ASKED = -(2**31)  # Kafka's authorized operations nobody asked for
# Fetch reads are sized in the broker's memory, where a record takes more than in a record batch
# (about 150 bytes against 110 for a 100-byte value): the door reads this share over each limit
# and cuts the encoding to it, so answers fill max.partition.fetch.bytes as Kafka's do.
READ_OVER_LIMIT = 1.5
# Advertised (API key -> (min, max)): what current kafka-python, librdkafka and KafkaJS use.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 17),
    LIST_OFFSETS: (1, 7),
    METADATA: (0, 12),
    API_VERSIONS: (0, 3),
    INIT_PRODUCER_ID: (0, 4),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    DELETE_RECORDS: (0, 2),
    **groups.SUPPORTED,
    **admin.SUPPORTED,
    **describe_apis.SUPPORTED,
    **config_apis.SUPPORTED,
    **partition_admin.SUPPORTED,
    **acl_apis.SUPPORTED,
    **quota_apis.SUPPORTED,
    **sasl.SUPPORTED,
    **txn_apis.SUPPORTED,
    **share_apis.SUPPORTED,
}


@dataclasses.dataclass(frozen=True)
class Unanswered:
    """No answer is due (a Produce with acks=0), but the connection is muted for
    `throttle_ms` (the producer is over its quota: KIP-219 mutes it without an answer)."""

    throttle_ms: int


class KafkaApis:
    """Answers decoded Kafka requests. Thread-safe: the listener's request handler threads call
    it, for one connection's requests one at a time."""

    def __init__(self, handler: DeltaBusHandler, groups_: GroupCoordinator | None = None,
                 listener: str = "", transactions: TransactionHandler | None = None) -> None:
        """`groups_` and `transactions`: the group and transaction coordinators, where this
        listener has them (the driver's); `listener`: the name of the Kafka listener this
        answers on, whose endpoints Metadata and FindCoordinator tell clients."""
        self._handler = handler
        self._requests = request_layer.RequestLayer(handler, groups_, transactions)
        self._listener = listener
        self.groups = groups.KafkaGroupApis(self._requests.groups)
        self.txn = txn_apis.KafkaTxnApis(self._requests.txn)
        self.groups.coordinator_for = self.coordinator_for
        self.groups.coordinated_by = self.txn.coordinated_by = self._coordinated_by
        self._sessions = FetchSessionCache()
        self._topic_id_maps: tuple[int, dict[str, uuid.UUID], dict[uuid.UUID, str]] | None = None
        self.groups.topic_ids = self._topic_ids
        shares = share_apis.KafkaShareApis(self._requests.shares, self._topic_ids)
        self._apis: dict[int, Callable[..., Any]] = {
            API_VERSIONS: self.api_versions, METADATA: self.metadata, PRODUCE: self.produce,
            FETCH: self.fetch, LIST_OFFSETS: self.list_offsets,
            INIT_PRODUCER_ID: self.init_producer_id,
            OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            DELETE_RECORDS: self.delete_records, **self.groups.apis,
            **admin.KafkaAdminApis(handler, self._requests.admin, listener).apis,
            **acl_apis.KafkaAclApis(self._requests.admin).apis,
            **describe_apis.KafkaDescribeApis(handler, listener).apis,
            **quota_apis.KafkaQuotaApis(self._requests.admin).apis,
            **config_apis.KafkaConfigApis(handler, self._requests.admin).apis,
            **partition_admin.KafkaPartitionAdminApis(self._requests.admin).apis, **self.txn.apis,
            **shares.apis,
        }

    def knows(self, api_key: int) -> bool:
        return api_key in self._apis

    def handle(self, api_key: int, version: int, request: Any,
               client: tuple[str, str] = ("", ""), node: int | None = None) -> Any:
        """The response to a request: a kio response, None where none is due (acks=0; an
        Unanswered where the connection is muted all the same), or a DelayedResponse where it
        waits for acks or a group (Produce, JoinGroup, SyncGroup).
        One outside the advertised versions gets UNSUPPORTED_VERSION. `client`: the header's
        client id and the client's host; `node`: the broker that forwarded the request."""
        lo, hi = SUPPORTED[api_key]
        refused = None if lo <= version <= hi else errors.UnsupportedVersionError(
            f"API {api_key} version {version} is not supported (versions {lo} to {hi} are)")
        refused = refused or self._refusal(api_key, request)
        started_s = time.thread_time()
        if api_key == groups.JOIN_GROUP:
            response = self.groups.join_group(version, request, refused, client)
        elif api_key == groups.CONSUMER_GROUP_HEARTBEAT:
            response = self.groups.consumer_group_heartbeat(version, request, refused, client)
        elif api_key == share_apis.SHARE_GROUP_HEARTBEAT:
            response = self._apis[api_key](version, request, refused, client)
        elif api_key in (groups.LIST_GROUPS, txn_apis.LIST_TRANSACTIONS):
            response = self._apis[api_key](version, request, refused, node)
        else:
            response = self._apis[api_key](version, request, refused)
        if api_key == API_VERSIONS or response is None or isinstance(response, Unanswered):
            return response
        throttle_ms = throttling.record_thread_time(self._handler, current_access(), started_s)
        if isinstance(response, DelayedResponse):
            if not throttle_ms:
                return response
            complete = response.complete
            return dataclasses.replace(response, complete=lambda: throttling.with_throttle_time(
                complete(), throttle_ms))
        return throttling.with_throttle_time(response, throttle_ms)

    def authorizer(self) -> Authorizer | None:
        return self._handler.authorizer()

    def coordinator_for(self, key: str) -> KafkaEndpoint | None:
        """The broker FindCoordinator names for a group or transactional id."""
        return coordinator_for(key, self._handler.metadata([], False), self._listener)

    def _coordinated_by(self, key: str, node: int) -> bool:
        found = self.coordinator_for(key)
        return found is not None and found.node_id == node

    @staticmethod
    def _refusal(api_key: int, request: Any) -> errors.DeltaBusError | None:
        """The refusal of a cluster-wide request (the request layer's CLUSTER_ACTIONS); the
        other APIs' checks are the layer's, per group, topic or transactional id."""
        api = _CLUSTER_APIS.get(api_key)
        return None if api is None else AdminRequests.cluster_refusal(current_access(), api)

    # ---- ApiVersions, Metadata ----------------------------------------------------------------

    def api_versions(self, version: int, request: Any,
                     refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(API_VERSIONS, version)
        entry = nested(cls, "ApiVersion")
        return make(cls, error_code=error_code(refused), throttle_time=NO_TIME,
                    api_keys=tuple(entry(api_key=k, min_version=lo, max_version=hi)
                                   for k, (lo, hi) in sorted(SUPPORTED.items())))

    def metadata(self, version: int, request: Any,
                 refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(METADATA, version)
        broker_cls, topic_cls, partition_cls = (nested(cls, n) for n in (
            "MetadataResponseBroker", "MetadataResponseTopic", "MetadataResponsePartition"))
        # v0: an empty list means every topic; v1 and later: a null list does.
        names = (None if request.topics is None or (version == 0 and not request.topics)
                 else [t.name for t in request.topics if t.name is not None])
        # v10+: a topic may be named by its id alone (librdkafka does, for the topics a
        # KIP-848 assignment names by id); one the cluster does not have is UNKNOWN_TOPIC_ID.
        by_id = [t.topic_id for t in request.topics or () if getattr(t, "name", "") is None]
        unknown_ids = []
        if by_id:
            id_names = self._topic_ids()[1]
            names = (names or []) + [id_names[i] for i in by_id if i in id_names]
            unknown_ids = [i for i in by_id if i not in id_names]
        auto_create = bool(getattr(request, "allow_auto_topic_creation", True))
        image, denied = self._requests.metadata(current_access(), names or [],
                                                auto_create and bool(names))
        brokers = tuple(make(broker_cls, node_id=b.node_id, host=b.host, port=b.port,
                             rack=b.rack) for b in kafka_endpoints(image, self._listener))
        live = {b.node_id for b in brokers}
        topics = []
        asked = bool(getattr(request, "include_topic_authorized_operations", False))
        for name in sorted(image.topics) if names is None else names:
            state = image.topics.get(name)
            if refused is not None or state is None or name in denied:
                error = refused or denied.get(name) or errors.UnknownTopicOrPartitionError(
                    f"unknown topic {name}")
                topics.append(make(topic_cls, error_code=error_code(error), name=name,
                                   topic_id=None, is_internal=False, partitions=()))
                continue
            partitions = tuple(make(
                partition_cls,
                error_code=(ErrorCode.none if p.leader in live
                            else ErrorCode.leader_not_available),
                partition_index=p.partition, leader_id=p.leader if p.leader in live else -1,
                leader_epoch=p.leader_epoch, replica_nodes=p.replicas, isr_nodes=p.isr,
                offline_replicas=tuple(r for r in p.replicas if r not in live))
                for p in state.partitions)
            topics.append(make(topic_cls, error_code=ErrorCode.none, name=name,
                               topic_id=topic_uuid(state.topic_id), is_internal=False,
                               partitions=partitions, topic_authorized_operations=(
                                   current_access().topic_operations(name) if asked
                                   else OPERATIONS_NOT_ASKED)))
        topics += [make(topic_cls, error_code=ErrorCode.unknown_topic_id, name=None,
                        topic_id=i, is_internal=False, partitions=()) for i in unknown_ids]
        return make(cls, throttle_time=NO_TIME, brokers=brokers,
                    cluster_id=image.cluster_id or None,
                    controller_id=controller_id(image, self._listener),
                    topics=tuple(topics))

    # ---- Produce ------------------------------------------------------------------------------

    def produce(self, version: int, request: Any,
                refused: errors.DeltaBusError | None = None) -> Any:
        """Decodes each partition's record batches for the request layer; answers once they
        are acknowledged as acks asks (a DelayedResponse: no thread waits for the acks), and
        not at all for acks=0, as Kafka."""
        cls = load_response_schema(PRODUCE, version)
        try:
            if refused is not None:
                raise refused
            answer = self._requests.produce(current_access(), request_layer.ProduceRequest(
                acks=request.acks, timeout_ms=millis(request.timeout,
                                                     cfg.PRODUCE_TIMEOUT_MS_DEFAULT),
                partitions=[request_layer.ProducePartition(
                    topic.name, data.index,
                    functools.partial(_request_batches, data.records or b""))
                    for topic in request.topic_data for data in topic.partition_data],
                transactional_id=request.transactional_id,
                transactional=any(batches.transactional(data.records or b"")
                                  for topic in request.topic_data
                                  for data in topic.partition_data),
                size_bytes=sum(len(data.records or b"") for topic in request.topic_data
                               for data in topic.partition_data), in_order=True))
        except errors.DeltaBusError as e:  # the whole request: each partition says so
            return _produce_response(cls, [
                request_layer.PartitionAppends(topic.name, data.index, error=e)
                for topic in request.topic_data for data in topic.partition_data],
                time.monotonic(), 0)
        if request.acks == 0:
            return Unanswered(answer.throttle_ms) if answer.throttle_ms else None
        complete = functools.partial(_produce_response, cls, answer.partitions,
                                     answer.deadline_s, answer.timeout_ms, answer.throttle_ms)
        if not answer.waiting_on:
            return complete()
        return DelayedResponse(answer.waiting_on, answer.deadline_s, complete)

    # ---- Fetch, ListOffsets -------------------------------------------------------------------

    def fetch(self, version: int, request: Any,
              refused: errors.DeltaBusError | None = None) -> Any:
        """Kafka's long poll over the handler's delayed fetch: up to the high watermark,
        waiting up to max_wait for min_bytes. A fetch that waits is a DelayedResponse (Kafka's
        DelayedFetch): no thread waits for it. v7 and later may fetch in an incremental fetch
        session (fetch_sessions), v13 and later name topics by id."""
        cls = load_response_schema(FETCH, version)
        ids, names = self._topic_ids() if version >= 13 else ({}, {})
        specs, unknown = _fetch_specs(request, names if version >= 13 else None)
        max_bytes = getattr(request, "max_bytes", 0) or cfg.FETCH_MAX_BYTES  # v3 and later
        access = current_access()
        context = FetchContext(specs)
        try:
            Access.raise_if(refused)
            self._requests.check_fetch([(s.topic, s.partition) for s in specs], max_bytes)
        except errors.DeltaBusError as e:  # refused whole: every partition answered with it
            return self._fetch_response(cls, context, request_layer.FetchAnswer(
                specs, {s.topic: e for s in specs}, max_bytes, 0.0, reading=None),
                access=access, invalid=e if refused is None else None, ids=ids, unknown=unknown)
        forgotten = [(names.get(f.topic_id, "") if version >= 13 else f.topic, p)
                     for f in getattr(request, "forgotten_topics_data", ()) or ()
                     for p in f.partitions]
        context = self._sessions.context(
            getattr(request, "session_id", INVALID_SESSION_ID),
            getattr(request, "session_epoch", FINAL_EPOCH), specs, forgotten,
            str(access.principal))
        if context.error is not None:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(context.error),
                        session_id=INVALID_SESSION_ID, responses=())
        try:
            answer = self._requests.fetch(access, request_layer.FetchRequest(
                context.specs, max_wait_ms=millis(request.max_wait), min_bytes=request.min_bytes,
                max_bytes=max_bytes, read_over=READ_OVER_LIMIT,
                isolation_level=getattr(request, "isolation_level", READ_UNCOMMITTED)))  # v4+
        except errors.DeltaBusError as e:  # a session grown past the partition limit
            return make(cls, throttle_time=NO_TIME, error_code=error_code(e),
                        session_id=INVALID_SESSION_ID, responses=())
        respond = functools.partial(self._fetch_response, cls, context, answer, access=access,
                                    invalid=None, ids=ids, unknown=unknown)
        if not answer.waiting_on:
            return respond()
        return DelayedResponse(answer.waiting_on, answer.deadline_s, respond)

    def _fetch_codecs(self, topics: set[str]) -> dict[str, int]:
        """The codec each topic's fetch answers are compressed with (its compression.type);
        topics whose records go as stored are left out."""
        image = self._handler.metadata([], False)
        out = {}
        for name in topics:
            state = image.topics.get(name)
            codec = batches.CODECS.get(state.configs.get("compression.type", "")) if state else 0
            if codec:
                out[name] = codec
        return out

    def _topic_ids(self) -> tuple[dict[str, uuid.UUID], dict[uuid.UUID, str]]:
        """Every topic's id by name, and the reverse, as Metadata tells clients (Fetch v13+
        names topics so): made once per metadata version, not per fetch (a consumer fetches
        many times a second, and a cluster may hold 10,000 topics)."""
        image = self._handler.metadata([], False)
        cached = self._topic_id_maps
        if cached is not None and cached[0] == image.version:
            return cached[1], cached[2]
        parsed = {name: topic_uuid(t.topic_id) for name, t in image.topics.items()}
        ids = {name: topic_id for name, topic_id in parsed.items() if topic_id is not None}
        names = {topic_id: name for name, topic_id in ids.items()}
        self._topic_id_maps = (image.version, ids, names)  # one store: racing makers agree
        return ids, names

    def _fetch_response(self, cls: Any, context: FetchContext, answer: request_layer.FetchAnswer,
                        *, access: Access, invalid: errors.DeltaBusError | None,
                        ids: dict[str, uuid.UUID], unknown: list[tuple[uuid.UUID, int]]) -> Any:
        """Fetch's answer from the layer's reads, within its byte limits and the consumer's
        quota; in a session, only what it must carry."""
        topic_cls, partition_cls = (nested(cls, n) for n in ("FetchableTopicResponse",
                                                              "PartitionData"))
        specs = answer.partitions
        results = answer.results()
        budget = FetchBudget(answer.max_bytes)  # Kafka's limits, on the record bytes it carries
        codecs = self._fetch_codecs({s.topic for s in specs})
        encoded: dict[tuple[str, int], bytes] = {}
        for spec, r in zip(specs, results, strict=True):
            # nothing new is an empty record set, never a null one: Kafka's brokers send that,
            # and librdkafka 2.0 (Debian's kcat) fails to parse a null
            records = b""
            if r.records is not None and r.records.num_rows:
                encode = functools.partial(batches.encode_fetch_sized,
                                           aborted=r.aborted_transactions or ())
                records = budget.fit_encoded(r.records, spec.max_bytes, encode)
                codec = codecs.get(r.topic, 0)
                if codec:
                    records = batches.compress_batches(records, codec)
            encoded[(r.topic, r.partition)] = records
        throttle_ms = self._requests.fetch_throttle_ms(access, sum(map(len, encoded.values())))
        if throttle_ms:  # Kafka's throttled fetch: no records, the same offsets next time
            self._sessions.discard(context)
            return make(cls, throttle_time=timedelta(milliseconds=throttle_ms),
                        error_code=ErrorCode.none, responses=(),
                        session_id=context.session_id if context.incremental else 0)
        by_topic: dict[str, list[Any]] = {}
        with_records = {p for p, records in encoded.items() if records}
        for r in self._sessions.answered(context, results, with_records):
            by_topic.setdefault(r.topic, []).append(make(
                partition_cls, partition_index=r.partition, error_code=error_code(r.error),
                high_watermark=r.high_watermark,
                last_stable_offset=(r.last_stable_offset if r.last_stable_offset >= 0
                                    else r.high_watermark),
                log_start_offset=r.log_start_offset,
                aborted_transactions=None if r.aborted_transactions is None else tuple(
                    make(nested(partition_cls, "AbortedTransaction"),
                         producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in r.aborted_transactions),
                preferred_read_replica=-1, records=encoded[(r.topic, r.partition)]))
        topics = [make(topic_cls, topic=name, topic_id=ids.get(name), partitions=tuple(parts))
                  for name, parts in by_topic.items()]
        for topic_id, partitions in _by_topic_id(unknown).items():
            topics.append(make(topic_cls, topic_id=topic_id, partitions=tuple(make(
                partition_cls, partition_index=p, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1,
                records=b"", error_code=error_code(errors.UnknownTopicIdError(
                    f"no topic has id {topic_id}")))
                for p in partitions)))
        return make(cls, throttle_time=NO_TIME, error_code=error_code(invalid),
                    session_id=context.session_id, responses=tuple(topics))

    def list_offsets(self, version: int, request: Any,
                     refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(LIST_OFFSETS, version)
        topic_cls, partition_cls = (nested(cls, n) for n in ("ListOffsetsTopicResponse",
                                                              "ListOffsetsPartitionResponse"))
        named = [(t.name, p.partition_index, p.timestamp) for t in request.topics
                 for p in t.partitions]
        try:
            if refused is not None:
                raise refused
            answers = self._requests.list_offsets(current_access(), request_layer.
                                                  ListOffsetsRequest(named, getattr(
                                                      request, "isolation_level",
                                                      READ_UNCOMMITTED)))
        except errors.DeltaBusError as e:  # the whole request: each partition says so
            answers = [request_layer.ListedOffset(t, p, error=e) for t, p, _ in named]
        by_topic: dict[str, list[Any]] = {}
        for entry in answers:
            by_topic.setdefault(entry.topic, []).append(make(
                partition_cls, partition_index=entry.partition,
                error_code=error_code(entry.error), timestamp=entry.timestamp,
                offset=entry.offset, leader_epoch=entry.leader_epoch))
        return make(cls, throttle_time=NO_TIME, topics=tuple(
            make(topic_cls, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()))

    def delete_records(self, version: int, request: Any,
                       refused: errors.DeltaBusError | None = None) -> Any:
        """DeleteRecords (kafka-delete-records.sh) through the request layer, answered once
        the ISR holds each new log start or the request's timeout passed: a DelayedResponse,
        no thread waits."""
        cls = load_response_schema(DELETE_RECORDS, version)
        named = [(t.name, p.partition_index, p.offset) for t in request.topics
                 for p in t.partitions]
        try:
            if refused is not None:
                raise refused
            answer = self._requests.delete_records(current_access(), request_layer.
                                                   DeleteRecordsRequest(named,
                                                                        millis(request.timeout)))
        except errors.DeltaBusError as e:  # the whole request: each partition says so
            answer = request_layer.DeleteRecordsAnswer(
                [request_layer.DeletedRecords(t, p, error=e) for t, p, _ in named],
                time.monotonic(), 0)
        complete = functools.partial(_delete_records_response, cls, answer)
        if not answer.waiting_on:
            return complete()
        return DelayedResponse(answer.waiting_on, answer.deadline_s, complete)

    def offset_for_leader_epoch(self, version: int, request: Any,
                                refused: errors.DeltaBusError | None = None) -> Any:
        """Where each asked epoch ends in the leader's log: consumers validate their position
        after a leader change with it (KIP-320); followers of deltabus use the gRPC door."""
        cls = load_response_schema(OFFSET_FOR_LEADER_EPOCH, version)
        topic_cls, partition_cls = (nested(cls, n) for n in ("OffsetForLeaderTopicResult",
                                                              "EpochEndOffset"))
        asked = [request_layer.EpochRequest(t.topic, p.partition, p.leader_epoch,
                                            getattr(p, "current_leader_epoch", -1))
                 for t in request.topics for p in t.partitions]
        answers = (self._requests.offset_for_leader_epoch(current_access(), asked)
                   if refused is None else [request_layer.EpochEndOffset(
                       a.topic, a.partition, error=refused) for a in asked])
        by_topic: dict[str, list[Any]] = {}
        for entry in answers:
            by_topic.setdefault(entry.topic, []).append(make(
                partition_cls, error_code=error_code(entry.error), partition=entry.partition,
                leader_epoch=entry.leader_epoch, end_offset=entry.end_offset))
        return make(cls, throttle_time=NO_TIME, topics=tuple(
            make(topic_cls, topic=name, partitions=tuple(parts))
            for name, parts in by_topic.items()))

    # ---- InitProducerId -----------------------------------------------------------------------

    def init_producer_id(self, version: int, request: Any,
                         refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(INIT_PRODUCER_ID, version)
        producer_id, epoch, error = ((-1, -1, refused) if refused is not None
                                     else self.txn.init_producer_id(version, request))
        return make(cls, throttle_time=NO_TIME, error_code=error_code(error),
                    producer_id=producer_id, producer_epoch=epoch)


def _fetch_specs(request: Any, names: dict[uuid.UUID, str] | None
                 ) -> tuple[list[FetchSpec], list[tuple[uuid.UUID, int]]]:
    """The partitions a Fetch names, and (v13+, `names` given) those of topic ids the cluster
    does not have, answered UNKNOWN_TOPIC_ID."""
    specs: list[FetchSpec] = []
    unknown: list[tuple[uuid.UUID, int]] = []
    for t in request.topics:
        name = t.topic if names is None else names.get(t.topic_id)
        for p in t.partitions:
            if name is None:
                unknown.append((t.topic_id, p.partition))
                continue
            specs.append(FetchSpec(name, p.partition, p.fetch_offset,
                                   p.partition_max_bytes or cfg.FETCH_PARTITION_MAX_BYTES,
                                   getattr(p, "current_leader_epoch", -1)))
    return specs, unknown


def _by_topic_id(partitions: list[tuple[uuid.UUID, int]]) -> dict[uuid.UUID, list[int]]:
    out: dict[uuid.UUID, list[int]] = {}
    for topic_id, partition in partitions:
        out.setdefault(topic_id, []).append(partition)
    return out


def _request_batches(records: bytes,
                     budget: UnpackBudget) -> list[request_layer.RequestBatch]:
    """A partition's record batches, for the request layer (which calls this only once the
    partition is allowed)."""
    return [request_layer.RequestBatch(b.records, b.producer, b.transactional, b.size_bytes)
            for b in batches.decode_produce(records, budget)]


def _produce_response(cls: Any, partitions: list[request_layer.PartitionAppends],
                      deadline_s: float, timeout_ms: int, throttle_ms: int = 0) -> Any:
    """Produce's answer once its appends are acknowledged or its timeout passed (Kafka's
    DelayedProduce): each partition's first batch's offsets, or its first error, with the
    records it names (v8+, KIP-467: INVALID_RECORD's record errors)."""
    topic_cls, partition_cls = (nested(cls, n) for n in (
        "TopicProduceResponse", "PartitionProduceResponse"))
    by_topic: dict[str, list[Any]] = {}
    for entry in partitions:
        result, error = entry.outcome(deadline_s, timeout_ms)
        by_topic.setdefault(entry.topic, []).append(make(
            partition_cls, index=entry.partition, error_code=error_code(error),
            base_offset=result.base_offset if result else -1, log_append_time=None,
            log_start_offset=result.log_start_offset if result else -1,
            record_errors=_record_errors(partition_cls, error),
            error_message=error.message if error else None))
    return make(cls, throttle_time=timedelta(milliseconds=throttle_ms), responses=tuple(
        make(topic_cls, name=name, partition_responses=tuple(parts))
        for name, parts in by_topic.items()))


def _record_errors(partition_cls: Any, error: errors.DeltaBusError | None) -> tuple[Any, ...]:
    """The records of its batch an INVALID_RECORD names, as Produce v8+ answers them (batch
    index, message); none for other errors, and for versions without the field."""
    if not isinstance(error, errors.InvalidRecordError) or not error.record_errors:
        return ()
    if "record_errors" not in {f.name for f in dataclasses.fields(partition_cls)}:
        return ()  # before v8
    entry_cls = nested(partition_cls, "BatchIndexAndErrorMessage")
    return tuple(entry_cls(batch_index=e.batch_index, batch_index_error_message=e.message)
                 for e in error.record_errors)


def _delete_records_response(cls: Any, answer: request_layer.DeleteRecordsAnswer) -> Any:
    """DeleteRecords' answer: each partition's low watermark, or its error (REQUEST_TIMED_OUT
    for one the ISR did not reach in time)."""
    topic_cls, partition_cls = (nested(cls, n) for n in (
        "DeleteRecordsTopicResult", "DeleteRecordsPartitionResult"))
    by_topic: dict[str, list[Any]] = {}
    for entry in answer.partitions:
        low_watermark, error = entry.outcome(answer.deadline_s, answer.timeout_ms)
        by_topic.setdefault(entry.topic, []).append(make(
            partition_cls, partition_index=entry.partition, low_watermark=low_watermark,
            error_code=error_code(error)))
    return make(cls, throttle_time=NO_TIME, topics=tuple(
        make(topic_cls, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()))
