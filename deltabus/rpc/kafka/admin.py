"""Kafka's admin APIs over the same handler calls as gRPC's: CreateTopics, DeleteTopics,
CreatePartitions, DescribeConfigs, DescribeCluster, and users' SCRAM credentials
(AlterUserScramCredentials, DescribeUserScramCredentials). Metadata names a live broker as the
controller, so Kafka's admin clients send these to a broker, which passes them to the
controller in the driver (as it does for gRPC); a broker answers DescribeUserScramCredentials
from its own metadata, as a KRaft broker does.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler
from deltabus.metadata import (
    MetadataImage,
    NewTopic,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    TopicResult,
    coordinator_node,
)
from deltabus.rpc import codec
from deltabus.rpc.access import current_access
from deltabus.rpc.admin_requests import AdminRequests, DescribedConfigs
from deltabus.rpc.kafka.frames import (
    NO_TIME,
    error_code,
    load_response_schema,
    make,
    millis,
    nested,
)

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, DESCRIBE_CONFIGS, DESCRIBE_CLUSTER = (
    19, 20, 37, 32, 60)
DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
ADMIN_TIMEOUT_MS = 30_000  # where a request gives none
SUPPORTED: dict[int, tuple[int, int]] = {
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (1, 4),
    DESCRIBE_CLUSTER: (0, 1),
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}


@dataclass(frozen=True)
class KafkaEndpoint:
    """A broker's Kafka listener, as Metadata and DescribeCluster list it."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


def kafka_endpoints(image: MetadataImage, listener: str = "") -> list[KafkaEndpoint]:
    """The live brokers' Kafka listener `listener`, the one the asking client came in on
    ("": the first; brokers without it are left out)."""
    out = []
    for b in image.brokers:
        address = b.kafka_address(listener)
        if address is not None:
            out.append(KafkaEndpoint(b.broker_id, address[0], address[1], b.rack or None))
    return out


def controller_id(image: MetadataImage, listener: str = "") -> int:
    """The node Kafka clients send controller requests to: a live broker (the lowest id), which
    passes them on to deltabus's controller in the driver; -1 when none is up."""
    return min((b.node_id for b in kafka_endpoints(image, listener)), default=-1)


def coordinator_for(key: str, image: MetadataImage, listener: str = "") -> KafkaEndpoint | None:
    """The broker FindCoordinator names for a group or transactional id, on the listener
    (`metadata.coordinator_node`; None: no broker is up)."""
    brokers = {b.node_id: b for b in kafka_endpoints(image, listener)}
    return brokers.get(coordinator_node(key, brokers))


def topic_uuid(topic_id: str) -> uuid.UUID | None:
    """A topic id as Kafka's UUID (None: none, or not one)."""
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        return None


def _message(error: errors.DeltaBusError | None) -> str | None:
    return error.message if error is not None else None


class KafkaAdminApis:
    def __init__(self, handler: DeltaBusHandler, requests: AdminRequests,
                 listener: str = "") -> None:
        self._listener = listener  # the Kafka listener's name: DescribeCluster names its brokers
        self._handler = handler
        self._requests = requests
        self.apis = {
            CREATE_TOPICS: self.create_topics, DELETE_TOPICS: self.delete_topics,
            CREATE_PARTITIONS: self.create_partitions, DESCRIBE_CONFIGS: self.describe_configs,
            DESCRIBE_CLUSTER: self.describe_cluster,
            DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
            ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
        }

    def create_topics(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(CREATE_TOPICS, version)
        result_cls = nested(cls, "CreatableTopicResult")
        wanted = [NewTopic(
            t.name, t.num_partitions, t.replication_factor,
            {c.name: c.value for c in t.configs if c.value is not None} or None,
            {a.partition_index: list(a.broker_ids) for a in t.assignments} or None)
            for t in request.topics]
        results = ([TopicResult(t.name, refused) for t in wanted] if refused is not None
                   else self._requests.create_topics(
                       current_access(), wanted, millis(request.timeout, ADMIN_TIMEOUT_MS),
                       bool(request.validate_only)))
        return make(cls, throttle_time=NO_TIME, topics=tuple(make(
            result_cls, name=r.name, topic_id=topic_uuid(r.topic_id),
            error_code=error_code(r.error), error_message=_message(r.error),
            num_partitions=r.num_partitions if r.error is None else -1,
            replication_factor=r.replication_factor if r.error is None else -1, configs=None)
            for r in results))

    def delete_topics(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(DELETE_TOPICS, version)
        result_cls = nested(cls, "DeletableTopicResult")
        names = ([t.name for t in request.topics] if hasattr(request, "topics")
                 else list(request.topic_names))
        named = [n for n in names if n is not None]
        results = ([(n, refused) for n in named] if refused is not None
                   else [(r.name, r.error) for r in self._requests.delete_topics(
                       current_access(), named, millis(request.timeout, ADMIN_TIMEOUT_MS))])
        return make(cls, throttle_time=NO_TIME, responses=tuple(make(
            result_cls, name=name, topic_id=None, error_code=error_code(error),
            error_message=_message(error)) for name, error in results))

    def create_partitions(self, version: int, request: Any,
                          refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(CREATE_PARTITIONS, version)
        result_cls = nested(cls, "CreatePartitionsTopicResult")
        counts = {t.name: t.count for t in request.topics}
        if any(t.assignments for t in request.topics) and refused is None:
            refused = errors.InvalidReplicaAssignmentError(
                "deltabus places new partitions itself: leave out the assignments")
        results = ([(n, refused) for n in counts] if refused is not None
                   else [(r.name, r.error) for r in self._requests.create_partitions(
                       current_access(), list(counts.items()),
                       millis(request.timeout, ADMIN_TIMEOUT_MS), bool(request.validate_only))])
        return make(cls, throttle_time=NO_TIME, results=tuple(make(
            result_cls, name=name, error_code=error_code(error), error_message=_message(error))
            for name, error in results))

    def describe_configs(self, version: int, request: Any,
                         refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(DESCRIBE_CONFIGS, version)
        result_cls, entry_cls = (nested(cls, n) for n in ("DescribeConfigsResult",
                                                          "DescribeConfigsResourceResult"))
        synonym_cls = nested(cls, "DescribeConfigsSynonym") if version >= 1 else None
        asked = [(r.resource_type, r.resource_name) for r in request.resources]
        found: DescribedConfigs = (dict.fromkeys(asked, refused) if refused is not None
                                   else self._requests.describe_configs(current_access(), asked))
        results = []
        for r in request.resources:
            entries = found[(r.resource_type, r.resource_name)]
            if isinstance(entries, errors.DeltaBusError):
                results.append(make(result_cls, error_code=error_code(entries),
                                    error_message=entries.message, resource_type=r.resource_type,
                                    resource_name=r.resource_name, configs=()))
                continue
            keys = set(r.configuration_keys or ())
            results.append(make(
                result_cls, error_code=ErrorCode.none, error_message=None,
                resource_type=r.resource_type, resource_name=r.resource_name, configs=tuple(
                    make(entry_cls, name=e.name, value=e.value, read_only=e.read_only,
                         config_source=codec.CONFIG_SOURCES[e.source],
                         is_default=e.source == "DEFAULT_CONFIG", is_sensitive=e.sensitive,
                         synonyms=tuple(
                             synonym_cls(name=n, value=v, source=codec.CONFIG_SOURCES[s])
                             for s, n, v in e.synonyms)
                         if synonym_cls is not None and request.include_synonyms else (),
                         config_type=codec.CONFIG_TYPES[e.type],
                         documentation=e.doc if getattr(request, "include_documentation",
                                                        False) else None)
                    for e in entries if not keys or e.name in keys)))
        return make(cls, throttle_time=NO_TIME, results=tuple(results))

    def describe_cluster(self, version: int, request: Any,
                         refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(DESCRIBE_CLUSTER, version)
        broker_cls = nested(cls, "DescribeClusterBroker")
        image = self._handler.metadata([], False)
        brokers = kafka_endpoints(image, self._listener)
        return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                    error_message=_message(refused), endpoint_type=1,
                    cluster_id=image.cluster_id or "",
                    controller_id=controller_id(image, self._listener),
                    brokers=tuple(make(broker_cls, broker_id=b.node_id, host=b.host,
                                       port=b.port, rack=b.rack) for b in brokers))

    def describe_user_scram_credentials(self, version: int, request: Any,
                                        refused: errors.DeltaBusError | None = None) -> Any:
        """Mechanisms and iteration counts per user (a null or empty list: every user)."""
        cls = load_response_schema(DESCRIBE_USER_SCRAM_CREDENTIALS, version)
        result_cls, info_cls = (nested(cls, n) for n in ("DescribeUserScramCredentialsResult",
                                                          "CredentialInfo"))
        if refused is not None:
            return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                        error_message=refused.message, results=())
        users = [u.name for u in request.users or ()]
        results = []
        described = self._requests.describe_user_scram_credentials(current_access(),
                                                                   users or None)
        for user, d in described.items():
            error = d if isinstance(d, errors.DeltaBusError) else None
            infos = () if isinstance(d, errors.DeltaBusError) else d.scram_credential_infos
            results.append(make(
                result_cls, user=user, error_code=error_code(error), error_message=_message(error),
                credential_infos=tuple(
                    make(info_cls, mechanism=codec.scram_mechanism_number(i.mechanism),
                         iterations=i.iterations) for i in infos)))
        return make(cls, throttle_time=NO_TIME, error_code=ErrorCode.none, error_message=None,
                    results=tuple(results))

    def alter_user_scram_credentials(self, version: int, request: Any,
                                     refused: errors.DeltaBusError | None = None) -> Any:
        """Upsertions carry the salted password the client computed, never the password."""
        cls = load_response_schema(ALTER_USER_SCRAM_CREDENTIALS, version)
        result_cls = nested(cls, "AlterUserScramCredentialsResult")
        deletions = [ScramCredentialDeletion(d.name, codec.scram_mechanism_name(d.mechanism))
                     for d in request.deletions]
        upsertions = [ScramCredentialUpsertion(
            u.name, codec.scram_mechanism_name(u.mechanism), u.iterations, u.salt,
            u.salted_password) for u in request.upsertions]
        results: dict[str, errors.DeltaBusError | None]
        if refused is not None:
            results = {name: refused for name in [*(d.name for d in deletions),
                                                  *(u.name for u in upsertions)]}
        else:
            results = self._requests.alter_user_scram_credentials(current_access(), deletions,
                                                                  upsertions)
        return make(cls, throttle_time=NO_TIME, results=tuple(
            make(result_cls, user=user, error_code=error_code(error),
                 error_message=_message(error)) for user, error in results.items()))
