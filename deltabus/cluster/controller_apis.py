"""The controller's door adapter (Kafka's ControllerApis): the DeltaBusHandler the driver's
gRPC server and Kafka listener call. It holds no state of its own and decides nothing: metadata
and admin requests go to the `Controller`, group and schema calls to what the controller holds;
the controller leads no partition, so data calls get NOT_LEADER_OR_FOLLOWER naming the leader.
"""

from __future__ import annotations

from concurrent.futures import Future

import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import acl_control, transaction_coordinator
from deltabus.cluster.controller import Controller
from deltabus.cluster.handler import (
    FetchResult,
    FetchSpec,
    LogDirDescription,
    ShareFetchAnswer,
    ShareFetchRequest,
    SharePartitionData,
)
from deltabus.cluster.scaling import Scaler
from deltabus.cluster.schema_registry import SchemaRegistry
from deltabus.log_tables.partition_log import ActiveProducer, AppendResult
from deltabus.metadata import (
    BalancePlan,
    BrokerEndpoint,
    MetadataImage,
    NewTopic,
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
from deltabus.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclCreation,
    Authorizer,
)
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal
from deltabus.security.scram import ScramCredential
from deltabus.topics import validate_topic_name


class ControllerHandler:
    """The controller's DeltaBus door: metadata and admin; it leads no partitions, so data calls
    get NOT_LEADER_OR_FOLLOWER and the client asks the leader named in Metadata."""

    def __init__(self, controller: Controller, scaler: Scaler | None = None) -> None:
        self._controller = controller
        self._scaler = scaler  # brokers joining and leaving (Cluster.scale): None in tests
        self.endpoint: BrokerEndpoint | None = None  # set once the server is bound

    @property
    def schema_registry(self) -> SchemaRegistry:
        return self._controller.schema_registry

    def find_coordinator(self, group_id: str) -> BrokerEndpoint:
        """Groups are coordinated here, beside the controller."""
        if self.endpoint is None:
            raise errors.CoordinatorNotAvailableError("the group coordinator is starting")
        return self.endpoint

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage:
        """The current image; first, if both the request and the cluster
        (auto.create.topics.enable) allow it, the named topics that are missing are created.
        Raises POLICY_VIOLATION, creating none, when they are more than the limits allow."""
        image = self._controller.image()
        missing = [t for t in topics if t not in image.topics]
        if missing and allow_auto_create and self._controller.config.auto_create_topics_enable:
            self._controller.auto_create_topics(missing)
            image = self._controller.image()
        return image

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int,
                      validate_only: bool) -> list[TopicResult]:
        return self._controller.create_topics(topics, timeout_ms=timeout_ms,
                                              validate_only=validate_only)

    def delete_topics(self, names: list[str], *, timeout_ms: int) -> list[TopicResult]:
        return self._controller.delete_topics(names, timeout_ms=timeout_ms)

    def create_partitions(self, counts: dict[str, int], *, timeout_ms: int,
                          validate_only: bool) -> list[TopicResult]:
        return self._controller.create_partitions(counts, timeout_ms=timeout_ms,
                                                  validate_only=validate_only)

    def describe_configs(self, topics: list[str]) -> cfg.ConfigResults:
        return self._controller.describe_configs(topics)

    def alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                      validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        return self._controller.alter_configs(changes, validate_only=validate_only)

    def describe_group_configs(self, groups: list[str]) -> cfg.ConfigResults:
        return self._controller.describe_configs(groups, groups=True)

    def alter_group_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                            validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        return self._controller.alter_configs(changes, validate_only=validate_only, groups=True)

    def _not_leader(self, topic: str, partition: int) -> errors.DeltaBusError:
        if self._controller.image().partition(topic, partition) is None:
            return errors.UnknownTopicOrPartitionError(
                f"This server does not host this topic-partition: {topic}-{partition}")
        return errors.NotLeaderOrFollowerError(
            f"the controller leads no partitions: send {topic}-{partition} to its leader")

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState, batch_bytes: int | None = None,
                timeout_ms: int | None = None, in_order: bool = False) -> Future[AppendResult]:
        validate_topic_name(topic)  # as a broker: INVALID_TOPIC_EXCEPTION for an illegal name
        raise self._not_leader(topic, partition)

    def delete_records(self, topic: str, partition: int, offset: int) -> Future[int]:
        raise self._not_leader(topic, partition)

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]:
        return [FetchResult(s.topic, s.partition, self._not_leader(s.topic, s.partition))
                for s in specs]

    def fetch_delayed(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
                      max_bytes: int, replica_id: int) -> Future[list[FetchResult]]:
        answered: Future[list[FetchResult]] = Future()
        answered.set_result(self.fetch(specs, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                       max_bytes=max_bytes, replica_id=replica_id))
        return answered

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     isolation_level: int = 0) -> tuple[int, int, int]:
        raise self._not_leader(topic, partition)

    def share_fetch(self, request: ShareFetchRequest) -> ShareFetchAnswer:
        """The driver leads no partition: each one named is NOT_LEADER_OR_FOLLOWER."""
        named = dict.fromkeys([*request.added, *request.acknowledgements])
        answers = [SharePartitionData(t, p, error=self._not_leader(t, p),
                                      acknowledged=(t, p) in request.acknowledgements,
                                      acknowledge_error=self._not_leader(t, p)
                                      if (t, p) in request.acknowledgements else None)
                   for t, p in named]
        return ShareFetchAnswer(None, [], 0.0, lambda: answers)

    def offset_for_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int,
                                leader_epoch: int) -> tuple[int, int]:
        raise self._not_leader(topic, partition)

    def describe_log_dirs(self, partitions: list[tuple[str, int]] | None
                          ) -> list[LogDirDescription]:
        """The controller hosts no replica: it has no log dir."""
        return []

    def describe_producers(self, topic: str, partition: int) -> list[ActiveProducer]:
        raise self._not_leader(topic, partition)

    def init_producer_id(self, transactional_id: str = "",
                         principal: KafkaPrincipal = ANONYMOUS) -> tuple[int, int]:
        return self._controller.init_producer_id(transactional_id, principal)

    def producer_id_issued_to(self, producer_id: int, principal: KafkaPrincipal) -> bool:
        return self._controller.producer_id_issued_to(producer_id, principal)

    # The transaction coordinator (TransactionHandler): the controller's.

    def init_transactional_producer(self, transactional_id: str, timeout_ms: int,
                                    principal: KafkaPrincipal = ANONYMOUS,
                                    expected: tuple[int, int] = (-1, -1)) -> tuple[int, int]:
        return self._controller.init_transactional_producer(transactional_id, timeout_ms,
                                                            principal, expected)

    def add_partitions_to_txn(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, partitions: list[tuple[str, int]]
                              ) -> transaction_coordinator.PartitionErrors:
        return self._controller.add_partitions_to_txn(transactional_id, producer_id,
                                                      producer_epoch, partitions)

    def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           group_id: str) -> None:
        self._controller.add_offsets_to_txn(transactional_id, producer_id, producer_epoch,
                                            group_id)

    def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int,
                          producer_epoch: int,
                          offsets: dict[tuple[str, int], tuple[int, int, str]]
                          ) -> transaction_coordinator.PartitionErrors:
        return self._controller.txn_offset_commit(transactional_id, group_id, producer_id,
                                                  producer_epoch, offsets)

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                committed: bool) -> None:
        self._controller.end_txn(transactional_id, producer_id, producer_epoch, committed)

    def list_transactions(self, states: list[str], producer_ids: list[int],
                          duration_ms: int = -1) -> list[TransactionMetadata]:
        return self._controller.list_transactions(states, producer_ids, duration_ms)

    def describe_transactions(self, transactional_ids: list[str]
                              ) -> dict[str, TransactionMetadata | None]:
        return self._controller.describe_transactions(transactional_ids)

    def pending_txn_offsets(self, group_id: str) -> set[tuple[str, int]]:
        return self._controller.pending_txn_offsets(group_id)

    def elect_leaders(self, election_type: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._controller.elect_leaders(election_type, partitions)

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int] | None]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._controller.reassign_partitions(targets)

    def reassignment_image(self, topics: list[str]) -> MetadataImage:
        return self._controller.image()

    def scale_cluster(self, brokers: int | None) -> ScaleStatus:
        if self._scaler is None:
            raise errors.InvalidRequestError("this controller runs no brokers to scale")
        return self._scaler.status() if brokers is None else self._scaler.start(brokers)

    def balance_cluster(self, execute: bool) -> BalancePlan:
        return self._controller.balance(execute=execute)

    def alter_user_scram_credentials(self, deletions: list[ScramCredentialDeletion],
                                     upsertions: list[ScramCredentialUpsertion]
                                     ) -> dict[str, errors.DeltaBusError | None]:
        return self._controller.alter_user_scram_credentials(deletions, upsertions)

    def describe_user_scram_credentials(self, users: list[str] | None) -> ScramDescriptions:
        return self._controller.describe_user_scram_credentials(users)

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._controller.scram_credential(user, mechanism)

    def authorizer(self) -> Authorizer | None:
        return self._controller.authorizer()

    def create_acls(self, creations: list[AclCreation]) -> acl_control.CreateResults:
        return self._controller.create_acls(creations)

    def delete_acls(self, filters: list[AclBindingFilter]) -> acl_control.DeleteResults:
        return self._controller.delete_acls(filters)

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return self._controller.describe_acls(acl_filter)

    def alter_client_quotas(self, alterations: list[QuotaAlteration], *,
                            validate_only: bool) -> list[errors.DeltaBusError | None]:
        return self._controller.alter_client_quotas(alterations, validate_only=validate_only)

    def describe_client_quotas(self, components: list[QuotaFilterComponent],
                               strict: bool) -> dict[QuotaEntity, dict[str, float]]:
        return self._controller.describe_client_quotas(components, strict)

    def client_quota_manager(self) -> ClientQuotaManager:
        return self._controller.quota_manager
