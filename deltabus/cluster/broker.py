"""A broker: hosts partition replicas, leads some, follows others, and serves Produce/Fetch over
gRPC. Runs inside a long-running Spark task on an executor (one task, one broker), started by
`deltabus.cluster.Cluster`.

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
import functools
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext

from deltabus import config as cfg
from deltabus import errors, trace
from deltabus.cluster.delayed_fetch import DelayedFetch, FetchPurgatory
from deltabus.cluster.doors import Doors, open_doors
from deltabus.cluster.executor_process import local_host
from deltabus.cluster.handler import (
    FetchResult,
    FetchSpec,
    LogDirDescription,
    ReplicaDescription,
    SchemaRegistryHandler,
)
from deltabus.cluster.metadata_loader import MetadataLoader
from deltabus.cluster.partition import Partition
from deltabus.cluster.producer_id_control import issued_to
from deltabus.cluster.replica_fetcher import ReplicaFetcher
from deltabus.cluster.schema_registry import check_records
from deltabus.listeners import GRPC, ListenerBindError
from deltabus.log_tables.control_records import TxnMarker
from deltabus.log_tables.layout import log_dir, replica_path
from deltabus.log_tables.partition_log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ActiveProducer,
    AppendResult,
    PartitionLog,
    Validation,
)
from deltabus.log_tables.partition_reader import LogFile
from deltabus.log_tables.transactions import READ_COMMITTED, READ_UNCOMMITTED
from deltabus.metadata import (
    NO_LEADER,
    BrokerEndpoint,
    ListenerEndpoint,
    MetadataImage,
    NewTopic,
    PartitionState,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    ScramDescriptions,
    TopicResult,
    describe_scram_credentials,
    empty_image,
)
from deltabus.quotas import (
    ClientQuotaManager,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilterComponent,
    describe_client_quotas,
)
from deltabus.records import (
    CREATE_TIME,
    KEY_FIELDS,
    LOG_APPEND_TIME,
    VALUE_FIELDS,
    ProducerState,
)
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.leader_endpoint import RemoteLeaderEndpoint
from deltabus.schemas import ParsedSchema, SchemaRegistryError
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
from deltabus.topics import validate_topic_name

log = logging.getLogger(__name__)

LOG_OPEN_THREADS = 8


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
        self._log_config = spec.config.log_config()
        self._image = empty_image()
        self._image_applied = threading.Condition()  # notified with every image applied
        # The heartbeat thread hands the loader's newest image to the metadata thread, which
        # applies it (`_apply_loop`); `_applied_image` is the last it applied, `_generation`
        # counts registrations (an image of an earlier one is not reported as applied).
        self._publish = threading.Condition()
        self._to_apply: MetadataImage | None = None
        self._generation = 0
        self._reported_version = 0  # the applied version the last heartbeat said
        self._new_loader()
        self._authorizers = AuthorizerCache(
            super_users=spec.config.super_users,
            allow_everyone_if_no_acl_found=spec.config.allow_everyone_if_no_acl_found)
        self._topic_configs: dict[str, cfg.TopicConfig] = {}
        self._quota_manager = ClientQuotaManager()
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._partitions_lock = threading.Lock()
        # Hosted replicas whose tables cannot be opened (lost): reported with every heartbeat,
        # so the controller keeps them out of ISRs and leadership. The metadata thread changes
        # it; the heartbeat thread sends a copy.
        self._offline: set[tuple[str, int]] = set()
        self._fetchers: dict[int, ReplicaFetcher] = {}
        # Fetches waiting for appends (long polls), with no thread each: `fetch_delayed`.
        self._fetch_purgatory = FetchPurgatory(
            "delayed-fetch", completion_threads_max=cfg.DELAYED_FETCH_COMPLETION_THREADS)
        self._stopped = threading.Event()
        self._epoch = -1
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
        self._leaders = RemoteLeaderEndpoint(
            spec.broker_id, broker_secret=secret,
            security=spec.config.listener_security(listeners.inter_broker.security_protocol))
        self._alter_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alter-isr")
        self._doors = Doors()  # the listeners, once started

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._doors = open_doors(self._config, self.broker_id, self,
                                 credentials=self.scram_credential,
                                 forward=self._controller.forward_kafka,
                                 previous=self.spec.previous_listeners)
        self._register()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._apply_loop, name="metadata", daemon=True).start()
        threading.Thread(target=self._isr_loop, name="isr-shrink", daemon=True).start()

    def _refresh_logs(self, refresh: list[tuple[str, int]]) -> None:
        """Take in what the log cleaner's Spark job did to these tables (removed or rewrote old
        files): the log start offset moves up, reads skip the removed files. The controller
        says so with the next heartbeat, well within file.delete.delay.ms, so no read touches a
        file vacuum deleted."""
        for topic, p in refresh:
            with self._partitions_lock:
                partition = self._partitions.get((topic, p))
            if partition is None:
                continue
            try:
                partition.log.refresh()
            except Exception as e:  # storage trouble: reads refresh again on a miss
                log.warning("refreshing %s-%d failed: %s", topic, p, e)

    def _register(self) -> None:
        # The rack is the executor's machine: replicas spread across machines where there are
        # several.
        rack = os.environ.get("DELTABUS_RACK") or local_host()
        endpoint = self._doors.node(
            self.broker_id, self._config.listener_config().inter_broker_listener_name, rack)
        incarnation_id = uuid.uuid4().hex
        deadline = time.monotonic() + self._config.startup_timeout_ms / 1000
        while True:
            try:
                self._epoch = self._controller.register(endpoint, pid=os.getpid(),
                                                        incarnation_id=incarnation_id)
                self._new_loader()
                log.info("broker %d registered, epoch %d, listeners %s", self.broker_id,
                         self._epoch, ", ".join(f"{e.name}://{e.host}:{e.port} ({e.door})"
                                                for e in endpoint.listeners))
                return
            except errors.NetworkError as e:  # no answer yet: the controller may be starting
                if time.monotonic() > deadline:
                    raise errors.NetworkError(f"cannot reach the controller: {e}") from None
                time.sleep(0.2)

    def _new_loader(self) -> None:
        """Replay the controller's metadata records from a snapshot (at every registration:
        positions in them are one controller's own), saying none applied until it is loaded;
        the image served until then stays."""
        self._loader = MetadataLoader(self._config.root)
        with self._publish:
            self._generation += 1
            self._applied_image: MetadataImage | None = None  # the loader's, applied
            self._to_apply = None

    def _heartbeat_loop(self) -> None:
        """Heartbeat and apply metadata until told to stop. A round that fails in any way is
        logged and the next one runs: without heartbeats the broker is fenced for good.

        A broker whose registration is gone (STALE_BROKER_EPOCH: the controller fenced it for
        missed heartbeats, or its supervisor after its Spark task ended, or a newer incarnation
        registered) stops: it does not register again. Its supervisor relaunches it as a new
        task, after catching its replicas up with a Spark job that writes their tables. A
        fenced broker that registered again from its old process would be live beside that
        job and beside its own successor (each fencing the other as it registers): several
        writers of its tables, each with its own idea of what they hold and of its role."""
        interval_ms = self._config.broker_heartbeat_interval_ms
        while not self._stopped.is_set():
            try:
                self._heartbeat(interval_ms)
            except errors.StaleBrokerEpochError:
                log.warning("broker %d was fenced (epoch %d); stopping: it is relaunched as a "
                            "new task", self.broker_id, self._epoch)
                self._stopped.set()
            except errors.DeltaBusError as e:
                log.warning("heartbeat to the controller failed: %s", e)
                self._stopped.wait(interval_ms / 1000)
            except Exception:
                log.exception("broker %d: a heartbeat round failed", self.broker_id)
                self._stopped.wait(interval_ms / 1000)

    def _heartbeat(self, interval_ms: int) -> None:
        """One round: heartbeat (a long poll, unless a newly applied version is to be said),
        replay the records the answer carries, and hand the loader's image, if new, to the
        metadata thread. The version said applied is the last image applied: one whose
        `_apply` failed is applied again. An apply that ends within the heartbeat interval is
        said at once; a longer one (thousands of partition tables to open) never holds the
        heartbeats up."""
        loader = self._loader
        with self._publish:
            applied = self._applied_image.version if self._applied_image is not None else 0
        answer = self._controller.heartbeat(
            self.broker_id, self._epoch, applied,
            max_wait_ms=0 if applied != self._reported_version else interval_ms,
            position=loader.position, offline_replicas=sorted(self._offline.copy()))
        self._reported_version = applied
        if answer.metadata is not None:
            try:
                loader.replay(answer.metadata)
            except Exception:
                log.exception("broker %d cannot replay the metadata records it was sent; "
                              "loading a snapshot", self.broker_id)
                self._new_loader()
                return
        image = loader.image
        if image is not None:
            with self._publish:
                if image is not self._applied_image:
                    self._to_apply = image
                    self._publish.notify_all()
                    self._publish.wait_for(lambda: self._applied_image is image
                                           or self._stopped.is_set(), interval_ms / 1000)
        if answer.refresh_logs:
            self._refresh_logs(answer.refresh_logs)
        if answer.should_shut_down:
            self._stopped.set()

    def _apply_loop(self) -> None:
        """Apply the newest image the heartbeats brought, on a thread of its own (KRaft's
        metadata publisher): opening a few thousand partition tables takes minutes, and a
        broker whose heartbeats waited on it was fenced, relaunched, and opened them all again.
        A failed apply is logged and tried again with the next image or after an interval."""
        interval_s = self._config.broker_heartbeat_interval_ms / 1000
        while not self._stopped.is_set():
            with self._publish:
                image, generation = self._to_apply, self._generation
                if image is None or image is self._applied_image:
                    self._publish.wait(interval_s)
                    continue
            try:
                self._apply(image)
            except Exception:
                log.exception("broker %d: applying metadata version %d failed", self.broker_id,
                              image.version)
                self._stopped.wait(interval_s)
                continue
            with self._publish:
                if generation == self._generation:
                    self._applied_image = image
                self._publish.notify_all()

    def serve_until_stopped(self) -> None:
        self._stopped.wait()

    def close(self) -> None:
        """Stop copying, commit what is queued, close every log, then stop serving. Long-polling
        fetches are answered at once with what they read last (else their answers would wait to
        the end of their max_wait_ms)."""
        self._stopped.set()
        self._fetch_purgatory.stop()
        for fetcher in list(self._fetchers.values()):
            fetcher.stop()
        with self._partitions_lock:
            partitions, self._partitions = list(self._partitions.values()), {}
        for partition in partitions:
            partition.log.close()
        self._alter_pool.shutdown(wait=False, cancel_futures=True)
        self._doors.stop()
        self._controller.close()
        self._leaders.close()

    # ---- metadata ----------------------------------------------------------------------------

    def _apply(self, image: MetadataImage) -> None:
        """Open the replicas this broker now hosts and close the ones it no longer does; make
        each a leader or a follower as the image says, and point the fetchers at the leaders."""
        hosted = {
            (topic.name, p.partition): p
            for topic in image.topics.values() for p in topic.partitions
            if self.broker_id in p.replicas
        }
        with self._partitions_lock:
            current = set(self._partitions)
        for key in sorted(current - set(hosted)):
            self._unfollow(key)
            with self._partitions_lock:
                partition = self._partitions.pop(key)
            partition.log.close()
            self._fetch_purgatory.check(key)  # its fetches answer NOT_LEADER_OR_FOLLOWER now
            log.info("broker %d no longer hosts %s-%d", self.broker_id, *key)
        self._offline &= set(hosted)  # a replica no longer hosted is not ours to report
        opening = sorted(set(hosted) - current)
        if opening:  # in parallel: a broker may host hundreds of partitions
            with ThreadPoolExecutor(max_workers=LOG_OPEN_THREADS) as pool:
                for key, opened in zip(opening, pool.map(self._open_partition, opening),
                                       strict=True):
                    if opened is None:  # tried again with the next metadata
                        self._offline.add(key)
                        continue
                    self._offline.discard(key)
                    with self._partitions_lock:
                        self._partitions[key] = opened
        # Parsed once per metadata version, not per produce request; set before the image so a
        # topic visible in the image always has its config.
        self._topic_configs = {name: self._config.topic_config(t.configs)
                               for name, t in image.topics.items()}
        for key, state in hosted.items():
            with self._partitions_lock:
                found = self._partitions.get(key)
            if found is not None:
                found.log.flush_messages = self._topic_configs[key[0]].flush_messages
                self._apply_partition(found, state, image)
        if image.acls == self._image.acls:  # the same tuple: the authorizer is not rebuilt
            image = dataclasses.replace(image, acls=self._image.acls)
        self._quota_manager.update(image.client_quotas)
        with self._image_applied:
            self._image = image
            self._image_applied.notify_all()

    def _apply_partition(self, partition: Partition, state: PartitionState,
                         image: MetadataImage) -> None:
        key = (partition.topic, partition.partition)
        following = state.leader not in (self.broker_id, NO_LEADER)
        # Before the role changes: a copy from the old leader lands first, or not at all.
        self._unfollow(key, keep=state.leader if following else NO_LEADER)
        if partition.apply(state, image.version) and partition.is_leader:
            partition.log.reset_transactions(image.open_transactions.get(key, frozenset()))
        self._fetch_purgatory.check(key)  # a fetch of an old leader epoch is answered now
        if not following:
            return
        fetcher = self._fetchers.get(state.leader)
        if fetcher is None:
            fetcher = self._fetchers[state.leader] = ReplicaFetcher(
                self.broker_id, state.leader, self._leaders, self._config)
        leader = image.broker(state.leader)
        if leader is not None:
            fetcher.set_address(leader.address)
        fetcher.follow(partition, state.leader_epoch)

    def _unfollow(self, key: tuple[str, int], keep: int = NO_LEADER) -> None:
        """Stop copying `key` from every leader but `keep`."""
        for leader_id, fetcher in self._fetchers.items():
            if leader_id != keep:
                fetcher.unfollow(key)

    def _open_partition(self, key: tuple[str, int]) -> Partition | None:
        """Open a hosted replica's log, or None when its table is missing or unreadable: then
        the replica is offline (never created empty: see PartitionLog) until it opens."""
        topic, partition = key
        holder: list[Partition] = []
        try:
            opened = PartitionLog(
                replica_path(self._config.root, topic, partition, self.broker_id),
                topic=topic, partition=partition, config=self._log_config,
                storage=self._config.storage,
                on_append=lambda: self._on_log_change(holder), replicated=True, create=False)
        except Exception as e:  # one unreadable table must not take the broker down
            if key not in self._offline:  # said once, not with every metadata version
                log.error("broker %d cannot open %s-%d; reporting it offline: %s",
                          self.broker_id, topic, partition, e,
                          exc_info=not isinstance(e, errors.KafkaStorageError))
            return None
        holder.append(Partition(topic, partition, self.broker_id, opened))
        log.info("broker %d opened %s-%d at offset %d", self.broker_id, topic, partition,
                 opened.log_end_offset)
        return holder[0]

    def _on_log_change(self, holder: list[Partition]) -> None:
        """A log's end or high watermark moved: a leader may move its high watermark, and
        the fetches waiting on the partition (consumers and followers) may complete."""
        if holder:
            holder[0].on_log_change()
            self._fetch_purgatory.check((holder[0].topic, holder[0].partition))

    def _partition(self, topic: str, partition: int) -> Partition:
        """A hosted partition; raises Kafka's error when the topic-partition is unknown here."""
        with self._partitions_lock:
            hosted = self._partitions.get((topic, partition))
        if hosted is None:
            if self._image.partition(topic, partition) is None:
                raise errors.UnknownTopicOrPartitionError(
                    f"This server does not host this topic-partition: {topic}-{partition}")
            state = self._image.partition(topic, partition)
            raise errors.NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {topic}-{partition} "
                f"(leader: {state.leader if state else -1})")
        return hosted

    # ---- ISR ---------------------------------------------------------------------------------

    def _isr_loop(self) -> None:
        """Kafka's isr-expiration task: every half lag period, drop lagging followers."""
        lag_max_ms = self._config.replica_lag_time_max_ms
        while not self._stopped.wait(lag_max_ms / 2000):
            with self._partitions_lock:
                partitions = list(self._partitions.values())
            for partition in partitions:
                new_isr = partition.lagging_isr(lag_max_ms)
                if new_isr is not None:
                    self._alter_isr(partition, new_isr)

    def _alter_isr(self, partition: Partition, new_isr: list[int]) -> None:
        """Ask the controller for an ISR change; the partition holds it as pending until then."""
        try:
            isr, version = self._controller.alter_partition(
                self.broker_id, self._epoch, partition.topic, partition.partition,
                leader_epoch=partition.leader_epoch, isr=list(partition.isr), new_isr=new_isr)
        except errors.NetworkError as e:  # no answer: the controller may have committed it
            log.info("ISR change of %s-%d to %s got no answer: %s", partition.topic,
                     partition.partition, new_isr, e)
            partition.isr_change_failed(outcome_known=False)
            return
        except errors.DeltaBusError as e:
            log.info("ISR change of %s-%d to %s refused: %s", partition.topic,
                     partition.partition, new_isr, e)
            partition.isr_change_failed()
            return
        partition.isr_committed(isr, version)

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

    def delete_topics(self, names: list[str], *, timeout_ms: int) -> list[TopicResult]:
        return self._controller.delete_topics(names, timeout_ms=timeout_ms)

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState, batch_bytes: int | None = None,
                timeout_ms: int | None = None) -> Future[AppendResult]:
        try:
            hosted = self._partition(topic, partition)
        except errors.UnknownTopicOrPartitionError:
            validate_topic_name(topic)  # INVALID_TOPIC_EXCEPTION: no topic may have the name
            raise
        leader_epoch = hosted.check_leader()
        if producer.transactional:
            self._check_in_transaction(topic, partition, producer, hosted.log)
        topic_config = self._topic_configs.get(topic) or cfg.TopicConfig()
        if acks == -1:  # nothing is appended when the ISR is already too small
            hosted.check_min_isr(topic_config.min_insync_replicas)
        timestamp_type = (LOG_APPEND_TIME if topic_config.message_timestamp_type == "LogAppendTime"
                          else CREATE_TIME)
        appended = hosted.log.append(batch, leader_epoch=leader_epoch,
                                     timestamp_type=timestamp_type, producer=producer,
                                     max_message_bytes=topic_config.max_message_bytes,
                                     batch_bytes=batch_bytes,
                                     compacted=topic_config.compacts, timeout_ms=timeout_ms,
                                     validate=self._schema_check(topic, topic_config))
        if acks == 0:
            return appended
        return hosted.acknowledged(appended, leader_epoch, topic_config.min_insync_replicas
                                   if acks == -1 else None)

    def _schema_check(self, topic: str, config: cfg.TopicConfig) -> Validation | None:
        """The topic's schema validation (confluent.key/value.schema.validation, and a typed
        topic's key.schema.subject and value.schema.subject), as the log runs it on a produce
        batch: it returns a typed topic's decoded keys and values, by typed column. None when
        the topic validates nothing."""
        # (column, subject, typed column or None): Confluent's TopicNameStrategy subjects
        checks: list[tuple[str, str, str | None]] = [
            (f, f"{topic}-{f}", None) for f, on in (("key", config.key_schema_validation),
                                                    ("value", config.value_schema_validation))
            if on]
        for field, subject, column in (("key", config.key_schema_subject, KEY_FIELDS),
                                       ("value", config.value_schema_subject, VALUE_FIELDS)):
            if subject:
                checks.append((field, subject, column))
        if not checks:
            return None

        def check(batch: pa.Table) -> dict[str, pa.Array]:
            typed = {}
            for field, subject, column in checks:
                decoded = check_records(functools.partial(self._schema_of, subject), subject,
                                        batch.column(field), field, topic)
                # A batch whose keys (values) are all null decodes to none: its typed column
                # would take the null type, which no later struct could be written into.
                if column is not None and not pa.types.is_null(decoded.type):
                    typed[column] = decoded
            return typed
        return check

    def _schema_of(self, subject: str, schema_id: int) -> ParsedSchema | None:
        """The schema a record names, if registered under `subject`. One registered a moment
        ago may not have reached this broker's metadata yet: if the controller's registry holds
        it, the metadata that brings it is waited for (SCHEMA_METADATA_WAIT_MS)."""
        found = self._loader.schema_of(subject, schema_id)
        if found is not None:
            return found
        try:
            versions = self._controller.schema_registry.schema_versions(schema_id, True)
        except (SchemaRegistryError, errors.DeltaBusError):
            return None  # no such id, or no controller to ask: refused as unknown
        if not any(v.subject == subject for v in versions):
            return None
        deadline = time.monotonic() + cfg.SCHEMA_METADATA_WAIT_MS / 1000
        with self._image_applied:
            while (found := self._loader.schema_of(subject, schema_id)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._image_applied.wait(left)
        return found

    def _check_in_transaction(self, topic: str, partition: int, producer: ProducerState,
                              log: PartitionLog) -> None:
        """A transactional batch's producer must have added the partition to its transaction
        (AddPartitionsToTxn), as Kafka 3.6+ verifies (KIP-890): else INVALID_TXN_STATE. The
        coordinator's record may reach this broker's metadata just after the client heard it
        was added, so an absent producer is waited for a little. A producer fenced since (the
        log holds its id at a newer epoch: the marker that aborted its transaction, or its
        successor's batch) is told INVALID_PRODUCER_EPOCH first, as Kafka's verification
        answers it: clients take that as fenced, fatal, where INVALID_TXN_STATE would only
        abort the zombie's transaction and let it go on."""
        producer_id = producer.producer_id
        if producer_id in self._image.open_transactions.get((topic, partition), frozenset()):
            return
        log.check_producer_epoch(producer)
        deadline = time.monotonic() + cfg.TXN_VERIFY_WAIT_MS / 1000
        with self._image_applied:
            while producer_id not in self._image.open_transactions.get(
                    (topic, partition), frozenset()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.InvalidTxnStateError(
                        f"producer {producer_id} has no transaction open on {topic}-"
                        f"{partition}: add the partition to its transaction first")
                self._image_applied.wait(left)

    def write_txn_markers(self, markers: list[TxnMarker], *, timeout_ms: int
                          ) -> dict[tuple[int, str, int], errors.DeltaBusError | None]:
        """Kafka's WriteTxnMarkers on this broker's partitions: each marker appended as a
        control row (PartitionLog.append_marker) and answered once the ISR holds it (acks=all:
        a marker must survive a change of leader), or with why not: NOT_LEADER_OR_FOLLOWER,
        UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH, REQUEST_TIMED_OUT."""
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        out: dict[tuple[int, str, int], errors.DeltaBusError | None] = {}
        pending: dict[tuple[int, str, int], Future[AppendResult]] = {}
        for marker in markers:
            for topic, partition in marker.partitions:
                key = (marker.producer_id, topic, partition)
                try:
                    hosted = self._partition(topic, partition)
                    leader_epoch = hosted.check_leader()
                    config = self._topic_configs.get(topic) or cfg.TopicConfig()
                    appended = hosted.log.append_marker(
                        marker.producer_id, marker.producer_epoch, committed=marker.committed,
                        coordinator_epoch=marker.coordinator_epoch, leader_epoch=leader_epoch)
                    pending[key] = hosted.acknowledged(appended, leader_epoch,
                                                       config.min_insync_replicas)
                except errors.DeltaBusError as e:
                    out[key] = e
        for key, future in pending.items():
            try:
                future.result(max(0.0, deadline - time.monotonic()))
                out[key] = None
            except errors.DeltaBusError as e:
                out[key] = e
            except TimeoutError:
                out[key] = errors.RequestTimedOutError(
                    f"the marker of producer {key[0]} on {key[1]}-{key[2]} was not replicated "
                    f"within {timeout_ms} ms")
        return out

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]:
        """`fetch_delayed`, waited for on the caller's thread (the gRPC doors' long polls)."""
        fetched = self.fetch_delayed(specs, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                                     max_bytes=max_bytes, replica_id=replica_id)
        try:
            return fetched.result((max_wait_ms + cfg.DELAYED_FETCH_GRACE_MS) / 1000)
        except TimeoutError:  # a bug, or reads stuck in storage: answer with what is there
            log.error("broker %d: a delayed fetch was not completed %d ms past its max wait; "
                      "reading at once", self.broker_id, cfg.DELAYED_FETCH_GRACE_MS)
            return self.fetch_delayed(specs, max_wait_ms=0, min_bytes=min_bytes,
                                      max_bytes=max_bytes, replica_id=replica_id).result()

    def fetch_delayed(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
                      max_bytes: int, replica_id: int) -> Future[list[FetchResult]]:
        """Kafka's long poll, with no thread waiting: read every partition; if less than
        min_bytes came back and no partition failed, the fetch waits in the fetch purgatory
        (`delayed_fetch`) and its future completes when an append to one of its partitions
        brings enough, its leader changes, or max_wait_ms passed (then with what is there).
        A follower's fetch first tells each partition's leader state how far the follower's
        log reaches (once per request). Each partition is read within its own max bytes; the
        door cuts the answer to `max_bytes` on the bytes it sends (`rpc.fetch_size`)."""
        deadline_s = time.monotonic() + max_wait_ms / 1000
        follower_errors = self._follower_fetched(specs, replica_id) if replica_id >= 0 else {}
        results = [follower_errors.get(i) or self._fetch_one(spec, replica_id)
                   for i, spec in enumerate(specs)]
        if _enough(results, min_bytes) or max_wait_ms <= 0 or self._stopped.is_set():
            done: Future[list[FetchResult]] = Future()
            done.set_result(results)
            return done
        last = [results]  # what a stopping broker answers with

        def read_again() -> list[FetchResult] | None:
            last[0] = [self._fetch_one(spec, replica_id) for spec in specs]
            return last[0] if _enough(last[0], min_bytes) else None

        return self._fetch_purgatory.watch(DelayedFetch(
            keys={(spec.topic, spec.partition) for spec in specs}, deadline_s=deadline_s,
            has_news=lambda: any(self._has_news(spec, replica_id) for spec in specs),
            try_complete=read_again,
            on_expiration=lambda: [self._fetch_one(spec, replica_id) for spec in specs],
            on_stop=lambda: last[0]))

    def fetches_waiting(self) -> int:
        """Fetches waiting for appends or their max wait (none holds a thread)."""
        return self._fetch_purgatory.waiting()

    def _has_news(self, spec: FetchSpec, replica_id: int) -> bool:
        """Whether reading `spec` again may answer differently: records past its offset (below
        the high watermark for a consumer, in the log for a follower), or its partition gone
        or led by another broker or epoch. Called on whatever thread changed a log, perhaps
        holding another partition's lock: it reads attributes and takes no lock."""
        hosted = self._partitions.get((spec.topic, spec.partition))  # a dict read is atomic
        if hosted is None or hosted.leader != self.broker_id:
            return True
        if spec.current_leader_epoch >= 0 and hosted.leader_epoch != spec.current_leader_epoch:
            return True
        plog = hosted.log
        if replica_id >= 0:
            reached = plog.log_end_offset
        elif spec.isolation_level == READ_COMMITTED:  # moved by markers, not only appends
            reached = plog.stable_offset_hint
        else:
            reached = plog.high_watermark
        return reached > spec.offset

    def _follower_fetched(self, specs: list[FetchSpec],
                          replica_id: int) -> dict[int, FetchResult]:
        """Record a follower's fetch offsets (once per request); returns the partitions that
        failed or diverge, by position, answered without records."""
        out = {}
        for i, spec in enumerate(specs):
            result = FetchResult(spec.topic, spec.partition)
            try:
                hosted = self._partition(spec.topic, spec.partition)
                hosted.check_leader(spec.current_leader_epoch)
                if replica_id not in hosted.replicas:
                    raise errors.NotLeaderOrFollowerError(
                        f"broker {replica_id} is not a replica of {spec.topic}-{spec.partition}")
                diverging = hosted.diverging_epoch(spec.offset, spec.last_fetched_epoch)
                if diverging is not None:
                    result.diverging_epoch = diverging
                    result.high_watermark = hosted.log.high_watermark
                    out[i] = result
                    continue
                proposal = hosted.follower_fetched(replica_id, spec.offset,
                                                   spec.log_start_offset)
                if proposal is not None:
                    self._alter_pool.submit(self._alter_isr, hosted, proposal)
            except errors.DeltaBusError as e:
                result.error = e
                out[i] = result
        return out

    def _fetch_one(self, spec: FetchSpec, replica_id: int = -1) -> FetchResult:
        result = FetchResult(spec.topic, spec.partition)
        try:
            hosted = self._partition(spec.topic, spec.partition)
            hosted.check_leader(spec.current_leader_epoch)
            plog = hosted.log
            result.high_watermark = plog.high_watermark
            result.log_start_offset = plog.log_start_offset
            result.log_end_offset = plog.log_end_offset
            if spec.offset < result.log_start_offset:  # no files from below it either
                raise errors.OffsetOutOfRangeError(
                    f"offset {spec.offset} is below the log start offset "
                    f"{result.log_start_offset} of {spec.topic}-{spec.partition}")
            if replica_id >= 0 and self._config.replica_copy_files:
                result.files = self._files_to_copy(plog, spec.offset)
                if result.files:
                    return result
            # Read a little under the limit: the encoding adds its metadata, and a read that
            # fits whole is sent without the door searching for a shorter prefix.
            limit = min(spec.max_bytes, cfg.FETCH_RESPONSE_PARTITION_BYTES_MAX)
            committed = replica_id < 0 and spec.isolation_level == READ_COMMITTED
            if committed:
                result.last_stable_offset = plog.last_stable_offset()
            elif replica_id < 0:  # not worth reading the table's markers for (as last known)
                result.last_stable_offset = plog.stable_offset_hint
            result.records = plog.read(spec.offset, limit - limit // FETCH_READ_SLACK_SHARE,
                                       to_log_end=replica_id >= 0,
                                       upto=result.last_stable_offset if committed else None)
            if result.records.num_rows and trace.traced(spec.topic):
                offsets = result.records.column("offset")
                trace.stamp("read", spec.topic, spec.partition, offsets[0].as_py(),
                            offsets[-1].as_py(), read=trace.now_ns(), replica=replica_id)
            if committed and result.records.num_rows:
                last = result.records.column("offset")[-1].as_py()
                result.aborted_transactions = plog.aborted_transactions(spec.offset, last + 1)
        except errors.DeltaBusError as e:
            result.error = e
        return result

    def _files_to_copy(self, plog: PartitionLog, offset: int) -> list[LogFile]:
        """The files a follower fetching from `offset` copies whole (none: it is sent records).
        A tail the leader's cache holds, below `replica_files_min_bytes`, goes as records: a
        file copy costs a listing of the table's log, the copy and its read-back, one after
        another behind every acks=all produce (on an object store, five requests more than the
        follower writing records), while records from memory cost one encoding. A follower
        far behind, or large commits, copy files (no encoding on the follower)."""
        if plog.cached_tail_under(offset, self._config.replica_files_min_bytes):
            return []
        return plog.files_from(offset, self._config.replica_files_max_bytes)

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

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     isolation_level: int = READ_UNCOMMITTED) -> tuple[int, int, int]:
        """As Kafka: read_committed's latest offset is the last stable offset."""
        hosted = self._partition(topic, partition)
        leader_epoch = hosted.check_leader()
        if timestamp != EARLIEST_TIMESTAMP:
            hosted.check_offsets_available()
        if timestamp == LATEST_TIMESTAMP and isolation_level == READ_COMMITTED:
            return hosted.log.last_stable_offset(), -1, leader_epoch
        offset, ts = hosted.log.offset_for_timestamp(timestamp)
        return offset, ts, leader_epoch

    def delete_records(self, topic: str, partition: int, offset: int) -> Future[int]:
        """DeleteRecords: refused (POLICY_VIOLATION) on a topic whose cleanup.policy does not
        include delete, as Kafka refuses it."""
        hosted = self._partition(topic, partition)
        hosted.check_leader()
        if not (self._topic_configs.get(topic) or cfg.TopicConfig()).deletes:
            raise errors.PolicyViolationError(
                f"records of {topic}-{partition} cannot be deleted: its cleanup.policy does "
                "not include delete")
        return hosted.delete_records(offset)

    def offset_for_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int,
                                leader_epoch: int) -> tuple[int, int]:
        hosted = self._partition(topic, partition)
        hosted.check_leader(current_leader_epoch)
        return hosted.end_offset_for_epoch(leader_epoch)

    def describe_log_dirs(self, partitions: list[tuple[str, int]] | None
                          ) -> list[LogDirDescription]:
        """The one log dir of this broker's replica tables, with each hosted replica's size
        (from its log's data files: no listing) and Kafka's offset lag (none: deltabus has no
        future replicas). Replicas this broker does not host are left out, as in Kafka."""
        with self._partitions_lock:
            hosted = dict(self._partitions)
        keys = sorted(hosted) if partitions is None else sorted(
            {k for k in partitions if k in hosted})
        total, usable = self._config.storage.volume_bytes()
        where = log_dir(self._config.root)
        try:
            replicas = [_replica_description(hosted[key].log) for key in keys]
        except Exception as e:  # the storage failed: Kafka's offline log dir
            return [LogDirDescription(where, [], total, usable, errors.KafkaStorageError(
                f"cannot read the replica tables under {where}: {e}"))]
        return [LogDirDescription(where, replicas, total, usable)]

    def describe_producers(self, topic: str, partition: int) -> list[ActiveProducer]:
        """From this broker's replica, leader or follower, as Kafka's ReplicaManager answers."""
        return self._partition(topic, partition).log.active_producers()


def _replica_description(plog: PartitionLog) -> ReplicaDescription:
    """A hosted replica as DescribeLogDirs tells of it: Kafka's offset lag of a current (not
    future) replica is its high watermark past its log end, never below 0."""
    return ReplicaDescription(plog.topic, plog.partition, plog.size_bytes(),
                              max(0, plog.high_watermark - plog.log_end_offset))


FETCH_READ_SLACK_SHARE = 16  # a partition's read leaves 1/16 of its limit for the encoding


def _enough(results: list[FetchResult], min_bytes: int) -> bool:
    """Whether a fetch's read answers it now: min_bytes (at least one) came back, or a
    partition failed or diverges (its client must act first)."""
    return (_read_bytes(results) >= max(min_bytes, 1)
            or any(r.error or r.diverging_epoch for r in results))


def _read_bytes(results: list[FetchResult]) -> int:
    """How much a fetch read (records, and files a follower copies): what min_bytes measures.
    The answer's own limits (max_bytes, each partition's) are the door's to keep, on the bytes
    it encodes (`rpc.fetch_size`)."""
    return sum(sum(f.size_bytes for f in r.files or ())
               + (r.records.nbytes if r.records is not None else 0) for r in results)


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
