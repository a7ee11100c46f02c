"""An in-memory deltabus cluster for the clients' unit tests: no Spark, no Delta tables.

A test double of the domain, not of the transport. Each broker is a `FakeBroker`, a
`DeltaBusHandler` (deltabus/cluster/handler.py) served by the real `deltabus.rpc.server.
start_server` on loopback, so a client's whole wire path runs as it does against a real cluster:
protobuf and Arrow IPC, the servicer's decoding, encoding and fetch budget, gRPC statuses and
Kafka error codes. Behind the brokers, one `FakeLog` per partition keeps its records in an Arrow
table (LOG_SCHEMA), and the group calls go to the real `GroupCoordinator` over an in-memory
offset store (`MemoryOffsetStore`), served by broker 0.

As simple as the client tests allow:
- no replication: the leader alone holds a partition's records; its high watermark is its log
  end offset, and an append is acknowledged at once, whatever `acks` says;
- an idempotent producer's batches follow the partition log's rules: a batch waits for its
  predecessor's sequence, a retry of one of the last five batches gets its first answer again,
  an older one DUPLICATE_SEQUENCE_NUMBER; a transactional id keeps its producer id (epoch 0);
- topic names, partition counts, replication factors and configs are checked as the controller
  does, with the pure rules of `deltabus.topics` and `deltabus.config`; elections and
  reassignments are not there (UNSUPPORTED_VERSION).

Tests steer it: `inject` makes a call fail (once or more, before or after the append; an
OffsetCommit's failure is the group coordinator's answer to each partition),
`move_leader` moves a partition to another broker with a new leader epoch (or offline),
`unclean_election` also cuts the log (what an unclean leader lacks), `delete_records` moves a log
start offset as retention does, `appends_held` keeps produce requests waiting as a slow broker
would. `produce_calls` lists every append the brokers were asked for, `coordinator_lookups`
counts FindCoordinator requests; `wait_until` waits on the fake's progress (no fixed sleeps).

Thread-safe: gRPC threads call in; one condition (`_changed`) guards all state and is notified
on every change.
"""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from deltabus import config as cfg
from deltabus import errors, group_configs
from deltabus.cluster.delayed_fetch import DelayedFetch, FetchPurgatory
from deltabus.cluster.handler import (
    FetchResult,
    FetchSpec,
    LogDirDescription,
    ReplicaDescription,
    ShareFetchAnswer,
    ShareFetchRequest,
)
from deltabus.cluster.share_partition_manager import SharePartitionManager
from deltabus.log_tables.partition_log import ActiveProducer, AppendResult
from deltabus.metadata import (
    NO_LEADER,
    BrokerEndpoint,
    MetadataImage,
    NewTopic,
    PartitionState,
    ScramDescriptions,
    TopicResult,
    TopicState,
    describe_scram_credentials,
    new_topic_id,
)
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetCommit, OffsetStore
from deltabus.offsets.share_state_store import ShareStateStore
from deltabus.quotas import (
    ClientQuotaManager,
    QuotaEntity,
    QuotaFilterComponent,
    describe_client_quotas,
)
from deltabus.records import (
    LOG_SCHEMA,
    ProducerState,
    arrow_batch_rows,
    batch_size_min_bytes,
    check_batch_size,
    largest_batch_bytes,
    normalize_produce,
    produce_batch,
    to_log_batch,
)
from deltabus.rpc.authentication import CredentialLookup
from deltabus.rpc.kafka.listener import KafkaListener
from deltabus.rpc.server import start_server
from deltabus.security.acls import Authorizer
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal
from deltabus.topics import validate_topic_name

HOST = "127.0.0.1"
PRODUCER_BATCHES_REMEMBERED = 5  # as the partition log: retries of the last 5 batches answered
COORDINATOR_TICK_S = 0.05  # the group coordinator's clock: session expiry, join deadlines
EARLIEST_TIMESTAMP, LATEST_TIMESTAMP = -2, -1


@dataclass
class Fault:
    """An error the next `times` matching calls get. `after_append`: a produce is appended
    first, then answered with the error (the answer was lost, as in a timeout)."""

    op: str  # produce, fetch, list_offsets, offset_for_leader_epoch, metadata, offset_commit
    error: type[errors.DeltaBusError]
    topic: str | None = None
    partition: int | None = None
    times: int = 1
    after_append: bool = False

    def matches(self, op: str, topic: str | None, partition: int | None) -> bool:
        return (self.times > 0 and self.op == op
                and self.topic in (None, topic) and self.partition in (None, partition))


@dataclass(frozen=True)
class ProduceCall:
    """One append a broker was asked for (a retried batch shows up once per attempt)."""

    broker_id: int
    topic: str
    partition: int
    records: int
    producer: ProducerState


@dataclass
class _ProducerEntry:
    next_sequence: int = 0
    epoch: int = 0  # a newer epoch starts its sequences at 0, as the partition log's
    recent: collections.OrderedDict[int, AppendResult] = field(
        default_factory=collections.OrderedDict)


class _Changed(threading.Condition):
    """The fake's one condition; each notify_all also calls `on_notify` (lock held)."""

    def __init__(self, on_notify: Callable[[], None]) -> None:
        super().__init__()
        self._on_notify = on_notify

    def notify_all(self) -> None:
        super().notify_all()
        self._on_notify()


class FakeLog:
    """One partition's records. Offsets start at 0 and are never reused: records below the log
    start offset stay in the table but are out of range. Callers hold the cluster's lock."""

    def __init__(self) -> None:
        self.records: pa.Table = LOG_SCHEMA.empty_table()
        self.log_start_offset = 0
        self.epoch_starts: list[tuple[int, int]] = [(0, 0)]  # (leader epoch, its first offset)
        self.producers: dict[int, _ProducerEntry] = {}

    @property
    def log_end_offset(self) -> int:
        return self.records.num_rows

    def append(self, batch: pa.Table, leader_epoch: int, producer: ProducerState) -> AppendResult:
        base = self.log_end_offset
        self.records = pa.concat_tables([self.records, to_log_batch(
            batch, base_offset=base, now_ms=int(time.time() * 1000), leader_epoch=leader_epoch,
            producer=producer)]).combine_chunks()
        return AppendResult(base, base + batch.num_rows - 1, -1, self.log_start_offset)

    def read(self, offset: int) -> pa.Table:
        """Records from `offset` to the high watermark (the log end: no replication)."""
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise errors.OffsetOutOfRangeError(
                f"offset {offset} is out of range: log start offset {self.log_start_offset}, "
                f"log end offset {self.log_end_offset}")
        return self.records.slice(offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """ListOffsets: -1 latest, -2 earliest, else the first record at or after the time."""
        if timestamp_ms == LATEST_TIMESTAMP:
            return self.log_end_offset, -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return self.log_start_offset, -1
        live = self.records.slice(self.log_start_offset)
        stamps = pc.cast(live.column("timestamp"), pa.int64()).to_pylist()
        for i, micros in enumerate(stamps):
            if micros // 1000 >= timestamp_ms:
                return self.log_start_offset + i, micros // 1000
        return -1, -1

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch: the largest epoch at or below the one asked for, and
        where it ends (the next epoch's first offset, or the log end); (-1, -1) if none."""
        known = [e for e, _ in self.epoch_starts if e <= leader_epoch]
        if not known:
            return -1, -1
        later = [start for e, start in self.epoch_starts if e > known[-1]]
        return known[-1], later[0] if later else self.log_end_offset


class MemoryOffsetStore:
    """What `GroupCoordinator` needs of `OffsetStore`, in memory: a commit is durable at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}

    def offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        with self._lock:
            return dict(self._groups.get(group_id, {}))

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(g for g, offsets in self._groups.items() if offsets)

    def has_group(self, group_id: str) -> bool:
        with self._lock:
            return bool(self._groups.get(group_id))

    def group_count(self) -> int:
        with self._lock:
            return sum(1 for offsets in self._groups.values() if offsets)

    def last_commit_ms(self, group_id: str) -> int:
        with self._lock:
            return max((om.commit_timestamp_ms for om in self._groups.get(group_id, {}).values()),
                       default=0)

    def commit(self, commits: list[OffsetCommit]) -> Future[None]:
        now_ms = int(time.time() * 1000)
        with self._lock:
            for c in commits:
                offsets = self._groups.setdefault(c.group_id, {})
                if c.offset is None:
                    offsets.pop((c.topic, c.partition), None)
                else:
                    offsets[(c.topic, c.partition)] = replace(
                        c.offset, commit_timestamp_ms=c.offset.commit_timestamp_ms or now_ms)
        return _done(None)

    def delete_group(self, group_id: str) -> Future[None]:
        with self._lock:
            self._groups.pop(group_id, None)
        return _done(None)

    def close(self) -> None:
        pass


class _GroupCoordinatorWithFaults(GroupCoordinator):
    """The real group coordinator, whose OffsetCommit first takes the test's `offset_commit`
    faults (`FakeCluster.inject`): the injected error is its answer for every partition, as a
    coordinator that moved (NOT_COORDINATOR) or is loading answers."""

    def __init__(self, take_fault: Callable[[str, str | None, int | None], Fault | None],
                 *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._take_fault = take_fault

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                       offsets: dict[tuple[str, int], OffsetAndMetadata],
                       group_instance_id: str | None = None) -> Any:
        self._take_fault("offset_commit", None, None)
        return super().commit_offsets(group_id, generation_id, member_id, offsets,
                                      group_instance_id)


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class FakeCluster:
    """`brokers` in-memory brokers on loopback; `bootstrap_servers` names them all."""

    def __init__(self, brokers: int = 2, *, default_partitions: int = 1,
                 auto_create_topics: bool = True, sequence_wait_ms: int = 10_000,
                 serve: Callable[..., tuple[grpc.Server, int]] = start_server,
                 security: cfg.ListenerSecurity | None = None,
                 credentials: CredentialLookup | None = None,
                 group_config: cfg.GroupConfig | None = None,
                 share_groups: bool = False) -> None:
        """`serve` starts each broker's server, `start_server`'s way (tests/client/
        secure_server.py serves the same servicer over TLS, recording every call).
        `security` and `credentials`: the real start_server's TLS and authentication, as a real
        cluster's brokers use them (PLAINTEXT by default). `group_config`: the coordinator's
        limits (by default short session timeouts and no initial rebalance delay).
        `share_groups`: the coordinator keeps share groups' state in a real
        `__share_group_state` table (in a folder of its own, gone at `close`), and the
        brokers answer ShareFetch with real SharePartitionManagers over their logs."""
        self._config = cfg.ClusterConfig(root="", brokers=brokers, host=HOST,
                                         num_partitions=default_partitions)
        self.auto_create_topics = auto_create_topics
        # What every request is checked against (rpc.access); None: no authorizer, as a
        # cluster without one.
        self.authorizer: Authorizer | None = None
        self.quota_manager = ClientQuotaManager()  # no quotas: nobody is throttled
        # A batch waits this long for its predecessor's sequence, then OUT_OF_ORDER (the
        # partition log's sequence_wait_ms).
        self.sequence_wait_ms = sequence_wait_ms
        # Fetches long-polling through fetch_delayed (the Kafka door's): every notify of
        # `_changed` reads them again, as a broker's log change checks its fetch purgatory.
        self._fetch_purgatory = FetchPurgatory("fake-delayed-fetch", completion_threads_max=4)
        self._changed = _Changed(self._check_delayed_fetches)
        self._version = 1
        self._topics: dict[str, TopicState] = {}
        self._logs: dict[tuple[str, int], FakeLog] = {}
        self._faults: list[Fault] = []
        self._transactional_ids: dict[str, int] = {}
        self._producer_ids = itertools.count(1000)
        self._released = threading.Event()
        self._released.set()
        self._acks_held: list[tuple[Future[Any], AppendResult]] | None = None
        self.produce_calls: list[ProduceCall] = []
        self.coordinator_lookups = 0  # FindCoordinator requests, to any broker
        self.appends_waiting = 0  # produce requests held by `appends_held`
        self._fetches_blocked = 0  # fetches long-polling for records on their threads
        self._stopped = threading.Event()
        self.group_config = group_config or cfg.GroupConfig(
            group_min_session_timeout_ms=100, group_initial_rebalance_delay_ms=0)
        self._share_dir = tempfile.mkdtemp(prefix="fake-share-state-") if share_groups else None
        self.coordinator = _GroupCoordinatorWithFaults(
            self._take_fault,
            cast(OffsetStore, MemoryOffsetStore()),  # the coordinator takes it by duck typing
            self.group_config, metadata=self.image,
            share_state=(ShareStateStore(os.path.join(self._share_dir, "__share_group_state"))
                         if self._share_dir else None))
        self._servers: list[grpc.Server] = []
        self._kafka_listeners: list[KafkaListener] = []
        self.kafka_coordinator: str | None = None  # host:port, once serve_kafka opened it
        self._coordinator_door: KafkaListener | None = None
        # The brokers' forwarded coordinator requests, each holding a thread as the driver's
        # gRPC threads hold them.
        self._forwarding = ThreadPoolExecutor(max_workers=32, thread_name_prefix="forward")
        self.brokers: list[BrokerEndpoint] = []
        self._handlers: list[FakeBroker] = []
        for broker_id in range(brokers):
            secured = ({"security": security, "credentials": credentials}
                       if security is not None else {})
            self._handlers.append(FakeBroker(self, broker_id))
            server, port = serve(HOST, 0, self._handlers[-1], threads=16,
                                 groups=self.coordinator if broker_id == 0 else None, **secured)
            self._servers.append(server)
            self.brokers.append(BrokerEndpoint(broker_id, HOST, port))
        self._ticker = threading.Thread(target=self._tick_loop, name="fake-coordinator",
                                        daemon=True)
        self._ticker.start()

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for b in self.brokers)

    @property
    def fetches_waiting(self) -> int:
        """Fetches long-polling for records, on their threads or delayed."""
        return self._fetches_blocked + self._fetch_purgatory.waiting()

    def _check_delayed_fetches(self) -> None:
        """Something changed (lock held): every delayed fetch is read again, off this
        thread."""
        for key in list(self._logs):
            self._fetch_purgatory.check(key)

    def close(self) -> None:
        self._stopped.set()
        self._fetch_purgatory.stop()
        self._released.set()
        with self._changed:
            self._changed.notify_all()
        for server in self._servers:
            server.stop(None).wait(5)
        for listener in self._kafka_listeners:
            listener.stop()
        self._ticker.join(5)
        self._forwarding.shutdown(wait=False, cancel_futures=True)
        for broker in self._handlers:
            broker.close()
        self.coordinator.close()
        if self._share_dir is not None:
            shutil.rmtree(self._share_dir, ignore_errors=True)

    def serve_kafka(self, broker_id: int, *, security: cfg.ListenerSecurity | None = None,
                    credentials: CredentialLookup | None = None,
                    socket_server: cfg.SocketServerConfig | None = None) -> str:
        """Put the real Kafka door in front of broker `broker_id` (metadata then lists its
        Kafka port); returns its host:port. The first call also opens the group coordinator's
        door, on a port of its own as a real cluster's is (the controller's listener): a
        coordinator sharing a broker's address under another node id sends librdkafka 2.0 and
        KafkaJS astray (each maps one address to one node). `socket_server`: the limits of
        the broker's listener (the coordinator's keeps the defaults)."""
        secured = {"security": security or cfg.ListenerSecurity(), "credentials": credentials}
        if self.kafka_coordinator is None:
            door = KafkaListener(HOST, 0, FakeBroker(self, 0), groups=self.coordinator,
                                 **secured).start()
            self._kafka_listeners.append(door)
            self.kafka_coordinator = f"{HOST}:{door.port}"
            self._coordinator_door = door

        def forward(frame: bytes, host: str, principal: KafkaPrincipal
                    ) -> Future[tuple[bytes, int]]:
            """As a real broker forwards to the driver, without the gRPC hop between."""
            return self._forwarding.submit(self._coordinator_door.answer_forwarded, frame,
                                           principal, host, broker_id)

        listener = KafkaListener(HOST, 0, FakeBroker(self, broker_id), forward=forward,
                                 socket_server=socket_server or cfg.SocketServerConfig(),
                                 **secured).start()
        self._kafka_listeners.append(listener)
        with self._changed:
            self.brokers[broker_id] = replace(self.brokers[broker_id], kafka_port=listener.port)
            self._version += 1
            self._changed.notify_all()
        return f"{HOST}:{listener.port}"

    def _tick_loop(self) -> None:
        while not self._stopped.wait(COORDINATOR_TICK_S):
            self.coordinator.tick()

    # ---- what tests set up and look at -------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None,
                     replication_factor: int = 1) -> None:
        [result] = self.create_topics(
            [NewTopic(name, partitions, replication_factor, configs)], validate_only=False)
        if result.error is not None:
            raise result.error

    def write(self, topic: str, partition: int, values: list[bytes],
              keys: list[bytes | None] | None = None,
              timestamps_ms: list[int] | None = None) -> int:
        """Append records straight to a partition's log (no client); returns the base offset."""
        batch = normalize_produce(produce_batch(values, keys, timestamps_ms))
        with self._changed:
            state = self._state(topic, partition)
            result = self._logs[(topic, partition)].append(batch, state.leader_epoch,
                                                           ProducerState())
            self._changed.notify_all()
            return result.base_offset

    def values(self, topic: str, partition: int) -> list[bytes | None]:
        """Every value in a partition's log, in offset order (from the log start)."""
        with self._changed:
            log = self._logs[(topic, partition)]
            return log.records.slice(log.log_start_offset).column("value").to_pylist()

    def log(self, topic: str, partition: int) -> FakeLog:
        return self._logs[(topic, partition)]

    def leader(self, topic: str, partition: int) -> int:
        with self._changed:
            return self._state(topic, partition).leader

    def image(self) -> MetadataImage:
        with self._changed:
            return MetadataImage(self._version, "fake-cluster", 0, tuple(self.brokers),
                                 dict(self._topics))

    def inject(self, op: str, error: type[errors.DeltaBusError], *, topic: str | None = None,
               partition: int | None = None, times: int = 1,
               after_append: bool = False) -> Fault:
        """The next `times` calls of `op` (on that topic-partition, if given) fail with `error`.
        The returned Fault's `times` counts down as calls take it."""
        fault = Fault(op, error, topic, partition, times, after_append)
        with self._changed:
            self._faults.append(fault)
        return fault

    def move_leader(self, topic: str, partition: int, leader: int) -> None:
        """A new leader (NO_LEADER: offline), with the next leader epoch: what the controller
        does when a broker goes or comes back. The log carries on as it was."""
        with self._changed:
            state = self._state(topic, partition)
            replicas = state.replicas if leader in state.replicas or leader == NO_LEADER \
                else (leader, *state.replicas)
            self._set_partition(topic, replace(
                state, leader=leader, leader_epoch=state.leader_epoch + 1, replicas=replicas,
                isr=(leader,) if leader != NO_LEADER else ()))
            self._logs[(topic, partition)].epoch_starts.append(
                (state.leader_epoch + 1, self._logs[(topic, partition)].log_end_offset))
            self._changed.notify_all()

    def unclean_election(self, topic: str, partition: int, leader: int,
                         log_end_offset: int) -> None:
        """A leader elected from outside the ISR: its log ends at `log_end_offset`, so records
        past it (which consumers may have read) are gone."""
        with self._changed:
            log = self._logs[(topic, partition)]
            log.records = log.records.slice(0, log_end_offset)
            log.epoch_starts = [(e, s) for e, s in log.epoch_starts if s <= log_end_offset]
        self.move_leader(topic, partition, leader)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Move the log start offset up, as retention does."""
        with self._changed:
            self._logs[(topic, partition)].log_start_offset = before_offset
            self._changed.notify_all()

    @contextmanager
    def appends_held(self) -> Iterator[None]:
        """Produce requests wait inside the broker (none is appended) until the block ends."""
        self._released.clear()
        try:
            yield
        finally:
            self._released.set()

    @contextmanager
    def acks_held(self) -> Iterator[None]:
        """Produce requests are appended at once but acknowledged only when the block ends, as
        a real log acknowledges them after its next Delta commit."""
        with self._changed:
            self._acks_held = []
        try:
            yield
        finally:
            with self._changed:
                held, self._acks_held = self._acks_held or [], None
            for future, result in held:
                future.set_result(result)

    def delete_records_on(self, broker_id: int, topic: str, partition: int,
                          offset: int) -> Future[int]:
        """DeleteRecords on the leader: the log start moves up to `offset` (-1: the log end);
        the new low watermark's future is held while `acks_held`, as a real leader's waits for
        its ISR."""
        with self._changed:
            log, _ = self._led_log(broker_id, topic, partition)
            target = log.log_end_offset if offset == -1 else offset
            if not 0 <= target <= log.log_end_offset:
                raise errors.OffsetOutOfRangeError(
                    f"offset {offset} is beyond the high watermark {log.log_end_offset}")
            log.log_start_offset = max(log.log_start_offset, target)
            self._changed.notify_all()
            return self.acknowledged(log.log_start_offset)  # type: ignore[arg-type]

    def acknowledged(self, result: AppendResult) -> Future[AppendResult]:
        """`result`'s future: done, or held until `acks_held` ends."""
        with self._changed:
            if self._acks_held is None:
                return _done(result)
            future: Future[AppendResult] = Future()
            self._acks_held.append((future, result))
            return future

    def wait_until(self, condition: Callable[[], bool], what: str,
                   timeout_s: float = 10.0) -> None:
        """Wait, on the fake's own progress, until `condition` holds (AssertionError if not)."""
        with self._changed:
            if not self._changed.wait_for(condition, timeout_s):
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

    # ---- metadata and admin ------------------------------------------------------------------

    def _state(self, topic: str, partition: int) -> PartitionState:
        """Lock held."""
        state = self._topics[topic].partitions[partition] if topic in self._topics and \
            0 <= partition < len(self._topics[topic].partitions) else None
        if state is None:
            raise errors.UnknownTopicOrPartitionError(
                f"This server does not host this topic-partition: {topic}-{partition}")
        return state

    def _set_partition(self, topic: str, state: PartitionState) -> None:
        """Lock held."""
        t = self._topics[topic]
        parts = list(t.partitions)
        parts[state.partition] = state
        self._topics[topic] = replace(t, partitions=tuple(parts))
        self._version += 1

    def _placement(self, partition: int, replication_factor: int) -> PartitionState:
        n = len(self.brokers)
        replicas = tuple((partition + i) % n for i in range(replication_factor))
        return PartitionState(partition, replicas[0], 0, replicas, replicas)

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage:
        self._take_fault("metadata", None, None)
        with self._changed:
            missing = [t for t in topics if t not in self._topics]
        if missing and allow_auto_create and self.auto_create_topics:
            self.create_topics([NewTopic(t) for t in missing], validate_only=False)
        return self.image()

    def create_topics(self, topics: list[NewTopic], *, validate_only: bool) -> list[TopicResult]:
        with self._changed:
            return [self._create_topic(t, validate_only) for t in topics]

    def _create_topic(self, t: NewTopic, validate_only: bool) -> TopicResult:
        """Lock held."""
        try:
            validate_topic_name(t.name)
            if t.name in self._topics:
                raise errors.TopicAlreadyExistsError(f"Topic '{t.name}' already exists.")
            count = self._config.num_partitions if t.num_partitions == -1 else t.num_partitions
            if count < 1:
                raise errors.InvalidPartitionsError("Number of partitions must be larger than 0.")
            factor = 1 if t.replication_factor == -1 else t.replication_factor
            if not 1 <= factor <= len(self.brokers):
                raise errors.InvalidReplicationFactorError(
                    f"Replication factor: {factor} larger than available brokers: "
                    f"{len(self.brokers)}.")
            cfg.topic_config(t.configs or {})
        except errors.DeltaBusError as e:
            return TopicResult(t.name, e)
        topic_id = new_topic_id()
        if not validate_only:
            self._topics[t.name] = TopicState(
                t.name, topic_id, tuple(self._placement(p, factor) for p in range(count)),
                dict(t.configs or {}))
            for p in range(count):
                self._logs[(t.name, p)] = FakeLog()
            self._version += 1
            self._changed.notify_all()
        return TopicResult(t.name, None, topic_id, count, factor)

    def delete_topics(self, names: list[str]) -> list[TopicResult]:
        results = []
        with self._changed:
            for name in names:
                topic = self._topics.pop(name, None)
                if topic is None:
                    results.append(TopicResult(name, errors.UnknownTopicOrPartitionError(
                        f"Topic '{name}' does not exist.")))
                    continue
                for p in range(len(topic.partitions)):
                    del self._logs[(name, p)]
                self._version += 1
                results.append(TopicResult(name, None, topic.topic_id))
            self._changed.notify_all()
        return results

    def create_partitions(self, counts: dict[str, int], *,
                          validate_only: bool) -> list[TopicResult]:
        results = []
        with self._changed:
            for name, count in counts.items():
                topic = self._topics.get(name)
                if topic is None:
                    error: errors.DeltaBusError = errors.UnknownTopicOrPartitionError(
                        f"Topic '{name}' does not exist.")
                    results.append(TopicResult(name, error))
                    continue
                have = len(topic.partitions)
                if count <= have:
                    results.append(TopicResult(name, errors.InvalidPartitionsError(
                        f"Topic currently has {have} partitions, which is higher than or equal "
                        f"to the requested {count}.")))
                    continue
                if not validate_only:
                    factor = topic.replication_factor
                    added = tuple(self._placement(p, factor) for p in range(have, count))
                    self._topics[name] = replace(topic, partitions=topic.partitions + added)
                    for p in range(have, count):
                        self._logs[(name, p)] = FakeLog()
                    self._version += 1
                results.append(TopicResult(name, None, topic.topic_id, count))
            self._changed.notify_all()
        return results

    def describe_configs(self, topics: list[str]) -> cfg.ConfigResults:
        with self._changed:
            return {name: (self._config.describe_topic_config(self._topics[name].configs)
                           if name in self._topics else errors.UnknownTopicOrPartitionError(
                               f"Topic '{name}' does not exist.")) for name in topics}

    def alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                      validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        results: dict[str, errors.DeltaBusError | None] = {}
        with self._changed:
            for name, ops in changes.items():
                topic = self._topics.get(name)
                try:
                    if topic is None:
                        raise errors.UnknownTopicOrPartitionError(
                            f"Topic '{name}' does not exist.")
                    configs = cfg.altered_overrides(topic.configs, ops)
                except errors.DeltaBusError as e:
                    results[name] = e
                    continue
                if not validate_only:
                    self._topics[name] = replace(topic, configs=configs)
                    self._version += 1
                results[name] = None
        return results

    def init_producer_id(self, transactional_id: str) -> tuple[int, int]:
        """A new producer id, or for a transactional id the one it always has (epoch 0)."""
        cfg.check_transactional_id(transactional_id)  # the controller's limit
        with self._changed:
            if not transactional_id:
                return next(self._producer_ids), 0
            if transactional_id not in self._transactional_ids:
                self._transactional_ids[transactional_id] = next(self._producer_ids)
            return self._transactional_ids[transactional_id], 0

    def find_coordinator(self, group_id: str) -> BrokerEndpoint:
        """Broker 0 coordinates every group; each lookup is counted."""
        with self._changed:
            self.coordinator_lookups += 1
            return self.brokers[0]

    # ---- data: what a partition's leader answers ---------------------------------------------

    def _take_fault(self, op: str, topic: str | None, partition: int | None) -> Fault | None:
        with self._changed:
            fault = next((f for f in self._faults if f.matches(op, topic, partition)), None)
            if fault is not None:
                fault.times -= 1
                self._changed.notify_all()
                if not fault.after_append:
                    raise fault.error(f"injected by the test ({op} {topic}-{partition})")
            return fault

    def _led_log(self, broker_id: int, topic: str, partition: int,
                 current_leader_epoch: int = -1) -> tuple[FakeLog, int]:
        """Lock held. The log, and the leader epoch, of a partition `broker_id` leads."""
        state = self._state(topic, partition)
        if state.leader != broker_id:
            raise errors.NotLeaderOrFollowerError(
                f"broker {broker_id} is not the leader of {topic}-{partition} "
                f"(leader: {state.leader})")
        if 0 <= current_leader_epoch < state.leader_epoch:
            raise errors.FencedLeaderEpochError(
                f"epoch {current_leader_epoch} is older than {state.leader_epoch}")
        if current_leader_epoch > state.leader_epoch:
            raise errors.UnknownLeaderEpochError(
                f"epoch {current_leader_epoch} is newer than {state.leader_epoch}")
        return self._logs[(topic, partition)], state.leader_epoch

    def produce(self, broker_id: int, topic: str, partition: int, batch: pa.Table,
                producer: ProducerState, batch_bytes: int | None = None,
                timeout_ms: int | None = None) -> AppendResult:
        if not self._released.is_set():
            with self._changed:
                self.appends_waiting += 1
                self._changed.notify_all()
            self._released.wait()
            with self._changed:
                self.appends_waiting -= 1
        with self._changed:
            self.produce_calls.append(ProduceCall(broker_id, topic, partition, batch.num_rows,
                                                  producer))
            self._changed.notify_all()
            fault = self._take_fault("produce", topic, partition)
            log, leader_epoch = self._led_log(broker_id, topic, partition)
            result = self._earlier_answer(log, producer, batch.num_rows, timeout_ms)
            if result is None:
                if producer.producer_id >= 0:  # a refused batch uses up its sequence numbers
                    log.producers[producer.producer_id].next_sequence = \
                        producer.base_sequence + batch.num_rows
                    self._changed.notify_all()
                batch = self._checked(topic, partition, batch, batch_bytes)
                result = log.append(batch, leader_epoch, producer)
                if producer.producer_id >= 0:
                    recent = log.producers[producer.producer_id].recent
                    recent[producer.base_sequence] = result
                    while len(recent) > PRODUCER_BATCHES_REMEMBERED:
                        recent.popitem(last=False)
                self._changed.notify_all()
            if fault is not None:  # appended, but the answer is lost
                raise fault.error(f"injected by the test after the append ({topic}-{partition})")
            return result

    def _earlier_answer(self, log: FakeLog, producer: ProducerState, records: int,
                        timeout_ms: int | None) -> AppendResult | None:
        """Lock held. Wait until an idempotent producer's batch is next in its sequence (at
        most the sequence wait and the request's `timeout_ms`, as the partition log); the
        first answer when it is a retry of a batch already appended."""
        if producer.producer_id < 0:
            return None
        entry = log.producers.setdefault(producer.producer_id,
                                         _ProducerEntry(epoch=producer.producer_epoch))
        if producer.producer_epoch < entry.epoch:
            raise errors.InvalidProducerEpochError(
                f"producer {producer.producer_id} epoch {producer.producer_epoch} is older "
                f"than {entry.epoch}")
        if producer.producer_epoch > entry.epoch:
            entry = log.producers[producer.producer_id] = _ProducerEntry(
                epoch=producer.producer_epoch)
        wait_ms = min(self.sequence_wait_ms, self.sequence_wait_ms if timeout_ms is None
                      else max(0, timeout_ms))
        deadline = time.monotonic() + wait_ms / 1000
        while producer.base_sequence > entry.next_sequence:
            left = deadline - time.monotonic()
            if left <= 0 or self._stopped.is_set():
                raise errors.OutOfOrderSequenceNumberError(
                    f"sequence {producer.base_sequence} but {entry.next_sequence} is next")
            self._changed.wait(left)
        if producer.base_sequence == entry.next_sequence:
            return None
        earlier = entry.recent.get(producer.base_sequence)
        if earlier is None:
            raise errors.DuplicateSequenceNumberError(
                f"sequence {producer.base_sequence} was written long ago")
        return earlier

    def _checked(self, topic: str, partition: int, batch: pa.Table,
                 batch_bytes: int | None) -> pa.Table:
        """The batch normalised, or the partition log's refusal (the same rules, after the
        sequence step as there): max.message.bytes on each record batch."""
        limit = self._config.topic_config(self._topics[topic].configs).max_message_bytes
        where = f"{topic}-{partition}"
        batch_rows = arrow_batch_rows(batch)
        check_batch_size(batch_size_min_bytes(max(batch_rows)), limit, where, at_least=True)
        batch = normalize_produce(batch)
        check_batch_size(largest_batch_bytes(batch, batch_rows) if batch_bytes is None
                         else batch_bytes, limit, where)
        return batch

    def fetch(self, broker_id: int, specs: list[FetchSpec], max_wait_ms: int) -> list[FetchResult]:
        """Every partition's records from its fetch offset; with none anywhere, wait for an
        append (or max_wait_ms): Kafka's long poll."""
        deadline = time.monotonic() + max_wait_ms / 1000
        with self._changed:
            while True:
                results = [self._fetch_one(broker_id, spec) for spec in specs]
                if any(r.error or (r.records is not None and r.records.num_rows)
                       for r in results):
                    return results
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped.is_set():
                    return results
                self._fetches_blocked += 1
                self._changed.notify_all()
                self._changed.wait(left)
                self._fetches_blocked -= 1

    def fetch_delayed(self, broker_id: int, specs: list[FetchSpec],
                      max_wait_ms: int) -> Future[list[FetchResult]]:
        """`fetch` with no thread waiting: the fake's fetch purgatory completes it once a
        partition has records or fails, or at max_wait_ms."""
        def read() -> list[FetchResult]:
            with self._changed:
                return [self._fetch_one(broker_id, spec) for spec in specs]

        def read_if_any() -> list[FetchResult] | None:
            results = read()
            return results if any(r.error or (r.records is not None and r.records.num_rows)
                                  for r in results) else None

        answered = read_if_any()
        if answered is not None or max_wait_ms <= 0 or self._stopped.is_set():
            return _done(answered if answered is not None else read())
        delayed = self._fetch_purgatory.watch(DelayedFetch(
            keys={(s.topic, s.partition) for s in specs},
            deadline_s=time.monotonic() + max_wait_ms / 1000, has_news=lambda: True,
            try_complete=read_if_any, on_expiration=read, on_stop=read))
        with self._changed:
            self._changed.notify_all()  # wait_until sees it waiting
        return delayed

    def _fetch_one(self, broker_id: int, spec: FetchSpec) -> FetchResult:
        """Lock held."""
        result = FetchResult(spec.topic, spec.partition)
        try:
            self._take_fault("fetch", spec.topic, spec.partition)
            log, _ = self._led_log(broker_id, spec.topic, spec.partition,
                                   spec.current_leader_epoch)
            result.high_watermark = result.log_end_offset = log.log_end_offset
            result.log_start_offset = log.log_start_offset
            result.records = log.read(spec.offset)
        except errors.DeltaBusError as e:
            result.error = e
        return result

    def list_offsets(self, broker_id: int, topic: str, partition: int,
                     timestamp: int, isolation_level: int = 0) -> tuple[int, int, int]:
        self._take_fault("list_offsets", topic, partition)
        with self._changed:
            log, leader_epoch = self._led_log(broker_id, topic, partition)
            if timestamp == -1 and isolation_level == 1:  # read_committed: the LSO
                return log.last_stable_offset(), -1, leader_epoch
            offset, ts = log.offset_for_timestamp(timestamp)
            return offset, ts, leader_epoch

    def offset_for_leader_epoch(self, broker_id: int, topic: str, partition: int,
                                current_leader_epoch: int, leader_epoch: int) -> tuple[int, int]:
        self._take_fault("offset_for_leader_epoch", topic, partition)
        with self._changed:
            log, _ = self._led_log(broker_id, topic, partition, current_leader_epoch)
            return log.end_offset_for_epoch(leader_epoch)


class FakeBroker:
    """One broker of a FakeCluster: the DeltaBusHandler its gRPC server calls."""

    def __init__(self, cluster: FakeCluster, broker_id: int) -> None:
        self._cluster = cluster
        self.broker_id = broker_id
        store = cluster.coordinator.share_state
        # The real leader side of share groups, over this broker's logs (`share_groups`).
        self._shares = (SharePartitionManager(self, store, cluster.group_config)
                        if store is not None else None)

    def describe_group_configs(self, groups: list[str]) -> cfg.ConfigResults:
        """The fake keeps no group configs: each group has the brokers' defaults."""
        return {g: group_configs.describe(self._cluster.group_config, None) for g in groups}

    def alter_group_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                            validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        raise errors.UnsupportedVersionError("the fake cluster keeps no group configs")

    def share_fetch(self, request: ShareFetchRequest) -> ShareFetchAnswer:
        if self._shares is None:
            raise errors.UnsupportedVersionError("this fake cluster serves no share groups")
        return self._shares.share_fetch(request)

    def close(self) -> None:
        if self._shares is not None:
            self._shares.close()

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage:
        return self._cluster.metadata(topics, allow_auto_create)

    def authorizer(self) -> Authorizer | None:
        return self._cluster.authorizer

    def client_quota_manager(self) -> ClientQuotaManager:
        return self._cluster.quota_manager

    def describe_client_quotas(self, components: list[QuotaFilterComponent],
                               strict: bool) -> dict[QuotaEntity, dict[str, float]]:
        """The fake keeps no quotas: every filter matches nothing."""
        return describe_client_quotas({}, components, strict)

    def describe_user_scram_credentials(self, users: list[str] | None) -> ScramDescriptions:
        """The fake keeps no users: every named one is RESOURCE_NOT_FOUND."""
        return describe_scram_credentials({}, users)

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int,
                      validate_only: bool) -> list[TopicResult]:
        return self._cluster.create_topics(topics, validate_only=validate_only)

    def delete_topics(self, names: list[str], *, timeout_ms: int) -> list[TopicResult]:
        return self._cluster.delete_topics(names)

    def create_partitions(self, counts: dict[str, int], *, timeout_ms: int,
                          validate_only: bool) -> list[TopicResult]:
        return self._cluster.create_partitions(counts, validate_only=validate_only)

    def describe_configs(self, topics: list[str]) -> cfg.ConfigResults:
        return self._cluster.describe_configs(topics)

    def alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                      validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        return self._cluster.alter_configs(changes, validate_only=validate_only)

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState, batch_bytes: int | None = None,
                timeout_ms: int | None = None, in_order: bool = False) -> Future[AppendResult]:
        return self._cluster.acknowledged(self._cluster.produce(
            self.broker_id, topic, partition, batch, producer, batch_bytes, timeout_ms))

    def delete_records(self, topic: str, partition: int, offset: int) -> Future[int]:
        return self._cluster.delete_records_on(self.broker_id, topic, partition, offset)

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]:
        return self._cluster.fetch(self.broker_id, specs, max_wait_ms)

    def fetch_delayed(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
                      max_bytes: int, replica_id: int) -> Future[list[FetchResult]]:
        return self._cluster.fetch_delayed(self.broker_id, specs, max_wait_ms)

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     isolation_level: int = 0) -> tuple[int, int, int]:
        return self._cluster.list_offsets(self.broker_id, topic, partition, timestamp,
                                          isolation_level)

    def offset_for_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int,
                                leader_epoch: int) -> tuple[int, int]:
        return self._cluster.offset_for_leader_epoch(self.broker_id, topic, partition,
                                                     current_leader_epoch, leader_epoch)

    def init_producer_id(self, transactional_id: str = "",
                         principal: KafkaPrincipal = ANONYMOUS) -> tuple[int, int]:
        return self._cluster.init_producer_id(transactional_id)

    def describe_log_dirs(self, partitions: list[tuple[str, int]] | None
                          ) -> list[LogDirDescription]:
        """One log dir holding every partition (the fake has one replica each), sized by the
        bytes of its records in memory."""
        hosted = sorted(self._cluster._logs) if partitions is None else sorted(
            {k for k in partitions if k in self._cluster._logs})
        return [LogDirDescription("memory", [ReplicaDescription(
            t, p, self._cluster.log(t, p).records.nbytes, 0) for t, p in hosted])]

    def describe_producers(self, topic: str, partition: int) -> list[ActiveProducer]:
        return [ActiveProducer(pid, 0, entry.next_sequence - 1, -1)
                for pid, entry in sorted(self._cluster.log(topic, partition).producers.items())]

    def producer_id_issued_to(self, producer_id: int, principal: KafkaPrincipal) -> bool:
        """The fake does not bind producer ids to principals: any may use any."""
        return True

    def elect_leaders(self, election_type: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        raise errors.UnsupportedVersionError("the fake cluster holds no elections")

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int] | None]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        raise errors.UnsupportedVersionError("the fake cluster reassigns nothing")

    def reassignment_image(self, topics: list[str]) -> MetadataImage:
        return self._cluster.image()

    def find_coordinator(self, group_id: str) -> BrokerEndpoint:
        return self._cluster.find_coordinator(group_id)
