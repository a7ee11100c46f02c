"""A broker: hosts partition replicas, leads some, follows others, and serves Produce/Fetch over
gRPC. Runs inside a long-running Spark task on an executor (one task, one broker), started by
`deltabus.cluster.Cluster`.

`Broker` is the front the doors call (the `DeltaBusHandler` contract of `handler`), split as
Kafka splits a broker: `broker_lifecycle` (BrokerLifecycleManager: registration, heartbeats,
fencing, shutdown when told), `broker_metadata_publisher` (BrokerMetadataPublisher: applies each
metadata image, opening and closing logs, leading or following), `replica_manager`
(ReplicaManager: the hosted partitions and the requests served from them), and the
`metadata_cache` they all read. Admin requests are forwarded to the controller; describes answer
from this broker's metadata, as a KRaft broker's do.

Thread-safe: gRPC threads call the handler methods concurrently; the heartbeat thread replays the
metadata records the controller sends (`metadata_loader`) and the metadata thread applies each
new image (so opening thousands of partitions never delays a heartbeat); replica fetcher threads
copy from leaders; the ISR thread shrinks lagging ISRs. Long-polling fetches hold no thread:
they wait in the fetch purgatory (`delayed_fetch`), completed by log changes and its reaper.
Invariants:
- A broker only appends produced records to a partition it leads in the metadata it has applied,
  stamping the leader epoch of that metadata; everything else gets NOT_LEADER_OR_FOLLOWER.
- Consumers read up to the high watermark; acks=all is answered once the high watermark passes
  the records (every in-sync replica holds them, durably, in its Delta table).
- The broker reports a metadata version as applied only after it opened (or closed) every log that
  version asks for, so when CreateTopics returns, the new partitions take produce requests.
- On shutdown, queued appends are committed before the server stops: acknowledged is durable.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.broker_lifecycle import BrokerLifecycleManager
from deltabus.cluster.broker_metadata_publisher import BrokerMetadataPublisher
from deltabus.cluster.broker_metrics import BrokerMetrics
from deltabus.cluster.doors import Doors, open_doors
from deltabus.cluster.handler import (
    FetchResult,
    FetchSpec,
    LogDirDescription,
    SchemaRegistryHandler,
    ShareFetchAnswer,
    ShareFetchRequest,
)
from deltabus.cluster.metadata_cache import MetadataCache
from deltabus.cluster.partition import Partition
from deltabus.cluster.producer_id_control import issued_to
from deltabus.cluster.replica_manager import ReplicaManager
from deltabus.cluster.share_partition_manager import SharePartitionManager
from deltabus.listeners import GRPC, ListenerBindError
from deltabus.log_tables.control_records import TxnMarker
from deltabus.log_tables.partition_log import ActiveProducer, AppendResult
from deltabus.log_tables.transactions import READ_UNCOMMITTED
from deltabus.metadata import (
    BalancePlan,
    BrokerEndpoint,
    ListenerEndpoint,
    MetadataImage,
    NewTopic,
    ScaleStatus,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    ScramDescriptions,
    TopicResult,
    describe_scram_credentials,
)
from deltabus.quotas import (
    ClientQuotaManager,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilterComponent,
    describe_client_quotas,
)
from deltabus.records import ProducerState
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.leader_endpoint import RemoteLeaderEndpoint
from deltabus.rpc.share_state_rpc import ShareStateChannel
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


@dataclass(frozen=True)
class BrokerSpec:
    """What a broker task needs to start; pickled into the Spark task."""

    broker_id: int
    # The driver's node: its controller listener (where brokers register) and the listeners
    # brokers forward to.
    controller: BrokerEndpoint
    config: cfg.ClusterConfig
    # The broker's listeners in its last incarnation: one on a free port takes that port again
    # (`doors.open_doors`), so a relaunched broker keeps its address.
    previous_listeners: tuple[ListenerEndpoint, ...] = ()


class Broker:
    """One broker: its gRPC server, its partition replicas and its session with the controller."""

    def __init__(self, spec: BrokerSpec) -> None:
        self.spec = spec
        self.broker_id = spec.broker_id
        self._config = spec.config
        self._cache = MetadataCache()  # the image this broker serves from
        self._authorizers = AuthorizerCache(
            super_users=spec.config.super_users,
            allow_everyone_if_no_acl_found=spec.config.allow_everyone_if_no_acl_found)
        self._quota_manager = ClientQuotaManager()
        self._stopped = threading.Event()
        # served on its metrics door (`doors`); none kept without one
        self.metrics = BrokerMetrics(enabled=spec.config.metrics_port >= 0)
        secret = spec.config.inter_broker_secret
        listeners = spec.config.listener_config()
        # Lifecycle calls on the controller's own listener; forwarded admin calls, which are
        # client traffic, on the driver's inter-broker listener (rpc.controller_channel).
        controller, admin = (spec.controller.listener(GRPC, listener.name)
                             for listener in (listeners.controller, listeners.inter_broker))
        if controller is None or admin is None:
            raise ValueError(f"the controller has no listener {listeners.controller.name} "
                             f"and {listeners.inter_broker.name}")
        self._controller = ControllerChannel(
            f"{controller.host}:{controller.port}", spec.broker_id, broker_secret=secret,
            security=spec.config.listener_security(listeners.controller.security_protocol),
            admin_address=f"{admin.host}:{admin.port}",
            admin_security=spec.config.listener_security(
                listeners.inter_broker.security_protocol),
            rebalance_timeout_ms_max=spec.config.group.group_max_rebalance_timeout_ms)
        # Share groups' state goes to the driver's `__share_group_state`, as client traffic.
        self._share_state = ShareStateChannel(
            f"{admin.host}:{admin.port}", spec.broker_id, broker_secret=secret,
            security=spec.config.listener_security(listeners.inter_broker.security_protocol))
        self._leaders = RemoteLeaderEndpoint(
            spec.broker_id, broker_secret=secret,
            security=spec.config.listener_security(listeners.inter_broker.security_protocol))
        # The partitions this broker hosts and the requests served from them.
        self._replicas = ReplicaManager(
            spec.broker_id, spec.config, self._cache, self._controller, self._stopped,
            broker_epoch=lambda: self._lifecycle.broker_epoch,
            loaded_schema=lambda subject, schema_id: self._lifecycle.loader.schema_of(
                subject, schema_id), metrics=self.metrics)
        # Applies the metadata images the heartbeats bring, on the metadata thread.
        self._publisher = BrokerMetadataPublisher(
            spec.broker_id, spec.config, self._cache, self._replicas, self._leaders,
            self._quota_manager, self._stopped)
        # Its registration and heartbeats, which bring the metadata images.
        self._lifecycle = BrokerLifecycleManager(
            spec.broker_id, spec.config, self._controller, self._publisher, self._replicas,
            self._stopped)
        self._doors = Doors()  # the listeners, once started
        # Share groups (KIP-932) in the partitions this broker leads.
        self._shares = SharePartitionManager(
            self, self._share_state, spec.config.group,
            group_configs=lambda group_id: self._image.group_configs.get(group_id))
        self.metrics.watch(
            spec.broker_id, lambda: list(self._replicas.partitions.values()),
            self._publisher.offline_replicas,
            lambda topic: (self._replicas.topic_configs.get(topic)
                           or cfg.TopicConfig()).required_isr,
            self._replicas.fetches_waiting, lambda: self._cache.image.topics.keys())

    @property
    def _image(self) -> MetadataImage:
        """The image this broker serves from (its metadata cache's)."""
        return self._cache.image

    @property
    def _partitions(self) -> dict[tuple[str, int], Partition]:
        """The partitions this broker hosts (its replica manager's table)."""
        return self._replicas.partitions

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._doors = open_doors(self._config, self.broker_id, self,
                                 credentials=self.scram_credential,
                                 forward=self._controller.forward_kafka,
                                 previous=self.spec.previous_listeners,
                                 metrics=self.metrics.node if self.metrics.enabled else None)
        self._lifecycle.register(self._doors)
        threading.Thread(target=self._lifecycle.heartbeat_loop, name="heartbeat",
                         daemon=True).start()
        threading.Thread(target=self._publisher.apply_loop, name="metadata", daemon=True).start()
        threading.Thread(target=self._replicas.isr_loop, name="isr-shrink", daemon=True).start()

    def serve_until_stopped(self) -> None:
        self._stopped.wait()

    def close(self) -> None:
        """Stop copying, commit what is queued, close every log, then stop serving. Long-polling
        fetches are answered at once with what they read last (else their answers would wait to
        the end of their max_wait_ms)."""
        self._stopped.set()
        self._replicas.fetch_purgatory.stop()
        self._publisher.stop_fetchers()
        self._replicas.close_partitions()
        self._replicas.alter_pool.shutdown(wait=False, cancel_futures=True)
        self._doors.stop()
        self._shares.close()
        self._controller.close()
        self._share_state.close()
        self._leaders.close()

    # ---- DeltaBusHandler ---------------------------------------------------------------------

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage:
        if allow_auto_create and any(t not in self._image.topics for t in topics):
            created = self._controller.metadata(topics, allow_auto_create=True)
            # The controller names brokers as seen on its own listener: keep this broker's
            # image of them, with every listener, so the door answers with its listener's.
            return dataclasses.replace(created, brokers=self._image.brokers or created.brokers)
        return self._image

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int,
                      validate_only: bool) -> list[TopicResult]:
        return self._controller.create_topics(topics, timeout_ms=timeout_ms,
                                              validate_only=validate_only)

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
        return self._controller.describe_group_configs(groups)

    def alter_group_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                            validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        return self._controller.alter_group_configs(changes, validate_only=validate_only)

    def delete_topics(self, names: list[str], *, timeout_ms: int) -> list[TopicResult]:
        return self._controller.delete_topics(names, timeout_ms=timeout_ms)

    def init_producer_id(self, transactional_id: str = "",
                         principal: KafkaPrincipal = ANONYMOUS) -> tuple[int, int]:
        """Forwarded to the controller, which hears `principal` from the forwarded call."""
        return self._controller.init_producer_id(transactional_id)

    def producer_id_issued_to(self, producer_id: int, principal: KafkaPrincipal) -> bool:
        return issued_to(producer_id, principal, self._image.producer_id_key)

    def elect_leaders(self, election_type: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._controller.elect_leaders(election_type, partitions)

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int] | None]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._controller.reassign_partitions(targets)

    def reassignment_image(self, topics: list[str]) -> MetadataImage:
        return self._controller.metadata(topics, allow_auto_create=False)

    def scale_cluster(self, brokers: int | None) -> ScaleStatus:
        return self._controller.scale_cluster(brokers)

    def balance_cluster(self, execute: bool) -> BalancePlan:
        return self._controller.balance_cluster(execute)

    def alter_user_scram_credentials(self, deletions: list[ScramCredentialDeletion],
                                     upsertions: list[ScramCredentialUpsertion]
                                     ) -> dict[str, errors.DeltaBusError | None]:
        return self._controller.alter_user_scram_credentials(deletions, upsertions)

    def describe_user_scram_credentials(self, users: list[str] | None) -> ScramDescriptions:
        """From this broker's metadata, as a KRaft broker answers it: what it authenticates
        with, not only what the controller decided."""
        return describe_scram_credentials(self._image.scram_credentials, users)

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._image.scram_credential(user, mechanism)

    def create_acls(self, creations: list[AclCreation]) -> list[errors.DeltaBusError | None]:
        return self._controller.create_acls(creations)

    def delete_acls(self, filters: list[AclBindingFilter]
                    ) -> list[list[AclBinding] | errors.DeltaBusError]:
        return self._controller.delete_acls(filters)

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """From this broker's metadata, as a KRaft broker answers it: the ACLs it authorizes
        with, not only what the controller decided."""
        return describe_acls(self._image.acls, acl_filter)

    @property
    def schema_registry(self) -> SchemaRegistryHandler:
        """The controller's registry: every call forwarded, so a broker never answers from a
        registry state behind the controller's."""
        return self._controller.schema_registry

    def alter_client_quotas(self, alterations: list[QuotaAlteration], *,
                            validate_only: bool) -> list[errors.DeltaBusError | None]:
        return self._controller.alter_client_quotas(alterations, validate_only=validate_only)

    def describe_client_quotas(self, components: list[QuotaFilterComponent],
                               strict: bool) -> dict[QuotaEntity, dict[str, float]]:
        """From this broker's metadata, as a KRaft broker answers it: what it throttles by."""
        return describe_client_quotas(self._image.client_quotas, components, strict)

    def client_quota_manager(self) -> ClientQuotaManager:
        return self._quota_manager

    def authorizer(self) -> Authorizer | None:
        if not self._config.authorizer:
            return None
        return self._authorizers.get(self._image.acls)

    def find_coordinator(self, group_id: str) -> BrokerEndpoint:
        """Groups are coordinated by the controller, in the driver."""
        return self.spec.controller

    # ---- the replica manager's requests ------------------------------------------------------

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState, batch_bytes: int | None = None,
                timeout_ms: int | None = None, in_order: bool = False) -> Future[AppendResult]:
        try:
            appended = self._replicas.produce(topic, partition, batch, acks=acks,
                                              producer=producer, batch_bytes=batch_bytes,
                                              timeout_ms=timeout_ms, in_order=in_order)
        except errors.DeltaBusError:
            self.metrics.produce_refused(topic)
            raise
        self.metrics.produced(topic, appended, batch.num_rows,
                              batch_bytes if batch_bytes is not None else batch.nbytes)
        return appended

    def write_txn_markers(self, markers: list[TxnMarker], *, timeout_ms: int
                          ) -> dict[tuple[int, str, int], errors.DeltaBusError | None]:
        return self._replicas.write_txn_markers(markers, timeout_ms=timeout_ms)

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]:
        results = self._replicas.fetch(specs, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                       max_bytes=max_bytes, replica_id=replica_id)
        self.metrics.fetched(results, replica_id)
        return results

    def fetch_delayed(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
                      max_bytes: int, replica_id: int) -> Future[list[FetchResult]]:
        answer = self._replicas.fetch_delayed(specs, max_wait_ms=max_wait_ms,
                                              min_bytes=min_bytes, max_bytes=max_bytes,
                                              replica_id=replica_id)
        self.metrics.fetched_when_done(answer, replica_id)
        return answer

    def share_fetch(self, request: ShareFetchRequest) -> ShareFetchAnswer:
        return self._shares.share_fetch(request)

    def fetches_waiting(self) -> int:
        return self._replicas.fetches_waiting()

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     isolation_level: int = READ_UNCOMMITTED) -> tuple[int, int, int]:
        return self._replicas.list_offsets(topic, partition, timestamp, isolation_level)

    def delete_records(self, topic: str, partition: int, offset: int) -> Future[int]:
        return self._replicas.delete_records(topic, partition, offset)

    def offset_for_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int,
                                leader_epoch: int) -> tuple[int, int]:
        return self._replicas.offset_for_leader_epoch(topic, partition, current_leader_epoch,
                                                      leader_epoch)

    def describe_log_dirs(self, partitions: list[tuple[str, int]] | None
                          ) -> list[LogDirDescription]:
        return self._replicas.describe_log_dirs(partitions)

    def describe_producers(self, topic: str, partition: int) -> list[ActiveProducer]:
        return self._replicas.describe_producers(topic, partition)


STOPPED = "stopped"  # a broker task's outcome when it ran (else why it could not start)


def run_broker_task(specs: Iterator[BrokerSpec]) -> Iterator[tuple[int, str]]:
    """The Spark task body: run one broker until the controller tells it to stop. Yields the
    broker id and STOPPED, or the reason it could not start (a listener's port is taken)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    context = TaskContext.get()
    if context is not None and context.attemptNumber() > 0:
        # Spark retrying the task of a lost executor: leave the relaunch to the supervisor,
        # which first catches the broker's replicas up (and keeps a held broker down).
        log.info("broker task attempt %d ends at once: the supervisor relaunches brokers",
                 context.attemptNumber())
        return
    for spec in specs:
        broker = Broker(spec)
        outcome = STOPPED
        try:
            broker.start()
            broker.serve_until_stopped()
        except errors.BrokerNotAvailableError as e:  # held down: end the task quietly
            log.info("broker %d not started: %s", spec.broker_id, e)
        except ListenerBindError as e:  # the supervisor says so to whoever started the cluster
            log.warning("broker %d not started: %s", spec.broker_id, e)
            outcome = str(e)
        finally:
            broker.close()
        yield spec.broker_id, outcome
