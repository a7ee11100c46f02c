"""The controller: the one place cluster metadata is decided. Runs in the Spark driver.

Thread-safe: every public method takes `_lock` (a Condition that also wakes heartbeat long polls
and those waiting for brokers), itself or in the manager it delegates to.

The controller is thin, as KRaft's QuorumController is: it owns the lock, the metadata log, the
image and the commit path, and orders every request by its lock. A request is decided by a
handler (`replication_control`, `config_control`, `broker_registry`, `producer_id_control`,
`transaction_coordinator`, `credential_control`, `acl_control`, `quota_control`), which validates
it and returns the records to write and the answer, changing nothing. `_commit` then writes the
persisted records to the metadata log and only after that replays them into `MetadataState`, so
what brokers and clients see is always durable; loading after a restart is the same replay of
the log.

Configs, SCRAM credentials, ACLs, quotas and AlterPartition are run here; the rest is delegated
to a manager per subsystem (Kafka's XControlManagers), each given the controller's locks, state
and commit path:
- `cluster_control` (ClusterControlManager): brokers' registrations, heartbeats (long polls),
  fencing, session checks, controlled shutdown, and the wait for brokers to apply a version;
- `topic_tables`: CreateTopics, CreatePartitions and DeleteTopics, with the replica tables and
  topic directories they create (empty, before the metadata naming them is committed) and
  remove (once brokers closed them);
- `reassignment_control`: elections on request, and reassignments with the thread and catch-up
  job that carry one out;
- `transaction_control`: producer ids and the transaction coordinator's requests.
Beside them, not in the controller: the door adapter (`controller_apis`) and the writing of
transaction markers (`txn_marker_channel`), which carries out the ends of transactions decided
here. Besides `_lock` the controller owns `_tables_lock`, taken before `_lock` (never while
waiting for brokers) while replica tables are created or a directory removed, so one never races
the other.

Brokers are not sent the image: a heartbeat answer carries the records since the broker's
position, or a snapshot, a bounded number at a time (`metadata_deltas`), which the broker
replays into its own state (`metadata_loader`).

A metadata append whose outcome is unknown (the store lost its answer and could not be read to
tell) leaves the state short of what the log may hold; KRaft's controller resigns and reloads
from the log then. deltabus has one controller, so it reloads the log's end (`_reload_log`)
before anything else is written: the session checker asks for it (`reload_metadata`), and so
does every commit, refusing (retriably) one decided before the reload applied what had landed.

Invariants: state changes only by replaying records, and a persisted record is replayed only
after the log holds it; `_version` grows with every commit a broker or client could see, and
that commit's records are in `_deltas` under it before the lock is let go (the handlers'
invariants on leaders and ISRs are in `replication_control`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import (
    acl_control,
    balancer,
    config_control,
    credential_control,
    producer_id_control,
    quota_control,
    replication_control,
    transaction_coordinator,
)
from deltabus.cluster.broker_registry import BrokerRegistry
from deltabus.cluster.catch_up import CatchUpTask
from deltabus.cluster.cluster_control import ClusterControlManager
from deltabus.cluster.log_cleaner import CleanerTask
from deltabus.cluster.metadata_deltas import MetadataDeltas
from deltabus.cluster.metadata_log import MetadataLog
from deltabus.cluster.metadata_records import (
    AccessControlEntryRecord,
    ClusterIdRecord,
    MetadataRecord,
    ProducerIdKeyRecord,
    RemoveAccessControlEntryRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
    to_stored,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.cluster.producer_id_control import ProducerIdControlManager
from deltabus.cluster.reassignment_control import ReassignmentControlManager
from deltabus.cluster.schema_registry import SchemaRegistry
from deltabus.cluster.topic_tables import TopicTables
from deltabus.cluster.transaction_control import TransactionControlManager
from deltabus.cluster.txn_marker_channel import SendMarkers, TxnMarkerChannel
from deltabus.log_tables.layout import metadata_path
from deltabus.metadata import (
    PREPARE_ABORT,
    PREPARE_COMMIT,
    BrokerEndpoint,
    LogReport,
    MetadataBatch,
    MetadataImage,
    NewTopic,
    PartitionState,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    ScramDescriptions,
    TopicResult,
    TransactionMetadata,
    describe_scram_credentials,
    new_cluster_id,
)
from deltabus.quotas import (
    ClientQuotaManager,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilterComponent,
    describe_client_quotas,
)
from deltabus.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclCreation,
    Authorizer,
    AuthorizerCache,
    describe_acls,
)
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal
from deltabus.security.scram import ScramCredential

log = logging.getLogger(__name__)


class Controller:
    """Owns the metadata log, the image and the commit path; orders requests by its lock and
    delegates each subsystem's to its manager."""

    def __init__(self, config: cfg.ClusterConfig,
                 on_fence: Callable[[int, BrokerEndpoint], None] | None = None,
                 catch_up: Callable[[list[CatchUpTask], str], object] | None = None,
                 send_markers: SendMarkers | None = None) -> None:
        """`send_markers`: how transaction markers reach a broker (tests give a fake); the
        default writes them on the leaders (`txn_markers`)."""
        self._config = config
        self._authorizers = AuthorizerCache(
            super_users=config.super_users,
            allow_everyone_if_no_acl_found=config.allow_everyone_if_no_acl_found)
        # The driver's doors throttle by it; updated when quotas are replayed, so a request
        # never takes the lock to find its quota.
        self.quota_manager = ClientQuotaManager()
        self._lock = threading.Condition()
        # Held (before `_lock`, never while waiting for brokers) while replica tables are
        # created or a topic's directory removed, so one never races the other.
        self._tables_lock = threading.Lock()
        self._version = 1
        self._image: MetadataImage | None = None
        self._shutting_down = False
        self._storage = config.storage
        self._log = MetadataLog(metadata_path(config.root),
                                storage_options=self._storage.delta_options)
        # The records of the commit whose append's outcome is unknown, until `_reload_log`.
        self._unknown: Sequence[MetadataRecord] = ()
        self._state = MetadataState(
            brokers=BrokerRegistry(last_broker_epoch=int(time.time() * 1000)))
        for stored in self._log.read_all():
            self._state.replay(stored)
        self._deltas = MetadataDeltas(self._version)  # what brokers are sent
        self._cluster_control = ClusterControlManager(
            config, self._lock, self._state, self._commit, version=lambda: self._version,
            shutting_down=lambda: self._shutting_down,
            read_deltas=lambda position: self._deltas.read(position, self._state),
            on_fence=on_fence)
        # Times each broker was fenced (missed heartbeats, its task ended): a healthy cluster's
        # stay 0 (bench step (p) counts them while partitions are created by the thousand).
        self.fenced = self._cluster_control.fenced
        self._topic_tables = TopicTables(
            config, self._lock, self._tables_lock, self._state, self._commit,
            version=lambda: self._version, shutting_down=lambda: self._shutting_down,
            await_brokers=self._cluster_control.await_brokers, reload_log=self._reload_log)
        self._reassignments = ReassignmentControlManager(
            config, self._lock, self._tables_lock, self._state, self._commit,
            version=lambda: self._version, shutting_down=lambda: self._shutting_down,
            await_brokers=self._cluster_control.await_brokers,
            topic_tables=self._topic_tables, catch_up=catch_up)
        self._producer_ids = ProducerIdControlManager(config, self._state)
        self._transactions = TransactionControlManager(
            config, self._lock, self._state, self._commit, producer_ids=self._producer_ids,
            version=lambda: self._version, shutting_down=lambda: self._shutting_down,
            await_brokers=self._cluster_control.await_brokers,
            start_ending=lambda transactional_id: self.markers.start(transactional_id))
        self.markers = TxnMarkerChannel(config, self._lock, self._state, self.image,
                                        self._transactions.complete_transaction,
                                        lambda: self._shutting_down, send_markers)
        # Confluent's schema registry, over this state and log (its REST door: the Cluster's)
        self.schema_registry = SchemaRegistry(self._lock, lambda: self._state.schema_registry,
                                              self._commit)
        self.quota_manager.update(self._state.client_quotas_copy())
        if not self._state.cluster_id:
            with self._lock:
                self._commit([ClusterIdRecord(new_cluster_id())])
        if config.authorizer and not self._state.producer_id_key:  # ids are bound: a key
            with self._lock:
                self._commit([ProducerIdKeyRecord(secrets.token_bytes(32))])
        with self._lock:  # transactions a previous controller was ending: end them
            for txn in list(self._state.transactions.values()):
                if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    self.markers.start(txn.transactional_id)

    # ---- metadata ----------------------------------------------------------------------------

    def _commit(self, records: Sequence[MetadataRecord]) -> None:
        """Write the persisted records durably (one Delta commit), then replay them all; a new
        version when brokers or clients could see the change. Caller holds the lock (or is
        __init__). A failed write raises KafkaStorageError and changes nothing of `records`.

        After an append whose outcome was unknown the log is reloaded first; if that append
        had landed, its records are applied and these refused (KafkaStorageError, retriable):
        they were decided on a state without them (an election on a stale leader epoch, a
        topic created twice)."""
        if not records:
            return
        if self._reload_log():
            raise errors.KafkaStorageError(
                "the metadata log was reloaded: it held an append whose outcome was unknown, "
                "applied now; try again")
        try:
            self._log.append([to_stored(r) for r in records if r.persisted])
        except errors.KafkaStorageError:
            if self._log.outcome_unknown:
                self._unknown = records
            raise
        self._apply(records)

    def reload_metadata(self) -> bool:
        """If a metadata append's outcome is unknown: reload the log's end and apply what had
        landed (`_reload_log`), so the next request is decided on the state the log holds;
        whether anything was applied. Raises KafkaStorageError while the store cannot tell.
        The session checker calls it every round."""
        with self._lock:
            return self._reload_log()

    def _reload_log(self) -> bool:
        """Lock held. After an append whose outcome was unknown: apply its records if the log
        holds them (all of them, the broker records beside the persisted ones, as the commit
        would have had its answer come back), so the state equals the log again; whether it
        did. Raises KafkaStorageError while the store cannot tell (nothing changes)."""
        if not self._log.outcome_unknown:
            return False
        landed = self._log.reload()
        records, self._unknown = self._unknown, ()
        if not landed:
            log.warning("the metadata append whose outcome was unknown did not land")
            return False
        assert len(landed) == sum(r.persisted for r in records), (len(landed), records)
        log.warning("the metadata append whose outcome was unknown landed: %d records applied",
                    len(landed))
        self._apply(records)
        return True

    def _apply(self, records: Sequence[MetadataRecord]) -> None:
        """Replay committed records; a new version when brokers or clients could see them."""
        for record in records:
            self._state.replay(record)
        if any(r.changes_image for r in records):
            self._version += 1
            self._deltas.append(self._version, records)
            self._image = None
            self._lock.notify_all()

    def authorizer(self) -> Authorizer | None:
        """The authorizer over the current ACLs (None: the cluster runs without one)."""
        if not self._config.authorizer:
            return None
        return self._authorizers.get(self.image().acls)

    def image(self) -> MetadataImage:
        """The current metadata snapshot (live brokers only, as Kafka lists them)."""
        with self._lock:
            if self._image is None or self._image.version != self._version:
                self._image = self._state.image(self._version, self._config.root)
            return self._image

    @property
    def config(self) -> cfg.ClusterConfig:
        return self._config

    # ---- topics (topic_tables) ---------------------------------------------------------------

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int = 30_000,
                      validate_only: bool = False) -> list[TopicResult]:
        return self._topic_tables.create_topics(topics, timeout_ms=timeout_ms,
                                                validate_only=validate_only)

    def auto_create_topics(self, names: list[str], *, timeout_ms: int = 10_000) -> None:
        self._topic_tables.auto_create_topics(names, timeout_ms=timeout_ms)

    def create_partitions(self, counts: dict[str, int], *, timeout_ms: int = 30_000,
                          validate_only: bool = False) -> list[TopicResult]:
        return self._topic_tables.create_partitions(counts, timeout_ms=timeout_ms,
                                                    validate_only=validate_only)

    def delete_topics(self, names: list[str], *, timeout_ms: int = 30_000) -> list[TopicResult]:
        return self._topic_tables.delete_topics(names, timeout_ms=timeout_ms)

    # ---- configs (config_control) ------------------------------------------------------------

    def describe_configs(self, topics: list[str], groups: bool = False) -> cfg.ConfigResults:
        """Every config of each topic (group), with its value and source (DescribeConfigs)."""
        with self._lock:
            return (config_control.describe_group_configs if groups else
                    config_control.describe_configs)(self._state, self._config, topics)

    def alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                      validate_only: bool = False, timeout_ms: int = 30_000,
                      groups: bool = False) -> dict[str, errors.DeltaBusError | None]:
        """Kafka's IncrementalAlterConfigs for topics (groups): each one's changes are checked
        as a whole and committed as config records (or refused, changing nothing). Returns once
        the brokers applied them, so the next produce (share fetch) sees the new values."""
        alter = config_control.alter_group_configs if groups else config_control.alter_configs
        results: dict[str, errors.DeltaBusError | None] = {}
        with self._lock:
            for name, ops in changes.items():
                try:
                    result = alter(self._state, self._config, name, ops)
                    if result.records and not validate_only:
                        self._commit(result.records)
                        log.info("%s %s configs changed: %s", "group" if groups else "topic",
                                 name, ", ".join(f"{op.name}={op.value}" for op in ops))
                    results[name] = None
                except errors.DeltaBusError as e:
                    results[name] = e
            target = self._version
        if not validate_only:
            self._await_brokers(target, timeout_ms)
        return results

    # ---- users' SCRAM credentials ------------------------------------------------------------

    def alter_user_scram_credentials(self, deletions: list[ScramCredentialDeletion],
                                     upsertions: list[ScramCredentialUpsertion], *,
                                     timeout_ms: int = cfg.ADMIN_TIMEOUT_MS_DEFAULT
                                     ) -> dict[str, errors.DeltaBusError | None]:
        """Kafka's AlterUserScramCredentials: None or the error per user. Returns once the live
        brokers applied the change (they authenticate with it), or after `timeout_ms`."""
        with self._lock:
            result = credential_control.alter_user_scram_credentials(
                self._state, deletions, upsertions)
            self._commit(result.records)
            target = self._version
        for r in result.records:  # names only: never a salt or a key
            if isinstance(r, UserScramCredentialRecord | RemoveUserScramCredentialRecord):
                log.info("user %s: %s credential %s", r.name, r.mechanism,
                         "set" if isinstance(r, UserScramCredentialRecord) else "deleted")
        if result.records:
            self._await_brokers(target, timeout_ms)
        return result.response

    def describe_user_scram_credentials(self, users: list[str] | None) -> ScramDescriptions:
        with self._lock:
            return describe_scram_credentials(self._state.scram_credentials, users)

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        with self._lock:
            return self._state.scram_credential(user, mechanism)

    # ---- ACLs --------------------------------------------------------------------------------

    def create_acls(self, creations: list[AclCreation], *,
                    timeout_ms: int = cfg.ADMIN_TIMEOUT_MS_DEFAULT
                    ) -> acl_control.CreateResults:
        """Kafka's CreateAcls: None or the error per creation, in order. Returns once the live
        brokers hold the new ACLs (they authorize with them), or after `timeout_ms`."""
        with self._lock:
            result = acl_control.create_acls(self._state, creations)
            self._commit(result.records)
            target = self._version
        for r in result.records:
            if isinstance(r, AccessControlEntryRecord):
                log.info("ACL %s created: %s", r.acl_id, r.binding())
        if result.records:
            self._await_brokers(target, timeout_ms)
        return result.response

    def delete_acls(self, filters: list[AclBindingFilter], *,
                    timeout_ms: int = cfg.ADMIN_TIMEOUT_MS_DEFAULT
                    ) -> acl_control.DeleteResults:
        """Kafka's DeleteAcls: per filter, the ACLs it matched and removed, or its error.
        Returns once the live brokers no longer hold them, or after `timeout_ms`."""
        with self._lock:
            result = acl_control.delete_acls(self._state, filters)
            for r in result.records:
                if isinstance(r, RemoveAccessControlEntryRecord):
                    log.info("ACL %s deleted: %s", r.acl_id, self._state.acls.get(r.acl_id))
            self._commit(result.records)
            target = self._version
        if result.records:
            self._await_brokers(target, timeout_ms)
        return result.response

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """Kafka's DescribeAcls, from the current image."""
        return describe_acls(self.image().acls, acl_filter)

    # ---- client quotas -----------------------------------------------------------------------

    def alter_client_quotas(self, alterations: list[QuotaAlteration], *,
                            validate_only: bool = False,
                            timeout_ms: int = cfg.ADMIN_TIMEOUT_MS_DEFAULT
                            ) -> quota_control.AlterResults:
        """Kafka's AlterClientQuotas: None or the error per entry, in order. Returns once the
        live brokers throttle by the new quotas, or after `timeout_ms`."""
        with self._lock:
            result = quota_control.alter_client_quotas(self._state, alterations)
            if validate_only:
                return result.response
            self._commit(result.records)
            self.quota_manager.update(self._state.client_quotas_copy())
            target = self._version
        for entity, error in zip(alterations, result.response, strict=True):
            if error is None:
                log.info("client quotas of %s altered: %s", entity.entity, ", ".join(
                    f"{k}={'(removed)' if v is None else v}" for k, v in entity.ops))
        if result.records:
            self._await_brokers(target, timeout_ms)
        return result.response

    def describe_client_quotas(self, components: list[QuotaFilterComponent],
                               strict: bool) -> dict[QuotaEntity, dict[str, float]]:
        """Kafka's DescribeClientQuotas, from the current image."""
        return describe_client_quotas(self.image().client_quotas, components, strict)

    # ---- producer ids and transactions (transaction_control) ---------------------------------

    def init_producer_id(self, transactional_id: str = "",
                         principal: KafkaPrincipal = ANONYMOUS) -> tuple[int, int]:
        return self._transactions.init_producer_id(transactional_id, principal)

    def producer_id_issued_to(self, producer_id: int, principal: KafkaPrincipal) -> bool:
        return producer_id_control.issued_to(producer_id, principal,
                                             self._state.producer_id_key)

    def init_transactional_producer(self, transactional_id: str, timeout_ms: int,
                                    principal: KafkaPrincipal = ANONYMOUS,
                                    expected: tuple[int, int] = (-1, -1)) -> tuple[int, int]:
        return self._transactions.init_transactional_producer(transactional_id, timeout_ms,
                                                              principal, expected)

    def add_partitions_to_txn(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, partitions: list[tuple[str, int]]
                              ) -> transaction_coordinator.PartitionErrors:
        return self._transactions.add_partitions_to_txn(transactional_id, producer_id,
                                                        producer_epoch, partitions)

    def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           group_id: str) -> None:
        self._transactions.add_offsets_to_txn(transactional_id, producer_id, producer_epoch,
                                              group_id)

    def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int,
                          producer_epoch: int,
                          offsets: dict[tuple[str, int], tuple[int, int, str]]
                          ) -> transaction_coordinator.PartitionErrors:
        return self._transactions.txn_offset_commit(transactional_id, group_id, producer_id,
                                                    producer_epoch, offsets)

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                committed: bool) -> None:
        self._transactions.end_txn(transactional_id, producer_id, producer_epoch, committed)

    def abort_timed_out_transactions(self) -> list[str]:
        return self._transactions.abort_timed_out_transactions()

    def list_transactions(self, states: list[str], producer_ids: list[int],
                          duration_ms: int = -1) -> list[TransactionMetadata]:
        return self._transactions.list_transactions(states, producer_ids, duration_ms)

    def pending_txn_offsets(self, group_id: str) -> set[tuple[str, int]]:
        return self._transactions.pending_txn_offsets(group_id)

    def describe_transactions(self, transactional_ids: list[str]
                              ) -> dict[str, TransactionMetadata | None]:
        return self._transactions.describe_transactions(transactional_ids)

    # ---- brokers (cluster_control) -----------------------------------------------------------

    def register_broker(self, endpoint: BrokerEndpoint, pid: int) -> int:
        return self._cluster_control.register_broker(endpoint, pid)

    def tables_changed(self, partitions: list[tuple[str, int, tuple[int, ...]]]) -> None:
        self._cluster_control.tables_changed(partitions)

    def heartbeat(self, broker_id: int, epoch: int, applied_version: int, max_wait_ms: int,
                  offline_replicas: Collection[tuple[str, int]] = (), **reports: Any
                  ) -> tuple[bool, MetadataBatch | None, list[tuple[str, int]]]:
        """ClusterControl.heartbeat: `reports` are its position, loads and high watermarks."""
        return self._cluster_control.heartbeat(broker_id, epoch, applied_version, max_wait_ms,
                                               offline_replicas, **reports)

    def log_reports(self) -> dict[tuple[str, int], LogReport]:
        return self._cluster_control.log_reports()

    def members(self) -> list[int]:
        return self._cluster_control.members()

    def set_members(self, broker_ids: Collection[int]) -> None:
        self._cluster_control.set_members(broker_ids)

    def hold_broker(self, broker_id: int) -> None:
        self._cluster_control.hold_broker(broker_id)

    def release_broker(self, broker_id: int) -> None:
        self._cluster_control.release_broker(broker_id)

    def shut_down_broker(self, broker_id: int) -> bool:
        return self._cluster_control.shut_down_broker(broker_id)

    def registered_endpoint(self, broker_id: int) -> BrokerEndpoint | None:
        return self._cluster_control.registered_endpoint(broker_id)

    def fence_broker(self, broker_id: int, reason: str) -> None:
        self._cluster_control.fence_broker(broker_id, reason)

    def check_sessions(self) -> list[int]:
        return self._cluster_control.check_sessions()

    def broker_pids(self) -> dict[int, int]:
        return self._cluster_control.broker_pids()

    def broker_epochs(self) -> dict[int, int]:
        return self._cluster_control.broker_epochs()

    def live_brokers(self) -> list[int]:
        return self._cluster_control.live_brokers()

    def applied_version(self, broker_id: int) -> int:
        return self._cluster_control.applied_version(broker_id)

    def wait_for_brokers(self, count: int, timeout_s: float) -> bool:
        return self._cluster_control.wait_for_brokers(count, timeout_s)

    def _await_brokers(self, version: int, timeout_ms: int) -> None:
        self._cluster_control.await_brokers(version, timeout_ms)

    # ---- log cleaning and catch-up -----------------------------------------------------------

    def cleaner_tasks(self, topics: list[str] | None = None,
                      merge_min_age_ms: int | None = None) -> list[CleanerTask]:
        """What the log cleaner's job works on: every partition with a leader (of `topics`,
        when given), with its topic's retention limits (none unless cleanup.policy includes
        delete), compaction settings (none unless it includes compact) and merge settings
        (`merge_min_age_ms` overrides the cluster's)."""
        min_age = (self._config.log_cleaner_merge_min_age_ms if merge_min_age_ms is None
                   else merge_min_age_ms)
        with self._lock:
            return replication_control.cleaner_tasks(self._state, self._config, topics, min_age)

    def catch_up_tasks(self, broker_id: int) -> list[CatchUpTask]:
        """What the catch-up job copies before broker `broker_id` is relaunched: each replica it
        follows, from the partition's live leader."""
        with self._lock:
            return replication_control.catch_up_tasks(self._state, self._config.storage,
                                                      broker_id)

    # ---- elections and reassignments (reassignment_control) ----------------------------------

    def elect_leaders(self, election_type: str = "preferred",
                      partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._reassignments.elect_leaders(election_type, partitions)

    def rebalance_leaders(self) -> int:
        return self._reassignments.rebalance_leaders()

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int] | None]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._reassignments.reassign_partitions(targets)

    def balance(self, *, execute: bool = False, leaving: Collection[int] = ()
                ) -> balancer.BalancePlan:
        """The balancer's plan over this cluster's brokers less `leaving` (started as
        reassignments with `execute`): `deltabus cluster balance`, and each scale's step."""
        brokers = set(self.members()) - set(leaving)
        return self._reassignments.balance(brokers, execute=execute,
                                           bytes_in_per_s=self._cluster_control.loads())

    def bytes_in_per_s(self) -> float:
        """The cluster's bytes in per second: its partitions' as their leaders last reported
        them (the autoscaler's load)."""
        loads = self._cluster_control.loads()
        with self._lock:
            return sum(loads.get((t, p), 0.0) for t, topic in self._state.topics.items()
                       for p in topic.partitions)

    def reassignments_in_progress(self) -> list[tuple[str, int]]:
        """Partitions being reassigned (copying, or waiting for their new replicas to join
        the ISR), in order."""
        with self._lock:
            return sorted((t, p) for t, topic in self._state.topics.items()
                          for p, s in topic.partitions.items()
                          if s.adding_replicas or s.removing_replicas) + \
                sorted(self._reassignments.starting())

    def replicas_on(self, broker_ids: Collection[int]) -> list[tuple[str, int]]:
        """Partitions with a replica on one of `broker_ids` (a scale-in waits for none)."""
        wanted = set(broker_ids)
        with self._lock:
            return sorted((t, p) for t, topic in self._state.topics.items()
                          for p, s in topic.partitions.items()
                          if wanted & (set(s.replicas) | set(s.adding_replicas)))

    # ---- ISR changes -------------------------------------------------------------------------

    def alter_partition(self, broker_id: int, broker_epoch: int, topic: str, partition: int,
                        leader_epoch: int, isr: list[int],
                        new_isr: list[int]) -> tuple[PartitionState, int]:
        """A leader shrinks or grows its partition's ISR (Kafka's AlterPartition). Returns the
        committed partition state and the metadata version that holds it."""
        with self._lock:
            result = replication_control.alter_partition(
                self._state, broker_id, broker_epoch, topic, partition, leader_epoch, isr,
                new_isr)
            self._commit(result.records)
            return result.response, self._version

    def begin_shutdown(self) -> None:
        """Tell every broker, through its heartbeat, to flush and stop."""
        with self._lock:
            self._shutting_down = True
            self._lock.notify_all()

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down
