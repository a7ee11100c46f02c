"""The controller's in-memory metadata: what replaying the metadata records gives.

Runs in the driver, and on executors: a broker replays the records the controller sends it into
a state of its own (`metadata_loader`), with the same `replay`, and builds its image from it with
the same `image`, so the two cannot differ. Loading after a restart is the same replay as
committing: the controller replays each persisted record read back from the metadata log, then
each record it commits. Only `MetadataState.replay` changes this state; the handlers read it and
return records. `snapshot` gives the records that rebuild what brokers see of it.

Invariants: partitions and registrations are frozen values (tuples, not lists), so a handler
cannot change them by accident and the image built from them shares nothing mutable; a partition
record's topic exists (replaying one for an unknown topic is a bug and raises); a removed SCRAM
credential existed (the handler checked it), and a user with none has no entry; every ACL is held
once, under one id, and a removed ACL existed (replaying one that breaks this is a bug and raises,
as KRaft's replay does).

Not thread-safe: the controller holds its lock around every read and replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deltabus.cluster.broker_registry import BrokerRegistry
from deltabus.cluster.metadata_records import (
    AccessControlEntryRecord,
    ClientQuotaRecord,
    ClusterIdRecord,
    ConfigRecord,
    GroupConfigRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdKeyRecord,
    ProducerIdsRecord,
    RemoveAccessControlEntryRecord,
    RemoveSchemaRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    SchemaCompatibilityRecord,
    SchemaRecord,
    TopicRecord,
    TransactionalIdRecord,
    TransactionRecord,
    TxnOffsetCommitRecord,
    UserScramCredentialRecord,
    from_stored,
)
from deltabus.cluster.schema_registry import SchemaRegistryState
from deltabus.metadata import (
    TXN_OPEN_STATES,
    MetadataImage,
    PartitionState,
    TopicState,
    TransactionMetadata,
)
from deltabus.quotas import QuotaEntity
from deltabus.security.acls import AclBinding
from deltabus.security.scram import ScramCredential


@dataclass(frozen=True)
class PartitionRegistration:
    """A partition as the controller holds it (Kafka's PartitionRegistration)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    # A reassignment in progress: replicas being added (catching up) and to be removed after.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """This partition with `change` applied (fields the change leaves None stay)."""
        updates = {f.name: getattr(change, f.name) for f in dataclasses.fields(self)
                   if getattr(change, f.name) is not None}
        return dataclasses.replace(self, **updates)

    def state(self, partition: int) -> PartitionState:
        return PartitionState(partition, self.leader, self.leader_epoch, self.replicas, self.isr,
                              self.adding_replicas, self.removing_replicas)


# A transaction's pending offsets: group -> (topic, partition) -> (offset, leader epoch, metadata)
PendingOffsets = dict[str, dict[tuple[str, int], tuple[int, int, str]]]


@dataclass
class TopicRegistration:
    topic_id: str
    partitions: dict[int, PartitionRegistration] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)  # overrides of the cluster defaults


@dataclass
class MetadataState:
    """Topics, partitions, configs, producer ids, users' SCRAM credentials, ACLs, client
    quotas and registered brokers."""

    cluster_id: str = ""
    topics: dict[str, TopicRegistration] = field(default_factory=dict)
    producer_ids_end: int = 0  # producer ids below this were handed out (or reserved)
    producer_id_key: bytes = field(default=b"", repr=False)  # binds ids to principals
    transactional_ids: dict[str, int] = field(default_factory=dict)
    # transactional id -> its transaction (Kafka's transaction coordinator's txnMetadataCache)
    transactions: dict[str, TransactionMetadata] = field(default_factory=dict)
    # transactional id -> offsets its open transaction commits (TxnOffsetCommit)
    txn_offsets: dict[str, PendingOffsets] = field(default_factory=dict)
    # user -> mechanism -> credential (Kafka's ScramControlManager.credentials)
    scram_credentials: dict[str, dict[str, ScramCredential]] = field(default_factory=dict)
    # id -> ACL (Kafka's AclControlManager.idToAcl), and each ACL's id
    acls: dict[str, AclBinding] = field(default_factory=dict)
    acl_ids: dict[AclBinding, str] = field(default_factory=dict)
    # entity -> quota key -> value (KRaft's ClientQuotaControlManager.clientQuotaData); an
    # entity with no quota left has no entry
    client_quotas: dict[QuotaEntity, dict[str, float]] = field(default_factory=dict)
    group_configs: dict[str, dict[str, str]] = field(default_factory=dict)  # group -> overrides
    brokers: BrokerRegistry = field(default_factory=BrokerRegistry)
    # subjects, versions, schemas by id, compatibility levels (Confluent's schema registry)
    schema_registry: SchemaRegistryState = field(default_factory=SchemaRegistryState)
    # The ACLs as an image holds them, built again only after an ACL record: the authorizers
    # (`AuthorizerCache`) are rebuilt when this tuple is another one.
    _acls_image: tuple[AclBinding, ...] | None = field(default=None, repr=False,
                                                        compare=False)

    def replay(self, record: MetadataRecord | Mapping[str, Any]) -> None:
        """Apply one record. A mapping is a record in its stored form (as the metadata log
        holds it) and is decoded first; an unknown type raises ValueError."""
        if not isinstance(record, MetadataRecord):
            record = from_stored(record)
        if not record.persisted:
            self.brokers.replay(record)
        elif isinstance(record, PartitionChangeRecord):
            partitions = self.topics[record.topic].partitions
            partitions[record.partition] = partitions[record.partition].merge(record)
        elif isinstance(record, PartitionRecord):
            self.topics[record.topic].partitions[record.partition] = PartitionRegistration(
                record.replicas, record.isr, record.leader, record.leader_epoch)
        elif isinstance(record, ConfigRecord):
            configs = self.topics[record.topic].configs
            if record.value is None:
                configs.pop(record.key, None)
            else:
                configs[record.key] = record.value
        elif isinstance(record, GroupConfigRecord):
            overrides = self.group_configs.setdefault(record.group, {})
            if record.value is None:
                overrides.pop(record.key, None)
            else:
                overrides[record.key] = record.value
            if not overrides:
                del self.group_configs[record.group]
        elif isinstance(record, TopicRecord):
            self.topics[record.name] = TopicRegistration(record.topic_id)
        elif isinstance(record, RemoveTopicRecord):
            self.topics.pop(record.name, None)
        elif isinstance(record, ProducerIdsRecord):
            self.producer_ids_end = record.producer_ids_end
        elif isinstance(record, TransactionalIdRecord):
            self.transactional_ids[record.transactional_id] = record.producer_id
        elif isinstance(record, TransactionRecord):
            self._replay_transaction(record)
        elif isinstance(record, TxnOffsetCommitRecord):
            pending = self.txn_offsets.setdefault(record.transactional_id, {}).setdefault(
                record.group_id, {})
            for t, p, o, e, m in zip(record.topics, record.partitions, record.offsets,
                                     record.leader_epochs, record.metadata, strict=True):
                pending[(t, p)] = (o, e, m)
        elif isinstance(record, ClusterIdRecord):
            self.cluster_id = record.cluster_id
        elif isinstance(record, ProducerIdKeyRecord):
            self.producer_id_key = record.key
        elif isinstance(record, UserScramCredentialRecord):
            self.scram_credentials.setdefault(record.name, {})[record.mechanism] = (
                ScramCredential(record.mechanism, record.salt, record.stored_key,
                                record.server_key, record.iterations))
        elif isinstance(record, RemoveUserScramCredentialRecord):
            self._remove_scram_credential(record.name, record.mechanism)
        elif isinstance(record, AccessControlEntryRecord):
            self._add_acl(record.acl_id, record.binding())
        elif isinstance(record, RemoveAccessControlEntryRecord):
            self._remove_acl(record.acl_id)
        elif isinstance(record, ClientQuotaRecord):
            self._replay_client_quota(record)
        elif isinstance(record, SchemaRecord | RemoveSchemaRecord | SchemaCompatibilityRecord):
            self.schema_registry.replay(record)
        else:
            raise ValueError(f"unknown metadata record type {record.type!r}")

    def _replay_transaction(self, record: TransactionRecord) -> None:
        """A transaction's new state; its pending offsets go once it is no longer open (they
        were written to the group, or dropped, before the record)."""
        self.transactions[record.transactional_id] = record.metadata()
        if record.state not in TXN_OPEN_STATES:
            self.txn_offsets.pop(record.transactional_id, None)

    def open_transactions(self) -> dict[tuple[str, int], frozenset[int]]:
        """The image's `open_transactions`: each partition's producers whose transaction holds
        it and has no marker there yet (Ongoing, PrepareCommit, PrepareAbort)."""
        out: dict[tuple[str, int], set[int]] = {}
        for txn in self.transactions.values():
            if txn.state in TXN_OPEN_STATES:
                for tp in txn.partitions:
                    out.setdefault(tp, set()).add(txn.producer_id)
        return {tp: frozenset(ids) for tp, ids in out.items()}

    def _remove_scram_credential(self, user: str, mechanism: str) -> None:
        mechanisms = self.scram_credentials.get(user, {})
        if mechanisms.pop(mechanism, None) is None:  # as Kafka's replay: a bug, not bad input
            raise ValueError(f"no {mechanism} credential of user {user!r} to remove")
        if not mechanisms:
            del self.scram_credentials[user]

    def _replay_client_quota(self, record: ClientQuotaRecord) -> None:
        entity = record.entity()
        values = self.client_quotas.setdefault(entity, {})
        if record.value is None:
            values.pop(record.key, None)
        else:
            values[record.key] = float(record.value)
        if not values:
            del self.client_quotas[entity]

    def client_quotas_copy(self) -> dict[QuotaEntity, dict[str, float]]:
        """The quotas for an image: new dicts, so replaying on shares nothing with it."""
        return {entity: dict(values) for entity, values in self.client_quotas.items()}

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.scram_credentials.get(user, {}).get(mechanism)

    def _add_acl(self, acl_id: str, acl: AclBinding) -> None:
        if acl_id in self.acls or acl in self.acl_ids:  # the handler never writes either
            raise ValueError(f"ACL {acl_id} ({acl}) is held already")
        self.acls[acl_id] = acl
        self.acl_ids[acl] = acl_id
        self._acls_image = None

    def _remove_acl(self, acl_id: str) -> None:
        acl = self.acls.pop(acl_id, None)
        if acl is None:
            raise ValueError(f"no ACL {acl_id} to remove")
        del self.acl_ids[acl]
        self._acls_image = None

    def acls_image(self) -> tuple[AclBinding, ...]:
        """Every ACL, sorted (resource, then entry), as the same tuple until an ACL changes."""
        if self._acls_image is None:
            self._acls_image = tuple(sorted(self.acls.values()))
        return self._acls_image

    def scram_credentials_copy(self) -> dict[str, dict[str, ScramCredential]]:
        """The credentials for an image: new dicts, so replaying on shares nothing with it."""
        return {user: dict(mechanisms) for user, mechanisms in self.scram_credentials.items()}

    def image(self, version: int, log_root: str) -> MetadataImage:
        """The image brokers and clients see at `version` (live brokers only, as Kafka lists
        them): shares nothing mutable with this state."""
        return MetadataImage(version, self.cluster_id, -1, self.brokers.live_endpoints(),
                             self.topic_states(), log_root, self.scram_credentials_copy(),
                             self.acls_image(), self.producer_id_key,
                             client_quotas=self.client_quotas_copy(),
                             open_transactions=self.open_transactions(),
                             group_configs={g: dict(c) for g, c in self.group_configs.items()})

    def snapshot(self) -> list[MetadataRecord]:
        """Records that, replayed into an empty state, give one whose `image` is this one's
        (KRaft's metadata snapshot). Producer ids and transactional ids, which no image holds
        (their records do not `changes_image`), are left out, as brokers are never sent them; of the
        transactions, the open ones holding partitions (all `open_transactions` is built from)."""
        records: list[MetadataRecord] = []
        if self.cluster_id:
            records.append(ClusterIdRecord(self.cluster_id))
        if self.producer_id_key:
            records.append(ProducerIdKeyRecord(self.producer_id_key))
        for name, topic in self.topics.items():
            records.append(TopicRecord(name, topic.topic_id))
            for p, s in sorted(topic.partitions.items()):
                records.append(PartitionRecord(name, p, s.replicas, s.isr, s.leader,
                                               s.leader_epoch))
                if s.adding_replicas or s.removing_replicas:
                    records.append(PartitionChangeRecord(
                        name, p, adding_replicas=s.adding_replicas,
                        removing_replicas=s.removing_replicas))
            records.extend(ConfigRecord(name, key, value)
                           for key, value in sorted(topic.configs.items()))
        for user, mechanisms in sorted(self.scram_credentials.items()):
            records.extend(UserScramCredentialRecord(user, mechanism, c.salt, c.stored_key,
                                                     c.server_key, c.iterations)
                           for mechanism, c in sorted(mechanisms.items()))
        records.extend(AccessControlEntryRecord.of(acl_id, acl)
                       for acl_id, acl in self.acls.items())
        records.extend(ClientQuotaRecord.of(entity, key, value)
                       for entity, values in self.client_quotas.items()
                       for key, value in sorted(values.items()))
        records.extend(GroupConfigRecord(group, key, value)
                       for group, overrides in sorted(self.group_configs.items())
                       for key, value in sorted(overrides.items()))
        records.extend(self.schema_registry.snapshot())
        records.extend(TransactionRecord.of(t) for t in self.transactions.values()
                       if t.state in TXN_OPEN_STATES and t.partitions)
        records.extend(self.brokers.snapshot())
        return records

    def partition(self, topic: str, partition: int) -> PartitionRegistration | None:
        t = self.topics.get(topic)
        return None if t is None else t.partitions.get(partition)

    def topic_states(self) -> dict[str, TopicState]:
        return {name: TopicState(name, t.topic_id,
                                 tuple(s.state(p) for p, s in sorted(t.partitions.items())),
                                 dict(t.configs))
                for name, t in self.topics.items()}
