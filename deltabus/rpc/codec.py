"""Translation between protobuf messages and deltabus's domain types, in both directions.

Pure functions; used by servers and clients alike, so both sides read the wire the same way.
An `optional` request field the client left out reads as Kafka's default (`present_or`), never
as proto3's zero: a client written from the .proto alone gets what a Kafka client would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
from deltabus.metadata import (
    BalancePlan,
    BrokerEndpoint,
    BrokerLoad,
    ListenerEndpoint,
    MetadataBatch,
    MetadataImage,
    MetadataPosition,
    NewTopic,
    PartitionState,
    ScaleStatus,
    ScramCredentialDeletion,
    ScramCredentialInfo,
    ScramCredentialUpsertion,
    ScramDescriptions,
    TopicResult,
    TopicState,
    UserScramCredentialsDescription,
)
from deltabus.quotas import (
    ClientQuotas,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilterComponent,
)
from deltabus.records import (
    HEADERS_TYPE,
    UnpackBudget,
    check_header_count,
    check_record_count,
    from_ipc,
    to_ipc,
)
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclCreation,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    by_resource,
    from_code,
)

T = TypeVar("T")


def present_or(message: Any, field: str, default: T) -> T:
    """An `optional` field's value when the client set it (even to 0), else `default`."""
    return getattr(message, field) if message.HasField(field) else default


def topic_to_proto(topic: TopicState) -> pb.TopicMetadata:
    return pb.TopicMetadata(
        name=topic.name,
        topic_id=topic.topic_id,
        partitions=[
            pb.PartitionMetadata(
                partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                replicas=p.replicas, isr=p.isr, offline_replicas=p.offline_replicas,
                adding_replicas=p.adding_replicas, removing_replicas=p.removing_replicas,
                error_code=0 if p.leader >= 0 else errors.LeaderNotAvailableError.code,
            )
            for p in topic.partitions
        ],
        configs=topic.configs,
        is_internal=topic.name.startswith("__"),
    )


def listeners_to_proto(listeners: Iterable[ListenerEndpoint]) -> list[pb.ListenerEndpoint]:
    return [pb.ListenerEndpoint(name=e.name, door=e.door, host=e.host, port=e.port)
            for e in listeners]


def listeners_from_proto(listeners: Iterable[pb.ListenerEndpoint]
                         ) -> tuple[ListenerEndpoint, ...]:
    return tuple(ListenerEndpoint(e.name, e.door, e.host, e.port) for e in listeners)


def image_to_proto(image: MetadataImage, topics: list[str] | None = None,
                   refused: dict[str, errors.DeltaBusError] | None = None
                   ) -> pb.MetadataResponse:
    """Encode a metadata image; `topics` limits the topic list (unknown ones get error 3,
    `refused` ones their refusal). Users' SCRAM credentials and ACLs are never encoded here:
    this is what clients get (brokers are sent records instead, `metadata_batch_to_proto`);
    brokers' named listeners only where the image has them (a client's image is
    `MetadataImage.on_listener`'s, without)."""
    out = pb.MetadataResponse(
        brokers=[pb.BrokerInfo(broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack,
                               kafka_port=b.kafka_port,
                               listeners=listeners_to_proto(b.listeners))
                 for b in image.brokers],
        controller_id=image.controller_id,
        cluster_id=image.cluster_id,
        metadata_version=image.version,
        log_root=image.log_root,
    )
    for name in (topics if topics else sorted(image.topics)):
        topic = image.topics.get(name)
        if refused and name in refused:
            out.topics.append(pb.TopicMetadata(name=name, error_code=refused[name].code,
                                               error_message=refused[name].message))
        elif topic is None:
            out.topics.append(pb.TopicMetadata(
                name=name, error_code=errors.UnknownTopicOrPartitionError.code,
                error_message=f"Topic '{name}' does not exist."))
        else:
            out.topics.append(topic_to_proto(topic))
    return out


def image_from_proto(msg: pb.MetadataResponse) -> MetadataImage:
    topics = {}
    for t in msg.topics:
        if t.error_code:
            continue
        parts = tuple(
            PartitionState(p.partition, p.leader, p.leader_epoch, tuple(p.replicas),
                           tuple(p.isr), tuple(p.adding_replicas), tuple(p.removing_replicas))
            for p in sorted(t.partitions, key=lambda p: p.partition)
        )
        topics[t.name] = TopicState(t.name, t.topic_id, parts, dict(t.configs))
    brokers = tuple(BrokerEndpoint(b.broker_id, b.host, b.port, b.rack, b.kafka_port,
                                   listeners_from_proto(b.listeners))
                    for b in msg.brokers)
    return MetadataImage(msg.metadata_version, msg.cluster_id, msg.controller_id, brokers, topics,
                         msg.log_root)


def create_topics_request(topics: Iterable[NewTopic], timeout_ms: int,
                          validate_only: bool) -> pb.CreateTopicsRequest:
    return pb.CreateTopicsRequest(
        topics=[pb.CreatableTopic(
            name=t.name, num_partitions=t.num_partitions,
            replication_factor=t.replication_factor, configs=t.configs or {},
            assignments=[pb.CreatableReplicaAssignment(partition_index=p, broker_ids=brokers)
                         for p, brokers in sorted((t.replica_assignment or {}).items())])
            for t in topics],
        timeout_ms=timeout_ms, validate_only=validate_only)


def new_topic_from_proto(t: pb.CreatableTopic) -> NewTopic:
    """A topic to create; absent counts are -1, the cluster's defaults (num.partitions,
    default.replication.factor)."""
    assignment = {a.partition_index: list(a.broker_ids) for a in t.assignments}
    return NewTopic(t.name, present_or(t, "num_partitions", -1),
                    present_or(t, "replication_factor", -1), dict(t.configs), assignment or None)


def topic_result_from_proto(r: pb.TopicResult) -> TopicResult:
    error = errors.error_for_code(r.error_code, r.error_message) if r.error_code else None
    return TopicResult(r.name, error, r.topic_id, r.num_partitions, r.replication_factor)


def topic_result_to_proto(result: TopicResult) -> pb.TopicResult:
    return pb.TopicResult(
        name=result.name,
        error_code=result.error.code if result.error else 0,
        error_message=result.error.message if result.error else "",
        topic_id=result.topic_id,
        num_partitions=result.num_partitions,
        replication_factor=result.replication_factor,
    )


def produce_batch_from_proto(data: pb.PartitionProduceData,
                             budget: UnpackBudget | None = None) -> pa.Table:
    """The produce batch of one partition entry, from Arrow IPC or proto records, as the client
    sent it: the partition log checks its columns (`normalize_produce`) once it has taken the
    producer's sequence numbers, so a refused batch does not hold up the producer's next. What
    the request's compressed Arrow buffers unpack to counts against `budget`."""
    if data.arrow_records and len(data.records):
        raise errors.InvalidRequestError(
            "send either arrow_records or records for a partition, not both")
    if data.arrow_records:
        return from_ipc(data.arrow_records, budget)
    check_record_count(len(data.records))
    return records_to_table(data.records)


def records_to_table(records: Iterable[pb.Record]) -> pa.Table:
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    timestamps: list[int | None] = []
    headers: list[list[dict] | None] = []
    for r in records:
        check_header_count(len(r.headers))
        keys.append(r.key if r.HasField("key") else None)
        values.append(r.value if r.HasField("value") else None)
        timestamps.append(present_or(r, "timestamp_ms", None))
        headers.append([{"key": h.key, "value": present_or(h, "value", None)}
                        for h in r.headers] or None)
    return pa.table({
        "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()),
        "timestamp": pa.array(timestamps, pa.int64()).cast(pa.timestamp("ms", "UTC")),
        "headers": pa.array(headers, HEADERS_TYPE),
    })


def table_to_records(table: pa.Table) -> list[pb.Record]:
    """Fetched log records as proto records (for clients that do not speak Arrow)."""
    out = []
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    for row, t in zip(table.to_pylist(), ts, strict=True):
        record = pb.Record(offset=row["offset"], timestamp_ms=t // 1000,
                           timestamp_type=row["timestamp_type"])
        if row["key"] is not None:
            record.key = row["key"]
        if row["value"] is not None:
            record.value = row["value"]
        for h in row["headers"] or ():
            record.headers.append(pb.Header(key=h["key"], value=h["value"]))  # None: absent
        out.append(record)
    return out


def table_to_arrow_records(table: pa.Table) -> bytes:
    return to_ipc(table) if table.num_rows else b""


def topic_partitions_to_proto(partitions: Iterable[tuple[str, int]]
                              ) -> list[pb.TopicPartitions]:
    """(topic, partition) pairs as TopicPartitions, one per topic."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def topic_partitions_from_proto(messages: Iterable[pb.TopicPartitions]
                                ) -> list[tuple[str, int]]:
    return [(tp.topic, p) for tp in messages for p in tp.partitions]


def elect_leaders_request(election_type: str,
                          partitions: Iterable[tuple[str, int]] | None) -> pb.ElectLeadersRequest:
    if election_type not in ("preferred", "unclean"):
        raise errors.InvalidRequestError(
            f"election type must be preferred or unclean, not {election_type!r}")
    return pb.ElectLeadersRequest(
        election_type=pb.UNCLEAN if election_type == "unclean" else pb.PREFERRED,
        topic_partitions=topic_partitions_to_proto(partitions or ()))


def partition_results(results: dict[tuple[str, int], errors.DeltaBusError | None]
                      ) -> list[pb.PartitionResult]:
    return [pb.PartitionResult(topic=t, partition=p, error_code=e.code if e else 0,
                               error_message=e.message if e else "")
            for (t, p), e in results.items()]


def election_results(response: Any) -> dict[tuple[str, int], errors.DeltaBusError | None]:
    """Per-partition results (ElectLeaders, AlterPartitionReassignments) back to errors."""
    return {(r.topic, r.partition): (errors.error_for_code(r.error_code, r.error_message)
                                     if r.error_code else None)
            for r in response.results}


def reassignments_request(targets: Mapping[tuple[str, int], list[int] | None]
                          ) -> pb.AlterPartitionReassignmentsRequest:
    """None (cancel the reassignment in progress) goes as no replicas, so an empty list, which
    would read as a cancel, is refused here, as Kafka refuses an empty assignment."""
    for (t, p), r in targets.items():
        if r is not None and not r:
            raise errors.InvalidReplicaAssignmentError(
                f"The proposed assignment for {t}-{p} is empty; None cancels a reassignment.")
    return pb.AlterPartitionReassignmentsRequest(partitions=[
        pb.ReassignablePartition(topic=t, partition=p, replicas=r or [])
        for (t, p), r in targets.items()])


def reassignment_targets(request: pb.AlterPartitionReassignmentsRequest
                         ) -> dict[tuple[str, int], list[int] | None]:
    """No replicas: cancel the partition's reassignment in progress."""
    return {(p.topic, p.partition): list(p.replicas) or None for p in request.partitions}


# ---- topic configs (Kafka's DescribeConfigs and IncrementalAlterConfigs) ----------------------

TOPIC_RESOURCE, GROUP_RESOURCE = 2, 32  # Kafka's ConfigResource.Type.TOPIC and GROUP
CONFIG_SOURCES = {"DYNAMIC_TOPIC_CONFIG": 1, "STATIC_BROKER_CONFIG": 4, "DEFAULT_CONFIG": 5,
                  "GROUP_CONFIG": 8}
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "LONG": 5, "DOUBLE": 6, "LIST": 7}
CONFIG_OPS = {cfg.SET: 0, cfg.DELETE: 1, cfg.APPEND: 2, cfg.SUBTRACT: 3}
_SOURCE_NAMES = {v: k for k, v in CONFIG_SOURCES.items()}
_TYPE_NAMES = {v: k for k, v in CONFIG_TYPES.items()}
_OP_NAMES = {v: k for k, v in CONFIG_OPS.items()}

def describe_configs_request(topics: Iterable[str], resource_type: int = TOPIC_RESOURCE
                             ) -> pb.DescribeConfigsRequest:
    return pb.DescribeConfigsRequest(resources=[
        pb.DescribeConfigsResource(resource_type=resource_type, resource_name=t)
        for t in topics])


def describe_configs_response(results: cfg.ConfigResults) -> pb.DescribeConfigsResponse:
    response = pb.DescribeConfigsResponse()
    for name, result in results.items():
        out = response.results.add(resource_type=TOPIC_RESOURCE, resource_name=name)
        if isinstance(result, errors.DeltaBusError):
            out.error_code, out.error_message = result.code, result.message
            continue
        out.configs.extend(pb.DescribeConfigsEntry(
            name=e.name, value=e.value, read_only=e.read_only,
            config_source=CONFIG_SOURCES[e.source], is_sensitive=e.sensitive,
            synonyms=[pb.ConfigSynonym(name=n, value=v, source=CONFIG_SOURCES[s])
                      for s, n, v in e.synonyms],
            config_type=CONFIG_TYPES[e.type], documentation=e.doc) for e in result)
    return response


def describe_configs_results(response: pb.DescribeConfigsResponse) -> cfg.ConfigResults:
    results: cfg.ConfigResults = {}
    for r in response.results:
        if r.error_code:
            results[r.resource_name] = errors.error_for_code(r.error_code, r.error_message)
            continue
        results[r.resource_name] = [cfg.ConfigEntry(
            e.name, e.value, _SOURCE_NAMES.get(e.config_source, "UNKNOWN"),
            tuple((_SOURCE_NAMES.get(s.source, "UNKNOWN"), s.name, s.value)
                  for s in e.synonyms),
            _TYPE_NAMES.get(e.config_type, "STRING"), e.documentation, e.read_only,
            e.is_sensitive) for e in r.configs]
    return results


def alter_configs_request(changes: dict[str, list[cfg.AlterConfigOp]], validate_only: bool,
                          resource_type: int = TOPIC_RESOURCE
                          ) -> pb.IncrementalAlterConfigsRequest:
    request = pb.IncrementalAlterConfigsRequest(validate_only=validate_only)
    for topic, ops in changes.items():
        resource = request.resources.add(resource_type=resource_type, resource_name=topic)
        for op in ops:
            entry = resource.configs.add(name=op.name, config_operation=CONFIG_OPS[op.op])
            if op.value is not None:
                entry.value = op.value
    return request


def alter_configs_changes(resource: pb.AlterConfigsResource) -> list[cfg.AlterConfigOp]:
    """A resource's changes; an unknown operation number is kept as a name the controller
    refuses (INVALID_REQUEST)."""
    return [cfg.AlterConfigOp(c.name, _OP_NAMES.get(c.config_operation, str(c.config_operation)),
                              c.value if c.HasField("value") else None)
            for c in resource.configs]


def alter_configs_response(results: dict[str, errors.DeltaBusError | None]
                           ) -> pb.IncrementalAlterConfigsResponse:
    return pb.IncrementalAlterConfigsResponse(responses=[
        pb.AlterConfigsResourceResponse(
            error_code=e.code if e else 0, error_message=e.message if e else "",
            resource_type=TOPIC_RESOURCE, resource_name=name)
        for name, e in results.items()])


def alter_configs_results(response: pb.IncrementalAlterConfigsResponse
                          ) -> dict[str, errors.DeltaBusError | None]:
    return {r.resource_name: errors.error_for_code(r.error_code, r.error_message)
            if r.error_code else None for r in response.responses}


# ---- users' SCRAM credentials (Kafka's Alter/DescribeUserScramCredentials) --------------------

# Kafka's mechanism numbers; a number not listed reads as a name the controller refuses
# (UNSUPPORTED_SASL_MECHANISM).
SCRAM_MECHANISMS: dict[str, pb.ScramMechanism] = {
    "SCRAM-SHA-256": pb.SCRAM_SHA_256, "SCRAM-SHA-512": pb.SCRAM_SHA_512}
_SCRAM_MECHANISM_NAMES: dict[int, str] = {v: k for k, v in SCRAM_MECHANISMS.items()}


def scram_mechanism_name(number: int) -> str:
    return _SCRAM_MECHANISM_NAMES.get(number, f"UNKNOWN({number})")


def scram_mechanism_number(name: str) -> pb.ScramMechanism:
    return SCRAM_MECHANISMS.get(name, pb.SCRAM_MECHANISM_UNKNOWN)


def alter_scram_request(deletions: Iterable[ScramCredentialDeletion],
                        upsertions: Iterable[ScramCredentialUpsertion]
                        ) -> pb.AlterUserScramCredentialsRequest:
    return pb.AlterUserScramCredentialsRequest(
        deletions=[pb.ScramCredentialDeletion(name=d.name,
                                              mechanism=scram_mechanism_number(d.mechanism))
                   for d in deletions],
        upsertions=[pb.ScramCredentialUpsertion(
            name=u.name, mechanism=scram_mechanism_number(u.mechanism), iterations=u.iterations,
            salt=u.salt, salted_password=u.salted_password) for u in upsertions])


def scram_alterations(request: pb.AlterUserScramCredentialsRequest
                      ) -> tuple[list[ScramCredentialDeletion], list[ScramCredentialUpsertion]]:
    return ([ScramCredentialDeletion(d.name, scram_mechanism_name(d.mechanism))
             for d in request.deletions],
            [ScramCredentialUpsertion(u.name, scram_mechanism_name(u.mechanism), u.iterations,
                                      u.salt, u.salted_password) for u in request.upsertions])


def alter_scram_response(results: dict[str, errors.DeltaBusError | None]
                         ) -> pb.AlterUserScramCredentialsResponse:
    return pb.AlterUserScramCredentialsResponse(results=[
        pb.AlterUserScramCredentialsResult(user=user, error_code=e.code if e else 0,
                                           error_message=e.message if e else "")
        for user, e in results.items()])


def alter_scram_results(response: pb.AlterUserScramCredentialsResponse
                        ) -> dict[str, errors.DeltaBusError | None]:
    return {r.user: errors.error_for_code(r.error_code, r.error_message) if r.error_code
            else None for r in response.results}


def describe_scram_response(descriptions: ScramDescriptions
                            ) -> pb.DescribeUserScramCredentialsResponse:
    response = pb.DescribeUserScramCredentialsResponse()
    for user, d in descriptions.items():
        result = response.results.add(user=user)
        if isinstance(d, errors.DeltaBusError):
            result.error_code, result.error_message = d.code, d.message
            continue
        result.credential_infos.extend(
            pb.CredentialInfo(mechanism=scram_mechanism_number(i.mechanism),
                              iterations=i.iterations) for i in d.scram_credential_infos)
    return response


def describe_scram_results(response: pb.DescribeUserScramCredentialsResponse
                           ) -> ScramDescriptions:
    return {r.user: errors.error_for_code(r.error_code, r.error_message) if r.error_code
            else UserScramCredentialsDescription(r.user, tuple(
                ScramCredentialInfo(scram_mechanism_name(i.mechanism), i.iterations)
                for i in r.credential_infos))
            for r in response.results}


# ---- metadata records brokers are sent (internal API only) -----------------------------------

def position_to_proto(position: MetadataPosition) -> ipb.MetadataPosition:
    return ipb.MetadataPosition(version=position.version, index=position.index,
                                snapshot=position.snapshot)


def position_from_proto(msg: ipb.MetadataPosition) -> MetadataPosition:
    return MetadataPosition(msg.version, msg.index, msg.snapshot)


def metadata_batch_to_proto(batch: MetadataBatch) -> ipb.MetadataBatch:
    """A broker's metadata records, with users' SCRAM credentials and ACLs among them: only a
    heartbeat answer carries this, never a client's Metadata."""
    return ipb.MetadataBatch(start=position_to_proto(batch.start),
                             end=position_to_proto(batch.end), records=batch.records)


def metadata_batch_from_proto(msg: ipb.MetadataBatch) -> MetadataBatch:
    return MetadataBatch(position_from_proto(msg.start), position_from_proto(msg.end),
                         tuple(msg.records))


# ---- ACLs (Kafka's CreateAcls, DescribeAcls, DeleteAcls) -------------------------------------
# The proto enums hold Kafka's codes, so a value crosses as the same number; one this side does
# not know reads as UNKNOWN (`acls.from_code`) and the controller refuses it.

def _wire(code: int) -> Any:
    """A Kafka code as a proto enum field takes it: the same number."""
    return int(code)


def acl_to_proto(acl: AclBinding | AclCreation) -> pb.AclBinding:
    return pb.AclBinding(
        resource_type=_wire(acl.resource_type), resource_name=acl.resource_name,
        pattern_type=_wire(acl.pattern_type), principal=acl.principal, host=acl.host,
        operation=_wire(acl.operation), permission_type=_wire(acl.permission))


def acl_creation_from_proto(m: pb.AclBinding) -> AclCreation:
    """A creation as sent, unchecked (the controller checks it)."""
    return AclCreation(from_code(ResourceType, m.resource_type), m.resource_name,
                       from_code(PatternType, m.pattern_type), m.principal, m.host,
                       from_code(Operation, m.operation),
                       from_code(Permission, m.permission_type))


def acl_from_proto(m: pb.AclBinding) -> AclBinding:
    """An ACL a server answered with (it holds only valid ones)."""
    return AclBinding(ResourceType(m.resource_type), m.resource_name,
                      PatternType(m.pattern_type), m.principal, m.host, Operation(m.operation),
                      Permission(m.permission_type))


def acl_filter_to_proto(f: AclBindingFilter) -> pb.AclBindingFilter:
    out = pb.AclBindingFilter(
        resource_type=_wire(f.resource_type), pattern_type=_wire(f.pattern_type),
        operation=_wire(f.operation), permission_type=_wire(f.permission))
    for name in ("resource_name", "principal", "host"):
        value = getattr(f, name)
        if value is not None:
            setattr(out, name, value)
    return out


def acl_filter_from_proto(m: pb.AclBindingFilter) -> AclBindingFilter:
    """Absent name, principal and host match any; unknown codes read as UNKNOWN."""
    return AclBindingFilter(
        from_code(ResourceType, m.resource_type),
        m.resource_name if m.HasField("resource_name") else None,
        from_code(PatternType, m.pattern_type),
        m.principal if m.HasField("principal") else None,
        m.host if m.HasField("host") else None,
        from_code(Operation, m.operation), from_code(Permission, m.permission_type))


def create_acls_response(results: Iterable[errors.DeltaBusError | None]
                         ) -> pb.CreateAclsResponse:
    return pb.CreateAclsResponse(results=[
        pb.AclCreationResult(error_code=e.code if e else 0, error_message=e.message if e else "")
        for e in results])


def create_acls_results(response: pb.CreateAclsResponse) -> list[errors.DeltaBusError | None]:
    return [errors.error_for_code(r.error_code, r.error_message) if r.error_code else None
            for r in response.results]


def describe_acls_response(acls: Iterable[AclBinding] | errors.DeltaBusError
                           ) -> pb.DescribeAclsResponse:
    """Kafka's shape: the ACLs grouped by resource pattern."""
    if isinstance(acls, errors.DeltaBusError):
        return pb.DescribeAclsResponse(error_code=acls.code, error_message=acls.message)
    return pb.DescribeAclsResponse(resources=[
        pb.DescribeAclsResource(
            resource_type=_wire(t), resource_name=name, pattern_type=_wire(pattern),
            acls=[pb.AclDescription(principal=a.principal, host=a.host,
                                    operation=_wire(a.operation),
                                    permission_type=_wire(a.permission)) for a in entries])
        for (t, name, pattern), entries in by_resource(acls).items()])


def describe_acls_result(response: pb.DescribeAclsResponse) -> list[AclBinding]:
    """The ACLs described; raises the error the server answered."""
    if response.error_code:
        raise errors.error_for_code(response.error_code, response.error_message)
    return [AclBinding(ResourceType(r.resource_type), r.resource_name,
                       PatternType(r.pattern_type), a.principal, a.host, Operation(a.operation),
                       Permission(a.permission_type))
            for r in response.resources for a in r.acls]


def delete_acls_response(results: Iterable[list[AclBinding] | errors.DeltaBusError]
                         ) -> pb.DeleteAclsResponse:
    response = pb.DeleteAclsResponse()
    for r in results:
        if isinstance(r, errors.DeltaBusError):
            response.filter_results.add(error_code=r.code, error_message=r.message)
        else:
            response.filter_results.add(matching_acls=[acl_to_proto(a) for a in r])
    return response


def delete_acls_results(response: pb.DeleteAclsResponse
                        ) -> list[list[AclBinding] | errors.DeltaBusError]:
    return [errors.error_for_code(r.error_code, r.error_message) if r.error_code
            else [acl_from_proto(a) for a in r.matching_acls] for r in response.filter_results]


# ---- client quotas -----------------------------------------------------------------------------

def quota_entity_to_proto(entity: QuotaEntity) -> list[pb.ClientQuotaEntityPart]:
    return [pb.ClientQuotaEntityPart(entity_type=t, entity_name=n) if n is not None
            else pb.ClientQuotaEntityPart(entity_type=t) for t, n in entity.entries]


def quota_entity_from_proto(parts: Iterable[pb.ClientQuotaEntityPart]) -> QuotaEntity:
    """INVALID_REQUEST for an entity naming a type twice."""
    return QuotaEntity.of([(p.entity_type, p.entity_name if p.HasField("entity_name") else None)
                           for p in parts])


def alter_client_quotas_request(alterations: Iterable[QuotaAlteration],
                                validate_only: bool) -> pb.AlterClientQuotasRequest:
    return pb.AlterClientQuotasRequest(validate_only=validate_only, entries=[
        pb.ClientQuotaAlteration(entity=quota_entity_to_proto(a.entity), ops=[
            pb.ClientQuotaOp(key=k, value=v or 0.0, remove=v is None) for k, v in a.ops])
        for a in alterations])


def quota_alterations(request: pb.AlterClientQuotasRequest) -> list[QuotaAlteration]:
    return [QuotaAlteration(quota_entity_from_proto(e.entity), tuple(
        (op.key, None if op.remove else op.value) for op in e.ops)) for e in request.entries]


def alter_client_quotas_response(alterations: Iterable[QuotaAlteration],
                                 results: Iterable[errors.DeltaBusError | None]
                                 ) -> pb.AlterClientQuotasResponse:
    return pb.AlterClientQuotasResponse(entries=[
        pb.AlterClientQuotasEntryResult(error_code=e.code if e else 0,
                                        error_message=e.message if e else "",
                                        entity=quota_entity_to_proto(a.entity))
        for a, e in zip(alterations, results, strict=True)])


def alter_client_quotas_results(response: pb.AlterClientQuotasResponse
                                ) -> list[errors.DeltaBusError | None]:
    return [errors.error_for_code(e.error_code, e.error_message) if e.error_code else None
            for e in response.entries]


def quota_filter_to_proto(c: QuotaFilterComponent) -> pb.ClientQuotaFilterComponent:
    out = pb.ClientQuotaFilterComponent(entity_type=c.entity_type, match_type=c.match_type)
    if c.match is not None:
        out.match = c.match
    return out


def quota_filter_from_proto(c: pb.ClientQuotaFilterComponent) -> QuotaFilterComponent:
    return QuotaFilterComponent(c.entity_type, c.match_type,
                                c.match if c.HasField("match") else None)


def client_quotas_to_proto(quotas: ClientQuotas) -> list[pb.ClientQuotaEntry]:
    return [pb.ClientQuotaEntry(entity=quota_entity_to_proto(entity), values=[
        pb.ClientQuotaValue(key=k, value=v) for k, v in sorted(values.items())])
        for entity, values in sorted(quotas.items(), key=lambda item: item[0].sort_key())]


def client_quotas_from_proto(entries: Iterable[pb.ClientQuotaEntry]
                             ) -> dict[QuotaEntity, dict[str, float]]:
    return {quota_entity_from_proto(e.entity): {v.key: v.value for v in e.values}
            for e in entries}


def describe_client_quotas_response(quotas: ClientQuotas | errors.DeltaBusError
                                    ) -> pb.DescribeClientQuotasResponse:
    if isinstance(quotas, errors.DeltaBusError):
        return pb.DescribeClientQuotasResponse(error_code=quotas.code,
                                               error_message=quotas.message)
    return pb.DescribeClientQuotasResponse(entries=client_quotas_to_proto(quotas))


def describe_client_quotas_result(response: pb.DescribeClientQuotasResponse
                                  ) -> dict[QuotaEntity, dict[str, float]]:
    errors.check(response.error_code, response.error_message)
    return client_quotas_from_proto(response.entries)


# ---- brokers joining and leaving -------------------------------------------------------------

def scale_status_to_proto(status: ScaleStatus) -> pb.ScaleClusterResponse:
    return pb.ScaleClusterResponse(state=status.state, brokers=status.brokers, step=status.step,
                                   members=list(status.members))


def scale_status_from_proto(msg: pb.ScaleClusterResponse) -> ScaleStatus:
    return ScaleStatus(msg.state, msg.brokers, msg.step, tuple(msg.members))


def _loads_to_proto(loads: Iterable[BrokerLoad]) -> list[pb.BrokerLoad]:
    return [pb.BrokerLoad(broker_id=b.broker_id, rack=b.rack, replicas=b.replicas,
                          leaders=b.leaders, bytes_in_per_s=b.bytes_in_per_s) for b in loads]


def _loads_from_proto(loads: Iterable[pb.BrokerLoad]) -> list[BrokerLoad]:
    return [BrokerLoad(b.broker_id, b.rack, b.replicas, b.leaders, b.bytes_in_per_s)
            for b in loads]


def balance_plan_to_proto(plan: BalancePlan) -> pb.BalanceClusterResponse:
    return pb.BalanceClusterResponse(
        moves=[pb.ReassignablePartition(topic=t, partition=p, replicas=r)
               for (t, p), r in sorted(plan.moves.items())],
        before=_loads_to_proto(plan.before), after=_loads_to_proto(plan.after),
        unmet=plan.unmet, copies=plan.copies)


def balance_plan_from_proto(msg: pb.BalanceClusterResponse) -> BalancePlan:
    return BalancePlan({(m.topic, m.partition): list(m.replicas) for m in msg.moves},
                       _loads_from_proto(msg.before), _loads_from_proto(msg.after),
                       list(msg.unmet), msg.copies)
