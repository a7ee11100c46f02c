"""Metadata records: every change to the controller's state, as a typed record.

Pure data (no I/O); built by the controller's handlers and applied by `MetadataState.replay`,
both in the driver. Names follow KRaft's metadata records where the concept matches.

Two kinds:
- persisted records go to the metadata log (`MetadataLog`, a Delta table) before they are
  replayed, so a restarted controller replays exactly what it had acknowledged;
- broker registration records (`RegisterBrokerRecord`, `FenceBrokerRecord`, ...) are replayed but
  never written: brokers register again at every start, so the log holds no broker.

Every record also has a serialized form (`serialize` / `deserialize`, Kafka's
MetadataRecordSerde): the UTF-8 JSON of its stored form for a persisted record, of its own fields
for a broker record. Heartbeat answers carry records so, and brokers replay them
(`metadata_loader`).

Invariants: the stored form of a persisted record is a JSON object whose `type` and keys are the
ones deltabus has always written (`to_stored` / `from_stored` are exact inverses on them, and a
field whose default is None is left out while None, as the old dict records left the key out), so
an existing data directory still loads; a bytes field is stored as base64 text. Records are
frozen and hold tuples, never lists: a record cannot change after it is built, and replaying it
cannot alias state to it. A SCRAM credential record holds a salt and keys, never a password, and
its repr shows none of them. An ACL record stores Kafka's wire codes as numbers and holds an ACL
that `AclBinding` accepts (the handler checked it). A client quota record's entity is one
`quotas.check_entity` accepts, and its value a positive number or None (removed).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from deltabus.metadata import BrokerEndpoint, ListenerEndpoint, TransactionMetadata
from deltabus.quotas import QuotaEntity
from deltabus.security.acls import AclBinding, Operation, PatternType, Permission, ResourceType

T = TypeVar("T")


class MetadataRecord:
    """The base of every record. `type` names the record in the log's `type` column."""

    type: ClassVar[str]
    persisted: ClassVar[bool] = True  # written to the metadata log before it is replayed
    # False for records brokers and clients never see: replaying them makes no new version.
    changes_image: ClassVar[bool] = True
    # Field name -> key in the stored JSON object, where the two differ.
    STORED_KEYS: ClassVar[Mapping[str, str]] = {}
    # Every record class is a dataclass: this tells type checkers so (`dataclasses.fields`).
    __dataclass_fields__: ClassVar[dict[str, Any]]


# ---- persisted records (the metadata log) ----------------------------------------------------

@dataclass(frozen=True)
class ClusterIdRecord(MetadataRecord):
    """The cluster's id, written once when the metadata log is new."""

    type: ClassVar[str] = "cluster"
    cluster_id: str


@dataclass(frozen=True)
class ProducerIdKeyRecord(MetadataRecord):
    """The key producer ids are bound to their principals with (producer_id_control), written
    once; brokers get it with the metadata to check a producer's id."""

    type: ClassVar[str] = "producer_id_key"
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class TopicRecord(MetadataRecord):
    """A new topic; its partitions and configs follow as their own records."""

    type: ClassVar[str] = "topic"
    name: str
    topic_id: str


@dataclass(frozen=True)
class PartitionRecord(MetadataRecord):
    """A new partition of a topic, with its whole state."""

    type: ClassVar[str] = "partition"
    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int


@dataclass(frozen=True)
class PartitionChangeRecord(MetadataRecord):
    """A change to a partition: a field left None stays as it was."""

    type: ClassVar[str] = "partition_change"
    STORED_KEYS: ClassVar[Mapping[str, str]] = {
        "adding_replicas": "adding", "removing_replicas": "removing"}
    topic: str
    partition: int
    leader: int | None = None
    leader_epoch: int | None = None
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    # A reassignment in progress: replicas being added (catching up) and to be removed after.
    adding_replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RemoveTopicRecord(MetadataRecord):
    """A topic deleted with all its partitions and configs."""

    type: ClassVar[str] = "remove_topic"
    name: str
    topic_id: str | None = None  # logs written before it was recorded lack it


@dataclass(frozen=True)
class ConfigRecord(MetadataRecord):
    """A topic config override set, or removed (`value` None: back to the cluster default)."""

    type: ClassVar[str] = "config"
    topic: str
    key: str
    value: str | None


@dataclass(frozen=True)
class GroupConfigRecord(MetadataRecord):
    """A group config set, or removed (`value` None: back to the broker's), as KRaft's
    ConfigRecord of a GROUP resource (kafka-configs.sh --entity-type groups)."""

    type: ClassVar[str] = "group_config"
    group: str
    key: str
    value: str | None


@dataclass(frozen=True)
class ProducerIdsRecord(MetadataRecord):
    """A block of producer ids reserved: ids below `producer_ids_end` are never handed out
    again, even by a restarted controller."""

    type: ClassVar[str] = "producer_ids"
    changes_image: ClassVar[bool] = False
    STORED_KEYS: ClassVar[Mapping[str, str]] = {"producer_ids_end": "end"}
    producer_ids_end: int


@dataclass(frozen=True)
class TransactionalIdRecord(MetadataRecord):
    """The producer id a transactional id always gets (an exactly-once pipeline that restarts
    writes with the same id and sequences, so the leaders drop what it wrote before)."""

    type: ClassVar[str] = "transactional_id"
    changes_image: ClassVar[bool] = False
    STORED_KEYS: ClassVar[Mapping[str, str]] = {"transactional_id": "id"}
    transactional_id: str
    producer_id: int


@dataclass(frozen=True)
class TransactionRecord(MetadataRecord):
    """A transactional id's whole transaction state, as Kafka's __transaction_state holds it
    (TransactionLogValue): its producer id and epoch, its state (`transaction_coordinator`'s
    names), timeout, the partitions (parallel `topics` / `partitions`) and groups it holds, and
    when it started (-1: none open) and last changed, in epoch ms. Brokers get it with the
    metadata: the image's `open_transactions` is built from the open ones."""

    type: ClassVar[str] = "transaction"
    STORED_KEYS: ClassVar[Mapping[str, str]] = {"transactional_id": "id"}
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    topics: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()
    groups: tuple[str, ...] = ()
    start_ms: int = -1
    update_ms: int = -1

    @classmethod
    def of(cls, txn: TransactionMetadata) -> TransactionRecord:
        parts = sorted(txn.partitions)
        return cls(txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.state,
                   txn.timeout_ms, tuple(t for t, _ in parts), tuple(p for _, p in parts),
                   tuple(sorted(txn.groups)), txn.start_ms, txn.update_ms)

    def metadata(self) -> TransactionMetadata:
        return TransactionMetadata(
            self.transactional_id, self.producer_id, self.producer_epoch, self.state,
            self.timeout_ms, frozenset(zip(self.topics, self.partitions, strict=True)),
            frozenset(self.groups), self.start_ms, self.update_ms)


@dataclass(frozen=True)
class TxnOffsetCommitRecord(MetadataRecord):
    """Offsets a transaction commits for a group (TxnOffsetCommit), held with the transaction
    until it ends: written to the group's committed offsets if it commits, dropped if it aborts.
    Parallel tuples, one entry per partition. Brokers never need them."""

    type: ClassVar[str] = "txn_offset_commit"
    changes_image: ClassVar[bool] = False
    STORED_KEYS: ClassVar[Mapping[str, str]] = {"transactional_id": "id"}
    transactional_id: str
    group_id: str
    topics: tuple[str, ...]
    partitions: tuple[int, ...]
    offsets: tuple[int, ...]
    leader_epochs: tuple[int, ...]
    metadata: tuple[str, ...]


@dataclass(frozen=True)
class UserScramCredentialRecord(MetadataRecord):
    """A user's SCRAM credential for one mechanism, set or replaced (Kafka's
    UserScramCredentialRecord): the salt and the keys derived from the salted password, never
    the password, which no server ever sees. Brokers get it with the metadata."""

    type: ClassVar[str] = "user_scram_credential"
    name: str
    mechanism: str  # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int


@dataclass(frozen=True)
class RemoveUserScramCredentialRecord(MetadataRecord):
    """A user's SCRAM credential for one mechanism removed (Kafka's
    RemoveUserScramCredentialRecord)."""

    type: ClassVar[str] = "remove_user_scram_credential"
    name: str
    mechanism: str


@dataclass(frozen=True)
class AccessControlEntryRecord(MetadataRecord):
    """An ACL created (KRaft's AccessControlEntryRecord), under an id of its own (a UUID) that
    its removal names. The enums are Kafka's codes (`deltabus.security.acls`). Brokers get it
    with the metadata."""

    type: ClassVar[str] = "access_control_entry"
    STORED_KEYS: ClassVar[Mapping[str, str]] = {"acl_id": "id"}
    acl_id: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    @classmethod
    def of(cls, acl_id: str, acl: AclBinding) -> AccessControlEntryRecord:
        return cls(acl_id, int(acl.resource_type), acl.resource_name, int(acl.pattern_type),
                   acl.principal, acl.host, int(acl.operation), int(acl.permission))

    def binding(self) -> AclBinding:
        return AclBinding(ResourceType(self.resource_type), self.resource_name,
                          PatternType(self.pattern_type), self.principal, self.host,
                          Operation(self.operation), Permission(self.permission))


@dataclass(frozen=True)
class RemoveAccessControlEntryRecord(MetadataRecord):
    """An ACL removed, by its id (KRaft's RemoveAccessControlEntryRecord)."""

    type: ClassVar[str] = "remove_access_control_entry"
    STORED_KEYS: ClassVar[Mapping[str, str]] = {"acl_id": "id"}
    acl_id: str


@dataclass(frozen=True)
class ClientQuotaRecord(MetadataRecord):
    """One quota of one entity set, or removed (`value` None), as KRaft's ClientQuotaRecord:
    the entity as its types and names (a name None: the default entity of that type), sorted
    by type. Brokers get the quotas with the metadata and throttle by them."""

    type: ClassVar[str] = "client_quota"
    entity_types: tuple[str, ...]
    entity_names: tuple[str | None, ...]
    key: str
    value: float | None

    @classmethod
    def of(cls, entity: QuotaEntity, key: str, value: float | None) -> ClientQuotaRecord:
        return cls(tuple(t for t, _ in entity.entries), tuple(n for _, n in entity.entries),
                   key, value)

    def entity(self) -> QuotaEntity:
        return QuotaEntity(tuple(zip(self.entity_types, self.entity_names, strict=True)))


@dataclass(frozen=True)
class SchemaRecord(MetadataRecord):
    """A schema registered as a subject's version (Confluent Schema Registry's SchemaValue), or
    that version soft-deleted (`deleted`: hidden from lists, its id still answers). The text is
    as registered; its references name other subjects' versions by the name the schema uses
    for them (three columns of one list). Brokers replay it too: typed topics decode with it."""

    type: ClassVar[str] = "schema"
    subject: str
    version: int
    schema_id: int
    schema_type: str
    schema: str
    reference_names: tuple[str, ...] = ()
    reference_subjects: tuple[str, ...] = ()
    reference_versions: tuple[int, ...] = ()
    deleted: bool = False


@dataclass(frozen=True)
class RemoveSchemaRecord(MetadataRecord):
    """A soft-deleted version of a subject deleted for good (Confluent's permanent delete)."""

    type: ClassVar[str] = "remove_schema"
    subject: str
    version: int


@dataclass(frozen=True)
class SchemaCompatibilityRecord(MetadataRecord):
    """A subject's compatibility level (subject "": the registry's global level), or the
    subject's own level removed (None: it follows the global one again)."""

    type: ClassVar[str] = "schema_compatibility"
    subject: str
    compatibility: str | None


# ---- broker registration records (replayed, never persisted) ---------------------------------

@dataclass(frozen=True)
class RegisterBrokerRecord(MetadataRecord):
    """A broker (re)started with a new epoch. It starts fenced, until it has applied
    `registered_version` (the metadata version when it registered)."""

    type: ClassVar[str] = "register_broker"
    persisted: ClassVar[bool] = False
    endpoint: BrokerEndpoint
    broker_epoch: int
    pid: int
    registered_version: int

    @property
    def broker_id(self) -> int:
        return self.endpoint.broker_id


@dataclass(frozen=True)
class UnfenceBrokerRecord(MetadataRecord):
    """A registered broker caught up with the metadata: it may lead and join ISRs."""

    type: ClassVar[str] = "unfence_broker"
    persisted: ClassVar[bool] = False
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class FenceBrokerRecord(MetadataRecord):
    """A broker declared dead (missed heartbeats, its task ended, or a new incarnation
    registered): its registration ends, so its epoch is stale and it must register again."""

    type: ClassVar[str] = "fence_broker"
    persisted: ClassVar[bool] = False
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class BrokerRegistrationChangeRecord(MetadataRecord):
    """A broker entered controlled shutdown: leadership moves off it, then it stops."""

    type: ClassVar[str] = "broker_registration_change"
    persisted: ClassVar[bool] = False
    broker_id: int
    broker_epoch: int
    in_controlled_shutdown: bool


@dataclass(frozen=True)
class OfflineReplicasRecord(MetadataRecord):
    """The replicas a broker reported it cannot serve, their tables missing or unreadable
    (Kafka's offline log dirs): they leave their ISRs and are never elected while reported."""

    type: ClassVar[str] = "offline_replicas"
    persisted: ClassVar[bool] = False
    broker_id: int
    broker_epoch: int
    replicas: frozenset[tuple[str, int]]  # (topic, partition)


PERSISTED_RECORD_TYPES: Mapping[str, type[MetadataRecord]] = {
    cls.type: cls for cls in (
        ClusterIdRecord, ProducerIdKeyRecord, TopicRecord, PartitionRecord,
        PartitionChangeRecord, RemoveTopicRecord, ConfigRecord, GroupConfigRecord,
        ProducerIdsRecord,
        TransactionalIdRecord, UserScramCredentialRecord, RemoveUserScramCredentialRecord,
        AccessControlEntryRecord, RemoveAccessControlEntryRecord, ClientQuotaRecord,
        TransactionRecord, TxnOffsetCommitRecord, SchemaRecord, RemoveSchemaRecord,
        SchemaCompatibilityRecord)
}

BROKER_RECORD_TYPES: Mapping[str, type[MetadataRecord]] = {
    cls.type: cls for cls in (
        RegisterBrokerRecord, UnfenceBrokerRecord, FenceBrokerRecord,
        BrokerRegistrationChangeRecord, OfflineReplicasRecord)
}


@dataclass(frozen=True)
class ControllerResult(Generic[T]):
    """What a handler returns (Kafka's ControllerResult): the records to write and replay, and
    the answer to give once they are committed."""

    records: Sequence[MetadataRecord]
    response: T


# The controller's commit path, as its managers are given it: write the persisted records to the
# metadata log, then replay them all (`Controller._commit`); called with the controller's lock.
CommitRecords = Callable[[Sequence[MetadataRecord]], None]


# ---- the stored form -------------------------------------------------------------------------

def to_stored(record: MetadataRecord) -> dict[str, Any]:
    """The JSON object the metadata log holds for `record`."""
    if not record.persisted:
        raise ValueError(f"{record.type} records are never written to the metadata log")
    stored: dict[str, Any] = {"type": record.type}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is None and f.default is None:
            continue
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii")
        stored[record.STORED_KEYS.get(f.name, f.name)] = value
    return stored


def from_stored(stored: Mapping[str, Any]) -> MetadataRecord:
    """The record a stored JSON object holds; keys it does not know are ignored."""
    kind = stored.get("type")
    cls = PERSISTED_RECORD_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown metadata record type {kind!r}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = cls.STORED_KEYS.get(f.name, f.name)
        if key in stored:
            value = stored[key]
            if f.type in ("bytes", bytes):
                value = _from_base64(value, cls.type, key)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def _from_base64(value: Any, kind: str, key: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ValueError(f"{kind} record: {key} is not base64") from None


# ---- the serialized form (what brokers are sent) ---------------------------------------------

def serialize(record: MetadataRecord) -> bytes:
    """`record` as a heartbeat answer carries it: a JSON object in UTF-8, the stored form for a
    persisted record; a broker record's endpoint is an object, its replicas [topic, partition]
    pairs."""
    if record.persisted:
        obj = to_stored(record)
    else:
        obj = {"type": record.type}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if isinstance(value, BrokerEndpoint):
                value = dataclasses.asdict(value)
            elif isinstance(value, frozenset):
                value = sorted([topic, partition] for topic, partition in value)
            obj[f.name] = value
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def deserialize(data: bytes) -> MetadataRecord:
    """The record `serialize` gave `data`; raises ValueError on anything else."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"a serialized metadata record is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError("a serialized metadata record is not a JSON object")
    cls = BROKER_RECORD_TYPES.get(obj.get("type"))  # type: ignore[arg-type]
    if cls is None:
        return from_stored(obj)
    try:
        values = {f.name: obj[f.name] for f in dataclasses.fields(cls)}
        if "endpoint" in values:
            endpoint = values["endpoint"]
            values["endpoint"] = BrokerEndpoint(**{**endpoint, "listeners": tuple(
                ListenerEndpoint(**e) for e in endpoint["listeners"])})
        if "replicas" in values:
            values["replicas"] = frozenset((t, p) for t, p in values["replicas"])
        return cls(**values)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{cls.type} record: {e!r}") from None
