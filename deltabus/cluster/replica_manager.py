"""A broker's replica manager (Kafka's ReplicaManager): the partitions it hosts, and the
requests served from them: produce (acks, the topic's schema check, the transaction check),
fetch for consumers and followers (with the fetch purgatory for long polls, and the followers'
offsets that move high watermarks and ISRs), the ISR shrink task and its AlterPartition calls,
list offsets, delete records, offset for leader epoch, transaction markers, log dirs and
producers.

Separate from the `Broker` because this is the broker's data path, and nothing else: the
broker's session with the controller is `broker_lifecycle`'s, and which partitions it hosts and
leads is decided by `broker_metadata_publisher`, which opens and closes them here
(`add_partition`, `remove_partition`). Runs on executors, in a broker task.

Thread-safe: gRPC threads call the request methods concurrently; the partition table is read and
changed under `partitions_lock` (except by `_has_news`, which reads it without a lock: a dict
read is atomic); the ISR thread (`isr_loop`) and the alter-isr pool send ISR changes.
Invariants:
- Produced records are appended only to a partition this broker leads in the metadata it has
  applied, stamped with that metadata's leader epoch; else NOT_LEADER_OR_FOLLOWER.
- Consumers read up to the high watermark; acks=all is answered once the high watermark passes
  the records (every in-sync replica holds them, durably, in its Delta table).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors, trace
from deltabus.cluster.broker_metrics import BrokerMetrics
from deltabus.cluster.delayed_fetch import DelayedFetch, FetchPurgatory
from deltabus.cluster.handler import (
    FetchResult,
    FetchSpec,
    LogDirDescription,
    ReplicaDescription,
)
from deltabus.cluster.metadata_cache import MetadataCache
from deltabus.cluster.partition import Partition
from deltabus.cluster.replication_quota import ReplicationQuota
from deltabus.cluster.schema_registry import check_records
from deltabus.log_tables.control_records import TxnMarker
from deltabus.log_tables.layout import log_dir
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
from deltabus.metadata import LogReport
from deltabus.records import (
    CREATE_TIME,
    KEY_FIELDS,
    LOG_APPEND_TIME,
    VALUE_FIELDS,
    ProducerState,
)
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.schemas import ParsedSchema, SchemaRegistryError
from deltabus.topics import validate_topic_name

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]


class ReplicaManager:
    """One broker's hosted partitions and the requests served from them. Runs on executors;
    thread-safe (see the module docstring)."""

    def __init__(self, broker_id: int, config: cfg.ClusterConfig, cache: MetadataCache,
                 controller: ControllerChannel, stopped: threading.Event, *,
                 broker_epoch: Callable[[], int],
                 loaded_schema: Callable[[str, int], ParsedSchema | None],
                 metrics: BrokerMetrics | None = None) -> None:
        """`broker_epoch`: the epoch of the broker's registration, which ISR changes carry
        (the lifecycle manager's, which changes as it registers, as Kafka's AlterPartition
        manager asks its lifecycle manager). `loaded_schema`: a schema by subject and id from
        the broker's metadata loader (the one loaded now: each registration starts another).
        `metrics`: the broker's, which count what is produced and fetched."""
        self.broker_id = broker_id
        self._config = config
        self._cache = cache
        self._controller = controller
        self._stopped = stopped
        self._broker_epoch = broker_epoch
        self._loaded_schema = loaded_schema
        # Each topic's config, parsed once per metadata version by the metadata publisher
        # (not per produce request), and set before the image so a topic visible in the image
        # always has its config.
        self.topic_configs: dict[str, cfg.TopicConfig] = {}
        self.partitions: dict[PartitionKey, Partition] = {}
        self.partitions_lock = threading.Lock()
        # Fetches waiting for appends (long polls), with no thread each: `fetch_delayed`.
        self.fetch_purgatory = FetchPurgatory(
            "delayed-fetch", completion_threads_max=cfg.DELAYED_FETCH_COMPLETION_THREADS)
        self.alter_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alter-isr")
        # leader.replication.throttled.rate, on what the replicas a reassignment adds fetch
        self.leader_quota = ReplicationQuota(config.leader_replication_throttled_rate)
        self.metrics = metrics or BrokerMetrics()

    # ---- the partition table (the metadata publisher changes it) -----------------------------

    def hosted_keys(self) -> set[PartitionKey]:
        with self.partitions_lock:
            return set(self.partitions)

    def get_partition(self, key: PartitionKey) -> Partition | None:
        with self.partitions_lock:
            return self.partitions.get(key)

    def add_partition(self, key: PartitionKey, partition: Partition) -> None:
        with self.partitions_lock:
            self.partitions[key] = partition

    def remove_partition(self, key: PartitionKey) -> Partition:
        with self.partitions_lock:
            return self.partitions.pop(key)

    def _led(self) -> list[tuple[PartitionKey, Partition]]:
        with self.partitions_lock:
            return [(key, p) for key, p in self.partitions.items() if p.is_leader]

    def bytes_in_led(self) -> dict[PartitionKey, int]:
        """Bytes appended so far to each partition this broker leads."""
        return {key: p.bytes_in for key, p in self._led()}

    def logs_led(self) -> dict[PartitionKey, LogReport]:
        """The log of each partition this broker leads, as the controller is told it."""
        return {key: _log_report(p.log) for key, p in self._led()}

    def close_partitions(self) -> None:
        """Close every hosted log (queued appends are committed first: acknowledged is
        durable); the broker is stopping."""
        with self.partitions_lock:
            partitions, self.partitions = list(self.partitions.values()), {}
        for partition in partitions:
            partition.log.close()

    # ---- the logs' files ---------------------------------------------------------------------

    def refresh_logs(self, refresh: list[tuple[str, int]]) -> None:
        """Take in what the log cleaner's Spark job did to these tables (removed or rewrote old
        files): the log start offset moves up, reads skip the removed files. The controller
        says so with the next heartbeat, well within file.delete.delay.ms, so no read touches a
        file vacuum deleted."""
        for topic, p in refresh:
            with self.partitions_lock:
                partition = self.partitions.get((topic, p))
            if partition is None:
                continue
            try:
                partition.log.refresh()
            except Exception as e:  # storage trouble: reads refresh again on a miss
                log.warning("refreshing %s-%d failed: %s", topic, p, e)

    def _partition(self, topic: str, partition: int) -> Partition:
        """A hosted partition; raises Kafka's error when the topic-partition is unknown here."""
        with self.partitions_lock:
            hosted = self.partitions.get((topic, partition))
        if hosted is None:
            if self._cache.image.partition(topic, partition) is None:
                raise errors.UnknownTopicOrPartitionError(
                    f"This server does not host this topic-partition: {topic}-{partition}")
            state = self._cache.image.partition(topic, partition)
            raise errors.NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {topic}-{partition} "
                f"(leader: {state.leader if state else -1})")
        return hosted

    # ---- ISR ---------------------------------------------------------------------------------

    def isr_loop(self) -> None:
        """Kafka's isr-expiration task: every half lag period, drop lagging followers."""
        lag_max_ms = self._config.replica_lag_time_max_ms
        while not self._stopped.wait(lag_max_ms / 2000):
            with self.partitions_lock:
                partitions = list(self.partitions.values())
            for partition in partitions:
                new_isr = partition.lagging_isr(lag_max_ms)
                if new_isr is not None:
                    self._alter_isr(partition, new_isr)

    def _alter_isr(self, partition: Partition, new_isr: list[int]) -> None:
        """Ask the controller for an ISR change; the partition holds it as pending until then."""
        try:
            isr, version = self._controller.alter_partition(
                self.broker_id, self._broker_epoch(), partition.topic, partition.partition,
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
        self.metrics.isr_changed(partition.isr, isr)
        partition.isr_committed(isr, version)

    # ---- produce -----------------------------------------------------------------------------

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState, batch_bytes: int | None = None,
                timeout_ms: int | None = None, in_order: bool = False) -> Future[AppendResult]:
        """Append a batch to a partition this broker leads; the future completes when `acks`
        says (0: at once, 1: on this broker's commit, -1: when the ISR holds it)."""
        try:
            hosted = self._partition(topic, partition)
        except errors.UnknownTopicOrPartitionError:
            validate_topic_name(topic)  # INVALID_TOPIC_EXCEPTION: no topic may have the name
            raise
        leader_epoch = hosted.check_leader()
        if producer.transactional:
            self._check_in_transaction(topic, partition, producer, hosted.log)
        topic_config = self.topic_configs.get(topic) or cfg.TopicConfig()
        if acks == -1:  # nothing is appended when the ISR is already too small
            hosted.check_min_isr(topic_config.required_isr)
        timestamp_type = (LOG_APPEND_TIME if topic_config.message_timestamp_type == "LogAppendTime"
                          else CREATE_TIME)
        appended = hosted.log.append(batch, leader_epoch=leader_epoch,
                                     timestamp_type=timestamp_type, producer=producer,
                                     max_message_bytes=topic_config.max_message_bytes,
                                     batch_bytes=batch_bytes,
                                     compacted=topic_config.compacts, timeout_ms=timeout_ms,
                                     in_order=in_order,
                                     validate=self._schema_check(topic, topic_config))
        hosted.count_bytes_in(appended, batch_bytes if batch_bytes is not None else batch.nbytes)
        if acks == 0:
            return appended
        return hosted.acknowledged(appended, leader_epoch, topic_config.required_isr
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
        found = self._loaded_schema(subject, schema_id)
        if found is not None:
            return found
        try:
            versions = self._controller.schema_registry.schema_versions(schema_id, True)
        except (SchemaRegistryError, errors.DeltaBusError):
            return None  # no such id, or no controller to ask: refused as unknown
        if not any(v.subject == subject for v in versions):
            return None
        deadline = time.monotonic() + cfg.SCHEMA_METADATA_WAIT_MS / 1000
        with self._cache.image_applied:
            while (found := self._loaded_schema(subject, schema_id)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cache.image_applied.wait(left)
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
        if producer_id in self._cache.image.open_transactions.get((topic, partition), frozenset()):
            return
        log.check_producer_epoch(producer)
        deadline = time.monotonic() + cfg.TXN_VERIFY_WAIT_MS / 1000
        with self._cache.image_applied:
            while producer_id not in self._cache.image.open_transactions.get(
                    (topic, partition), frozenset()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.InvalidTxnStateError(
                        f"producer {producer_id} has no transaction open on {topic}-"
                        f"{partition}: add the partition to its transaction first")
                self._cache.image_applied.wait(left)

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
                    config = self.topic_configs.get(topic) or cfg.TopicConfig()
                    appended = hosted.log.append_marker(
                        marker.producer_id, marker.producer_epoch, committed=marker.committed,
                        coordinator_epoch=marker.coordinator_epoch, leader_epoch=leader_epoch)
                    pending[key] = hosted.acknowledged(appended, leader_epoch,
                                                       config.required_isr)
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

    # ---- fetch -------------------------------------------------------------------------------

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

        return self.fetch_purgatory.watch(DelayedFetch(
            keys={(spec.topic, spec.partition) for spec in specs}, deadline_s=deadline_s,
            has_news=lambda: any(self._has_news(spec, replica_id) for spec in specs),
            try_complete=read_again,
            on_expiration=lambda: [self._fetch_one(spec, replica_id) for spec in specs],
            on_stop=lambda: last[0]))

    def fetches_waiting(self) -> int:
        """Fetches waiting for appends or their max wait (none holds a thread)."""
        return self.fetch_purgatory.waiting()

    def _has_news(self, spec: FetchSpec, replica_id: int) -> bool:
        """Whether reading `spec` again may answer differently: records past its offset (below
        the high watermark for a consumer, in the log for a follower), or its partition gone
        or led by another broker or epoch. Called on whatever thread changed a log, perhaps
        holding another partition's lock: it reads attributes and takes no lock."""
        hosted = self.partitions.get((spec.topic, spec.partition))  # a dict read is atomic
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
                    self.alter_pool.submit(self._alter_isr, hosted, proposal)
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
            moving = replica_id >= 0 and replica_id in hosted.adding_replicas
            if moving:
                return self._fetch_moving(spec, plog, result)
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

    def _fetch_moving(self, spec: FetchSpec, plog: PartitionLog,
                      result: FetchResult) -> FetchResult:
        """A fetch of a replica a reassignment adds, under leader.replication.throttled.rate
        (replication_quota.py): nothing while the rate is exceeded (Kafka's
        shouldLeaderThrottle), else files or records within the fetch's bytes and a second
        of the rate, counted against it."""
        quota = self.leader_quota
        if quota.exceeded():
            return result
        max_bytes = quota.fetch_bytes(min(spec.max_bytes, self._config.replica_files_max_bytes))
        if self._config.replica_copy_files and not plog.cached_tail_under(
                spec.offset, self._config.replica_files_min_bytes):  # as _files_to_copy
            result.files = plog.files_from(spec.offset, max_bytes)
        if not result.files:
            result.records = plog.read(spec.offset, max_bytes - max_bytes // FETCH_READ_SLACK_SHARE,
                                       to_log_end=True)
        quota.record(_read_bytes([result]))
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

    # ---- offsets, records, log dirs, producers -----------------------------------------------

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
        if not (self.topic_configs.get(topic) or cfg.TopicConfig()).deletes:
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
        with self.partitions_lock:
            hosted = dict(self.partitions)
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


def _log_report(plog: PartitionLog) -> LogReport:
    """A led log as the controller is told it; its files as -1 where they cannot be counted
    now (storage trouble must not keep a heartbeat from going)."""
    try:
        files, size = plog.file_stats()
    except Exception:
        files, size = -1, -1
    return LogReport(plog.high_watermark, size, files)


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
