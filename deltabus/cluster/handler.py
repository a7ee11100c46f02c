"""The contracts between the doors and the domain: what a server needs from the controller or a
broker, in domain types. `deltabus.rpc` decodes requests into these calls and encodes their
answers; the controller (driver) and `Broker` (executors) implement them.

Pure types: no grpc, no I/O, so the domain can implement them without knowing the transport.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
from deltabus.log_tables.control_records import TxnMarker
from deltabus.log_tables.partition_log import ActiveProducer, AppendResult, LogFile
from deltabus.log_tables.transactions import READ_UNCOMMITTED, AbortedTxn
from deltabus.metadata import (
    BalancePlan,
    BrokerEndpoint,
    LogReport,
    MetadataBatch,
    MetadataImage,
    MetadataPosition,
    NewTopic,
    PartitionState,
    ScaleStatus,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    ScramDescriptions,
    TopicResult,
    TransactionMetadata,
)
from deltabus.quotas import (
    ClientQuotaManager,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilterComponent,
)
from deltabus.records import ProducerState
from deltabus.schemas import Compatibility, SchemaReference, StoredSchema, SubjectVersion
from deltabus.security.acls import AclBinding, AclBindingFilter, AclCreation, Authorizer
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal
from deltabus.security.scram import ScramCredential


@dataclass(frozen=True)
class FetchSpec:
    topic: str
    partition: int
    offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1  # followers: the epoch of their last record
    log_start_offset: int = -1  # followers: their log start offset (-1: not said)
    isolation_level: int = READ_UNCOMMITTED  # READ_COMMITTED: up to the last stable offset


@dataclass
class FetchResult:
    topic: str
    partition: int
    error: errors.DeltaBusError | None = None
    records: pa.Table | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end offset) for a follower
    files: list[LogFile] | None = None  # for a follower: whole files instead of records
    last_stable_offset: int = -1  # consumers: the partition's LSO
    # read_committed: the aborted transactions with records among those read
    aborted_transactions: list[AbortedTxn] | None = None


# ---- share groups (KIP-932): what ShareFetch and ShareAcknowledge carry to a leader ----------

TopicPartition = tuple[str, int]

@dataclass(frozen=True)
class Acquired:
    """A run of acquired offsets with one delivery count (ShareFetch's AcquiredRecords)."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class AcknowledgementBatch:
    """Offsets first..last (inclusive) and their acknowledge types: one type for all, or one
    per offset, as ShareFetch and ShareAcknowledge carry them."""

    first_offset: int
    last_offset: int
    types: tuple[int, ...]


@dataclass(frozen=True)
class ShareFetchRequest:
    """A ShareFetch, as a door decoded it (topics by name)."""

    group_id: str
    member_id: str
    session_epoch: int
    max_wait_ms: int = 0
    min_bytes: int = 1
    max_bytes: int = cfg.FETCH_MAX_BYTES
    max_records: int = 500
    added: Sequence[TopicPartition] = ()  # partitions the session gains
    forgotten: Sequence[TopicPartition] = ()
    acknowledgements: dict[TopicPartition, list[AcknowledgementBatch]] = field(
        default_factory=dict)
    fetching: bool = True  # False: a ShareAcknowledge (acknowledgements only)


@dataclass
class SharePartitionData:
    """One partition's answer: an error, or the records acquired for the member (the read's
    rows of those offsets) with their runs and delivery counts; and its acknowledgements'."""

    topic: str
    partition: int
    error: errors.DeltaBusError | None = None
    acknowledged: bool = False  # the request carried acknowledgements for it
    acknowledge_error: errors.DeltaBusError | None = None
    records: pa.Table | None = None
    acquired: list[Acquired] = field(default_factory=list)


@dataclass
class ShareFetchAnswer:
    """A ShareFetch's answer once `waiting_on` are done (or at `deadline_s`): `complete()`."""

    error: errors.DeltaBusError | None
    waiting_on: list[futures.Future[None]]
    deadline_s: float
    complete: Callable[[], list[SharePartitionData]]
    lock_duration_ms: int = 0



@dataclass(frozen=True)
class ReplicaDescription:
    """One replica a broker hosts, as DescribeLogDirs tells of it."""

    topic: str
    partition: int
    size_bytes: int  # its table's live data files
    offset_lag: int  # Kafka's: high watermark minus log end offset, at least 0


@dataclass(frozen=True)
class LogDirDescription:
    """A broker's log dir (Kafka's DescribeLogDirs result): the replicas it hosts there, or
    `error` (KAFKA_STORAGE_ERROR) when it cannot tell."""

    log_dir: str
    replicas: list[ReplicaDescription]
    total_bytes: int = -1  # -1: unknown (an object store)
    usable_bytes: int = -1
    error: errors.DeltaBusError | None = None


class DeltaBusHandler(Protocol):
    """What a DeltaBus server needs from the domain (implemented by Controller and Broker)."""

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage: ...

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int,
                      validate_only: bool) -> list[TopicResult]: ...

    def delete_topics(self, names: list[str], *, timeout_ms: int) -> list[TopicResult]: ...

    def create_partitions(self, counts: dict[str, int], *, timeout_ms: int,
                          validate_only: bool) -> list[TopicResult]: ...

    def describe_configs(self, topics: list[str]) -> cfg.ConfigResults: ...

    def alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                      validate_only: bool) -> dict[str, errors.DeltaBusError | None]: ...

    def describe_group_configs(self, groups: list[str]) -> cfg.ConfigResults:
        """Each group's configs (kafka-configs.sh --entity-type groups), from the controller."""
        ...

    def alter_group_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                            validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        """Kafka's IncrementalAlterConfigs of GROUP resources, by the controller."""
        ...

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState, batch_bytes: int | None = None,
                timeout_ms: int | None = None, in_order: bool = False
                ) -> futures.Future[AppendResult]:
        """Append a produce batch as the client sent it (any subset of PRODUCE_SCHEMA's
        columns); the leader's log checks it after taking an idempotent producer's sequence
        numbers, so a refused batch uses them up, as Kafka's broker does for invalid records.
        `batch_bytes`: the batch's size on the wire where the client sent a record batch (the
        Kafka door), which the topic's max.message.bytes limits, as in Kafka; None: the size
        of the records as one uncompressed record batch. `timeout_ms`: what is left of the
        produce request's timeout, the longest an idempotent batch that came ahead of its
        sequence waits for its predecessor before OUT_OF_ORDER_SEQUENCE_NUMBER (None: the
        log's sequence wait alone); `in_order`: not at all, the door serving a connection's
        requests one after another (Kafka's)."""
        ...

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]:
        """Kafka's long poll, waited for on the caller's thread: `fetch_delayed`'s answer."""
        ...

    def fetch_delayed(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
                      max_bytes: int, replica_id: int) -> futures.Future[list[FetchResult]]:
        """Kafka's long poll with no thread waiting: a future of every partition's read,
        completed once min_bytes came back or a partition failed, else when max_wait_ms has
        passed (with what is there then). The doors that answer without holding a thread
        (the Kafka door's purgatory) wait on it."""
        ...

    def share_fetch(self, request: ShareFetchRequest) -> ShareFetchAnswer:
        """KIP-932's ShareFetch and ShareAcknowledge on the partitions' leader: the share
        session's epoch, acknowledgements, and records acquired for the member
        (cluster.share_partition_manager)."""
        ...

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     isolation_level: int = READ_UNCOMMITTED) -> tuple[int, int, int]: ...

    def delete_records(self, topic: str, partition: int, offset: int) -> futures.Future[int]:
        """Kafka's DeleteRecords on the partition's leader: the log start offset moves up to
        `offset` (-1: the high watermark). The future holds the low watermark once the ISR's
        replicas hold it (the doors bound the wait with the request's timeout)."""
        ...

    def offset_for_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int,
                                leader_epoch: int) -> tuple[int, int]:
        """(epoch, end offset): where `leader_epoch` ends in the leader's log, or (-1, -1)."""
        ...

    def describe_log_dirs(self, partitions: list[tuple[str, int]] | None
                          ) -> list[LogDirDescription]:
        """Kafka's DescribeLogDirs: this server's log dirs with the replicas it hosts (of
        `partitions` only, None: all); a server hosting none has no log dir."""
        ...

    def describe_producers(self, topic: str, partition: int) -> list[ActiveProducer]:
        """Kafka's DescribeProducers: the idempotent producers this server's replica of the
        partition knows; NOT_LEADER_OR_FOLLOWER where it hosts none."""
        ...

    def init_producer_id(self, transactional_id: str = "",
                         principal: KafkaPrincipal = ANONYMOUS) -> tuple[int, int]:
        """Kafka's InitProducerId for `principal` (with an authorizer, the id is bound to it)."""
        ...

    def producer_id_issued_to(self, producer_id: int, principal: KafkaPrincipal) -> bool:
        """Whether `producer_id` was issued to `principal` (checked, with an authorizer, on
        every idempotent batch: nobody produces under another's producer id)."""
        ...

    def elect_leaders(self, election_type: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]: ...

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int] | None]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Kafka's AlterPartitionReassignments, decided by the controller (brokers forward it):
        each partition's new replicas, or None to cancel the reassignment in progress (Kafka's
        null replicas; NO_REASSIGNMENT_IN_PROGRESS where none is)."""
        ...

    def scale_cluster(self, brokers: int | None) -> ScaleStatus:
        """Start a scale to `brokers` (None: only the status of the last one), decided in the
        driver (brokers forward it); answers at once with the status."""
        ...

    def balance_cluster(self, execute: bool) -> BalancePlan:
        """The balancer's plan over the brokers, started with `execute` (the controller's;
        brokers forward it)."""
        ...

    def reassignment_image(self, topics: list[str]) -> MetadataImage:
        """The controller's image of the topics named (all: []), for ListPartitionReassignments:
        Kafka forwards it to the controller, so a move the controller has finished is never
        listed by a broker whose metadata has not caught up yet."""
        ...

    def find_coordinator(self, group_id: str) -> BrokerEndpoint:
        """The server that coordinates a group (node id -1: the controller)."""
        ...

    def alter_user_scram_credentials(self, deletions: list[ScramCredentialDeletion],
                                     upsertions: list[ScramCredentialUpsertion]
                                     ) -> dict[str, errors.DeltaBusError | None]:
        """Kafka's AlterUserScramCredentials, decided by the controller (brokers forward it):
        None or the error per user. Returns once the live brokers hold the change, so a client
        can authenticate with a new password at once."""
        ...

    def describe_user_scram_credentials(self, users: list[str] | None) -> ScramDescriptions:
        """Kafka's DescribeUserScramCredentials, from this server's metadata (`users` None:
        every user with a credential): mechanisms and iteration counts, never salts or keys."""
        ...

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """What the doors' authenticators check a SCRAM exchange or a password against: the
        user's credential for `mechanism` in this server's metadata, None when it has none."""
        ...

    @property
    def schema_registry(self) -> SchemaRegistryHandler:
        """The schema registry, the controller's (a broker forwards every call to it)."""
        ...

    def authorizer(self) -> Authorizer | None:
        """What the doors check every request against (`rpc.access`): the cluster's ACLs in
        this server's metadata, or None when the cluster runs without an authorizer."""
        ...

    def create_acls(self, creations: list[AclCreation]) -> list[errors.DeltaBusError | None]:
        """Kafka's CreateAcls, decided by the controller (brokers forward it): None or the
        error per creation, in order. Returns once the live brokers hold the new ACLs."""
        ...

    def delete_acls(self, filters: list[AclBindingFilter]
                    ) -> list[list[AclBinding] | errors.DeltaBusError]:
        """Kafka's DeleteAcls, decided by the controller (brokers forward it): per filter, the
        ACLs it matched and removed, or its error. Returns once the live brokers dropped them."""
        ...

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """Kafka's DescribeAcls, from this server's metadata (what it authorizes with);
        INVALID_REQUEST for a filter holding an unknown code."""
        ...

    def alter_client_quotas(self, alterations: list[QuotaAlteration], *,
                            validate_only: bool) -> list[errors.DeltaBusError | None]:
        """Kafka's AlterClientQuotas, decided by the controller (brokers forward it): None or
        the error per entry, in order. Returns once the live brokers throttle by the change."""
        ...

    def describe_client_quotas(self, components: list[QuotaFilterComponent],
                               strict: bool) -> dict[QuotaEntity, dict[str, float]]:
        """Kafka's DescribeClientQuotas, from this server's metadata (what it throttles by);
        INVALID_REQUEST for a bad filter."""
        ...

    def client_quota_manager(self) -> ClientQuotaManager:
        """The quotas this server throttles by and the rates it measures (the doors record
        every produce, fetch and request against it)."""
        ...


TxnPartitionErrors = dict[tuple[str, int], errors.DeltaBusError | None]


class TransactionHandler(Protocol):
    """The transaction coordinator (the controller, in the driver), as the Kafka door calls
    it. Each raises the Kafka error of a refused request (INVALID_PRODUCER_ID_MAPPING,
    PRODUCER_FENCED, INVALID_TXN_STATE, CONCURRENT_TRANSACTIONS, ...)."""

    def init_transactional_producer(self, transactional_id: str, timeout_ms: int,
                                    principal: KafkaPrincipal = ANONYMOUS,
                                    expected: tuple[int, int] = (-1, -1)) -> tuple[int, int]:
        """InitProducerId with a transactional id: (producer id, epoch), the epoch bumped."""
        ...

    def add_partitions_to_txn(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, partitions: list[tuple[str, int]]
                              ) -> TxnPartitionErrors: ...

    def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           group_id: str) -> None: ...

    def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int,
                          producer_epoch: int,
                          offsets: dict[tuple[str, int], tuple[int, int, str]]
                          ) -> TxnPartitionErrors:
        """Offsets (offset, leader epoch, metadata) held until the transaction commits."""
        ...

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                committed: bool) -> None:
        """Returns once PrepareCommit/PrepareAbort is durable (the markers follow)."""
        ...

    def list_transactions(self, states: list[str], producer_ids: list[int],
                          duration_ms: int = -1) -> list[TransactionMetadata]: ...

    def pending_txn_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions an open transaction commits offsets of (OffsetFetch's
        require_stable answers them UNSTABLE_OFFSET_COMMIT)."""
        ...

    def describe_transactions(self, transactional_ids: list[str]
                              ) -> dict[str, TransactionMetadata | None]: ...


@runtime_checkable
class TxnMarkerHandler(Protocol):
    """What a broker answers the transaction coordinator: Kafka's WriteTxnMarkers."""

    def write_txn_markers(self, markers: list[TxnMarker], *, timeout_ms: int
                          ) -> dict[tuple[int, str, int], errors.DeltaBusError | None]:
        """Append each marker to each of its partitions led here; the outcome of each, by
        (producer id, topic, partition), once the ISR holds it or `timeout_ms` passed."""
        ...


class LifecycleHandler(Protocol):
    """What the controller answers brokers: registration, heartbeats, ISR changes."""

    def register_broker(self, endpoint: BrokerEndpoint, pid: int) -> int: ...

    def heartbeat(self, broker_id: int, epoch: int, applied_version: int, max_wait_ms: int,
                  offline_replicas: Collection[tuple[str, int]] = (), *,
                  position: MetadataPosition | None = None,
                  partition_loads: Mapping[tuple[str, int], float] | None = None,
                  log_reports: Mapping[tuple[str, int], LogReport] | None = None
                  ) -> tuple[bool, MetadataBatch | None, list[tuple[str, int]]]: ...

    def alter_partition(self, broker_id: int, broker_epoch: int, topic: str, partition: int,
                        leader_epoch: int, isr: list[int],
                        new_isr: list[int]) -> tuple[PartitionState, int]: ...


class SchemaRegistryHandler(Protocol):
    """Confluent Schema Registry's operations, as the REST door and the gRPC door call them.
    Refusals raise `schemas.SchemaRegistryError` with Confluent's error code. A version -1 is
    the subject's latest live one; `deleted` includes soft-deleted versions."""

    def register_schema(self, subject: str, schema_type: str, text: str,
                        references: Sequence[SchemaReference]) -> SubjectVersion: ...

    def lookup_schema(self, subject: str, schema_type: str, text: str,
                      references: Sequence[SchemaReference], deleted: bool) -> SubjectVersion:
        """The subject's version holding this schema (SCHEMA_NOT_FOUND where none does)."""
        ...

    def schema_by_id(self, schema_id: int, fmt: str = "") -> StoredSchema:
        """The schema with the id; `fmt` "serialized" gives a Protobuf schema as the base64
        of its FileDescriptorProto, as Confluent's `format` parameter does."""
        ...

    def schema_versions(self, schema_id: int, deleted: bool) -> list[SubjectVersion]: ...

    def subjects(self, deleted: bool, prefix: str) -> list[str]: ...

    def subject_versions(self, subject: str, deleted: bool) -> list[SubjectVersion]: ...

    def subject_version(self, subject: str, version: int, deleted: bool) -> SubjectVersion: ...

    def referenced_by(self, subject: str, version: int) -> list[int]: ...

    def test_compatibility(self, subject: str, version: int | None, schema_type: str,
                           text: str, references: Sequence[SchemaReference]) -> list[str]:
        """Why the schema could not be registered after the version (None: after the versions
        the subject's level checks); empty when it could."""
        ...

    def delete_schema_version(self, subject: str, version: int, permanent: bool) -> int: ...

    def delete_subject(self, subject: str, permanent: bool) -> list[int]: ...

    def compatibility_level(self, subject: str, default_to_global: bool) -> Compatibility:
        """The subject's level ("": the global one); where the subject has none of its own,
        the global one if `default_to_global`, else Confluent's 40408."""
        ...

    def set_compatibility_level(self, subject: str, level: str | None) -> Compatibility:
        """Set the subject's level ("": the global one); None removes the subject's own."""
        ...
