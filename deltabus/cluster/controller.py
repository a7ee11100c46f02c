"""The controller: the one place cluster metadata is decided. Runs in the Spark driver.

Thread-safe: every public method takes `_lock` (a Condition that also wakes heartbeat long polls).

Handlers validate a request and turn it into metadata records; records are written to the metadata
log first and only then replayed into `MetadataState`, so what brokers and clients see is always
durable. Brokers are not in the log: they register at every start (a new broker epoch each time),
and one that misses heartbeats for `broker_session_timeout_ms` (or whose Spark task ended) is
fenced, as KRaft does: it leaves every ISR it is in (unless it is the last member), and partitions
it led elect a new leader from the ISR, in replica order. A partition with no live ISR member goes
offline (leader -1) until one registers again, unless the topic allows unclean leader election.

Invariants: a leader is always in the ISR; the ISR is never empty; a leader change bumps the
leader epoch; only the current leader may change the ISR (AlterPartition), and only from the ISR
the controller holds (a stale request gets INVALID_UPDATE_VERSION).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.catch_up import CatchUpTask
from deltabus.cluster.handler import FetchResult, FetchSpec
from deltabus.cluster.log_cleaner import CleanerTask
from deltabus.cluster.metadata_log import MetadataLog
from deltabus.log_tables.layout import metadata_path, replica_path, topic_path
from deltabus.log_tables.partition_log import AppendResult
from deltabus.metadata import (
    NO_LEADER,
    BrokerEndpoint,
    MetadataImage,
    MetadataState,
    NewTopic,
    PartitionState,
    TopicResult,
    new_cluster_id,
    new_topic_id,
)
from deltabus.records import ProducerState
from deltabus.topics import INTERNAL_TOPICS, validate_topic_name

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000  # producer ids reserved per metadata record


@dataclass
class _Registration:
    endpoint: BrokerEndpoint
    epoch: int
    pid: int
    last_heartbeat: float
    registered_version: int
    applied_version: int = 0
    # A new registration stays fenced (not in metadata, leads nothing) until the broker has caught
    # up with the metadata of its registration, as KRaft brokers do; `dead` marks a fenced one.
    fenced: bool = True
    dead: bool = False
    # Controlled shutdown: leadership moves off it, then its heartbeat tells it to stop.
    shutting_down: bool = False


class Controller:
    """Owns the metadata log, the broker registry and leader election."""

    def __init__(self, config: cfg.ClusterConfig,
                 on_fence: Callable[[int], None] | None = None,
                 catch_up: Callable[[list[CatchUpTask], str], object] | None = None) -> None:
        self._config = config
        self._on_fence = on_fence
        self._catch_up = catch_up  # runs the catch-up Spark job (given by Cluster)
        self._lock = threading.Condition()
        self._version = 1
        self._image: MetadataImage | None = None
        self._shutting_down = False
        self._brokers: dict[int, _Registration] = {}
        self._held: set[int] = set()  # brokers kept down: their registrations are refused
        # partitions whose tables the log cleaner changed, per broker to tell
        self._refresh_logs: dict[int, set[tuple[str, int]]] = {}
        self._next_broker_epoch = int(time.time() * 1000)
        self._log = MetadataLog(metadata_path(config.root))
        self._state = MetadataState()
        for record in self._log.read_all():
            self._state.replay(record)
        self._next_producer_id = self._state.producer_ids_end  # skip a block used before
        if not self._state.cluster_id:
            with self._lock:
                self._commit([{"type": "cluster", "cluster_id": new_cluster_id()}])

    # ---- metadata ----------------------------------------------------------------------------

    def _commit(self, records: list[dict]) -> None:
        """Write records durably, then apply them. Caller holds the lock (or is __init__)."""
        self._log.append(records)
        for record in records:
            self._state.replay(record)
        self._changed()

    def _changed(self) -> None:
        self._version += 1
        self._image = None
        self._lock.notify_all()

    def image(self) -> MetadataImage:
        """The current metadata snapshot (live brokers only, as Kafka lists them)."""
        with self._lock:
            if self._image is None or self._image.version != self._version:
                brokers = tuple(sorted(
                    (r.endpoint for r in self._brokers.values() if not r.fenced),
                    key=lambda b: b.broker_id))
                self._image = MetadataImage(self._version, self._state.cluster_id, -1, brokers,
                                            self._state.topic_states(), self._config.root)
            return self._image

    def _live_broker_ids(self) -> list[int]:
        return sorted(b for b, r in self._brokers.items() if not r.fenced)

    def _leader_candidates(self) -> set[int]:
        """Brokers that may lead or join an ISR: live and not shutting down."""
        return {b for b, r in self._brokers.items() if not r.fenced and not r.shutting_down}

    # ---- topics ------------------------------------------------------------------------------

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int = 30_000,
                      validate_only: bool = False) -> list[TopicResult]:
        """Create topics; each gets its own result, as in Kafka's CreateTopics."""
        results = []
        names = [t.name for t in topics]
        with self._lock:
            for topic in topics:
                try:
                    if names.count(topic.name) > 1:
                        raise errors.InvalidRequestError(
                            "Create topics request from client has multiple entries for "
                            f"{topic.name}")
                    records = self._plan_topic(topic)
                    if not validate_only:
                        self._delete_dir(topic_path(self._config.root, topic.name))
                        self._commit(records)
                    parts = [r for r in records if r["type"] == "partition"]
                    results.append(TopicResult(topic.name, None, records[0]["topic_id"],
                                               len(parts), len(parts[0]["replicas"])))
                except errors.DeltaBusError as e:
                    results.append(TopicResult(topic.name, e))
            target = self._version
        if not validate_only:
            self._await_brokers(target, timeout_ms)
        return results

    def _plan_topic(self, topic: NewTopic) -> list[dict]:
        validate_topic_name(topic.name)
        if topic.name in self._state.topics:
            raise errors.TopicAlreadyExistsError(f"Topic '{topic.name}' already exists.")
        configs = dict(topic.configs or {})
        cfg.topic_config(configs)  # raises InvalidConfigError
        if topic.replica_assignment:
            assignment = self._check_assignment(topic)
        else:
            assignment = self._assign(topic)
        topic_id = new_topic_id()
        records: list[dict] = [{"type": "topic", "name": topic.name, "topic_id": topic_id}]
        for p, replicas in enumerate(assignment):
            records.append({"type": "partition", "topic": topic.name, "partition": p,
                            "replicas": replicas, "isr": replicas, "leader": replicas[0],
                            "leader_epoch": 0})
        for key, value in sorted(configs.items()):
            records.append({"type": "config", "topic": topic.name, "key": key, "value": value})
        return records

    def _check_assignment(self, topic: NewTopic) -> list[list[int]]:
        """An explicit replica assignment, checked as Kafka checks it."""
        assignment = topic.replica_assignment or {}
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise errors.InvalidRequestError(
                "Both numPartitions or replicationFactor and replicasAssignments were set. "
                "Both cannot be used at the same time.")
        if sorted(assignment) != list(range(len(assignment))):
            raise errors.InvalidReplicaAssignmentError(
                f"Partitions should be a consecutive 0-based integer sequence: "
                f"{sorted(assignment)}")
        if len(assignment) > cfg.PARTITIONS_MAX:
            raise errors.InvalidPartitionsError(
                f"Number of partitions {len(assignment)} is more than the limit "
                f"{cfg.PARTITIONS_MAX}.")
        live = set(self._live_broker_ids())
        sizes = {len(replicas) for replicas in assignment.values()}
        for p, replicas in sorted(assignment.items()):
            if not replicas or len(set(replicas)) != len(replicas):
                raise errors.InvalidReplicaAssignmentError(
                    f"Partition {p} has an empty or duplicated replica list {replicas}.")
            unknown = [b for b in replicas if b not in live]
            if unknown:
                raise errors.InvalidReplicaAssignmentError(
                    f"Partition {p} names brokers {unknown} that are not live.")
        if len(sizes) > 1:
            raise errors.InvalidReplicaAssignmentError(
                "All partitions should have the same number of replicas.")
        return [list(assignment[p]) for p in range(len(assignment))]

    def _assign(self, topic: NewTopic) -> list[list[int]]:
        partitions = (self._config.num_partitions if topic.num_partitions == -1
                      else topic.num_partitions)
        if partitions < 1:
            raise errors.InvalidPartitionsError("Number of partitions must be larger than 0.")
        if partitions > cfg.PARTITIONS_MAX:
            raise errors.InvalidPartitionsError(
                f"Number of partitions {partitions} is more than the limit {cfg.PARTITIONS_MAX}.")
        rf = (self._config.default_replication_factor if topic.replication_factor == -1
              else topic.replication_factor)
        if rf < 1:
            raise errors.InvalidReplicationFactorError(
                "Replication factor must be larger than 0.")
        live = self._live_broker_ids()
        if rf > len(live):
            raise errors.InvalidReplicationFactorError(
                f"Replication factor: {rf} larger than available brokers: {len(live)}.")
        racks = {b: self._brokers[b].endpoint.rack for b in live}
        return assign_replicas(live, partitions, rf, racks)

    def create_partitions(self, counts: dict[str, int], *, timeout_ms: int = 30_000,
                          validate_only: bool = False) -> list[TopicResult]:
        """Add partitions to topics (Kafka's CreatePartitions): `counts` maps a topic to its
        new total. New partitions get replicas as a new topic would, with the topic's
        replication factor; keyed records may map to other partitions from now on."""
        results = []
        with self._lock:
            for name, count in counts.items():
                try:
                    records = self._plan_partitions(name, count)
                    if not validate_only:
                        self._commit(records)
                    results.append(TopicResult(name, None, "", count,
                                               len(records[0]["replicas"])))
                except errors.DeltaBusError as e:
                    results.append(TopicResult(name, e))
            target = self._version
        if not validate_only:
            self._await_brokers(target, timeout_ms)
        return results

    def _plan_partitions(self, name: str, count: int) -> list[dict]:
        """Lock held."""
        topic = self._state.topics.get(name)
        if topic is None:
            raise errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist.")
        current = len(topic["partitions"])
        if count <= current:
            raise errors.InvalidPartitionsError(
                f"Topic currently has {current} partitions, which is "
                f"{'higher than' if count < current else 'equal to'} the requested {count}.")
        if count > cfg.PARTITIONS_MAX:
            raise errors.InvalidPartitionsError(
                f"Number of partitions {count} is more than the limit {cfg.PARTITIONS_MAX}.")
        rf = len(topic["partitions"][0]["replicas"])
        live = self._live_broker_ids()
        if rf > len(live):
            raise errors.InvalidReplicationFactorError(
                f"Replication factor: {rf} larger than available brokers: {len(live)}.")
        racks = {b: self._brokers[b].endpoint.rack for b in live}
        assignment = assign_replicas(live, count, rf, racks)
        return [{"type": "partition", "topic": name, "partition": p, "replicas": replicas,
                 "isr": replicas, "leader": replicas[0], "leader_epoch": 0}
                for p, replicas in enumerate(assignment) if p >= current]

    def describe_configs(self, topics: list[str]
                         ) -> dict[str, list[cfg.ConfigEntry] | errors.DeltaBusError]:
        """Every config of each topic, with its value and source (Kafka's DescribeConfigs)."""
        results: dict[str, list[cfg.ConfigEntry] | errors.DeltaBusError] = {}
        with self._lock:
            for name in topics:
                topic = self._state.topics.get(name)
                results[name] = (
                    self._config.describe_topic_config(topic["configs"]) if topic is not None
                    else errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist."))
        return results

    def alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                      validate_only: bool = False, timeout_ms: int = 30_000
                      ) -> dict[str, errors.DeltaBusError | None]:
        """Kafka's IncrementalAlterConfigs for topics: each topic's changes are checked as a
        whole and committed as config records (or refused, changing nothing). Returns once the
        brokers applied them, so the next produce sees the new values."""
        results: dict[str, errors.DeltaBusError | None] = {}
        with self._lock:
            for name, ops in changes.items():
                topic = self._state.topics.get(name)
                try:
                    if topic is None:
                        raise errors.UnknownTopicOrPartitionError(
                            f"Topic '{name}' does not exist.")
                    old = topic["configs"]
                    new = cfg.altered_overrides(old, ops, self._config.topic_defaults())
                    records = [{"type": "config", "topic": name, "key": key,
                                "value": new.get(key)}
                               for key in sorted(set(old) | set(new))
                               if old.get(key) != new.get(key)]
                    if records and not validate_only:
                        self._commit(records)
                        log.info("topic %s configs changed: %s", name,
                                 ", ".join(f"{r['key']}={r['value']}" for r in records))
                    results[name] = None
                except errors.DeltaBusError as e:
                    results[name] = e
            target = self._version
        if not validate_only:
            self._await_brokers(target, timeout_ms)
        return results

    def delete_topics(self, names: list[str], *, timeout_ms: int = 30_000) -> list[TopicResult]:
        """Delete topics: remove them from metadata, let brokers close them, drop their tables."""
        results = []
        deleted = []
        with self._lock:
            for name in names:
                if name not in self._state.topics:
                    results.append(TopicResult(name, errors.UnknownTopicOrPartitionError(
                        f"Topic '{name}' does not exist.")))
                    continue
                if name in INTERNAL_TOPICS:
                    results.append(TopicResult(name, errors.InvalidTopicError(
                        f"Topic '{name}' is internal and cannot be deleted.")))
                    continue
                topic_id = self._state.topics[name]["topic_id"]
                self._commit([{"type": "remove_topic", "name": name, "topic_id": topic_id}])
                deleted.append(name)
                results.append(TopicResult(name, None, topic_id))
            target = self._version
        if deleted:
            self._await_brokers(target, timeout_ms)
            for name in deleted:
                with self._lock:
                    if name not in self._state.topics:  # not re-created meanwhile
                        self._delete_dir(topic_path(self._config.root, name))
        return results

    def _delete_dir(self, path: str) -> None:
        filesystem, location = pafs.FileSystem.from_uri(path)
        if filesystem.get_file_info(location).type != pafs.FileType.NotFound:
            filesystem.delete_dir(location)

    def _await_brokers(self, version: int, timeout_ms: int) -> None:
        """Wait until every live broker has applied `version` (so a new topic can be produced to
        at once), or the timeout passes (clients then retry on LEADER_NOT_AVAILABLE)."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            while True:
                behind = [b for b, r in self._brokers.items()
                          if not r.fenced and r.applied_version < version]
                left = deadline - time.monotonic()
                if not behind or left <= 0 or self._shutting_down:
                    return
                self._lock.wait(left)

    # ---- producer ids ------------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str = "") -> tuple[int, int]:
        """A new producer id (epoch 0), or for a transactional id the one it always has. Ids are
        reserved in blocks in the metadata log, so a restarted controller never hands out an id
        twice."""
        with self._lock:
            if transactional_id:
                known = self._state.transactional_ids.get(transactional_id)
                if known is not None:
                    return known, 0
                producer_id, _ = self._new_producer_id()
                record = {"type": "transactional_id", "id": transactional_id,
                          "producer_id": producer_id}
                self._log.append([record])  # not cluster metadata brokers need: no new version
                self._state.replay(record)
                return producer_id, 0
            return self._new_producer_id()

    def _new_producer_id(self) -> tuple[int, int]:
        """Lock held."""
        if self._next_producer_id >= self._state.producer_ids_end:
            start = max(self._next_producer_id, self._state.producer_ids_end)
            self._log.append([{"type": "producer_ids", "end": start + PRODUCER_ID_BLOCK}])
            self._state.replay({"type": "producer_ids", "end": start + PRODUCER_ID_BLOCK})
            self._next_producer_id = start
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id, 0

    # ---- brokers -----------------------------------------------------------------------------

    def register_broker(self, endpoint: BrokerEndpoint, pid: int) -> int:
        """A broker (re)starts: give it a new epoch, unfence it, and let it lead what it may."""
        with self._lock:
            if not 0 <= endpoint.broker_id < self._config.brokers:
                raise errors.InvalidRequestError(
                    f"broker id {endpoint.broker_id} is not in this cluster of "
                    f"{self._config.brokers} brokers")
            if endpoint.broker_id in self._held:
                raise errors.BrokerNotAvailableError(
                    f"broker {endpoint.broker_id} is held down until it is started again")
            old = self._brokers.get(endpoint.broker_id)
            if old is not None and not old.dead:
                # A new incarnation (Spark retried the task elsewhere) before the old one was
                # fenced: fence it now, so its partitions get new leader epochs.
                old.fenced = old.dead = True
                self._elect_leaders(leaving=endpoint.broker_id)
            self._next_broker_epoch += 1
            epoch = self._next_broker_epoch
            self._brokers[endpoint.broker_id] = _Registration(
                endpoint, epoch, pid, time.monotonic(), self._version)
            self._changed()
            log.info("broker %d registered at %s (epoch %d, pid %d)",
                     endpoint.broker_id, endpoint.address, epoch, pid)
            return epoch

    def tables_changed(self, partitions: list[tuple[str, int, tuple[int, ...]]]) -> None:
        """The log cleaner changed these partitions' replica tables ((topic, partition,
        replicas)): each replica's broker hears of it with its next heartbeat."""
        with self._lock:
            for topic, partition, replicas in partitions:
                for broker_id in replicas:
                    self._refresh_logs.setdefault(broker_id, set()).add((topic, partition))
            self._lock.notify_all()

    def heartbeat(self, broker_id: int, epoch: int, applied_version: int,
                  max_wait_ms: int) -> tuple[bool, MetadataImage | None, list[tuple[str, int]]]:
        """Record a heartbeat, then wait (long poll) until the metadata moves past what the broker
        applied or its tables changed. Returns (should_shut_down, the new image or None, the
        partitions whose tables to refresh)."""
        deadline = time.monotonic() + min(max_wait_ms, cfg.FETCH_WAIT_MS_MAX) / 1000
        with self._lock:
            reg = self._check_epoch(broker_id, epoch)
            reg.last_heartbeat = time.monotonic()
            if reg.applied_version != applied_version:
                reg.applied_version = applied_version
                self._lock.notify_all()
            if reg.fenced and applied_version >= reg.registered_version:
                reg.fenced = False  # caught up: it may lead again
                log.info("broker %d unfenced at metadata version %d", broker_id, applied_version)
                self._elect_leaders()
                self._changed()
            while (self._version <= applied_version and not self._shutting_down
                   and not reg.dead and not reg.shutting_down
                   and not self._refresh_logs.get(broker_id)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            reg = self._check_epoch(broker_id, epoch)
            reg.last_heartbeat = time.monotonic()
            # A broker in controlled shutdown stops once it has applied the metadata that moved
            # its leadership away.
            stop = self._shutting_down or (reg.shutting_down and applied_version >= self._version)
            refresh = sorted(self._refresh_logs.pop(broker_id, set()))
        image = self.image()
        return stop, (image if image.version > applied_version else None), refresh

    def hold_broker(self, broker_id: int) -> None:
        """Keep a broker down: its registrations are refused until `release_broker`."""
        with self._lock:
            self._held.add(broker_id)

    def release_broker(self, broker_id: int) -> None:
        with self._lock:
            self._held.discard(broker_id)

    def shut_down_broker(self, broker_id: int) -> bool:
        """Controlled shutdown: move leadership off a broker and take it out of every ISR
        (where another replica is in sync), then tell it to stop through its heartbeat.
        Returns False when the broker is not running."""
        with self._lock:
            reg = self._brokers.get(broker_id)
            if reg is None or reg.fenced:
                return False
            reg.shutting_down = True
            log.info("broker %d: controlled shutdown", broker_id)
            self._elect_leaders(leaving=broker_id)
            self._changed()
            return True

    def _check_epoch(self, broker_id: int, epoch: int) -> _Registration:
        reg = self._brokers.get(broker_id)
        if reg is None or reg.epoch != epoch or reg.dead:
            raise errors.StaleBrokerEpochError(
                f"broker {broker_id} epoch {epoch} is not the registered one")
        return reg

    def fence_broker(self, broker_id: int, reason: str) -> None:
        """Declare a broker dead: move leadership off it. Its next registration unfences it."""
        with self._lock:
            reg = self._brokers.get(broker_id)
            if reg is None or reg.dead:
                return
            reg.fenced = reg.dead = True
            log.warning("broker %d fenced: %s", broker_id, reason)
            self._elect_leaders(leaving=broker_id)
            self._changed()
        if self._on_fence is not None:
            self._on_fence(broker_id)

    def cleaner_tasks(self, topics: list[str] | None = None,
                      merge_min_age_ms: int | None = None) -> list[CleanerTask]:
        """What the log cleaner's job works on: every partition with a leader (of `topics`,
        when given), with its topic's retention limits (none unless cleanup.policy includes
        delete), compaction settings (none unless it includes compact) and merge settings
        (`merge_min_age_ms` overrides the cluster's)."""
        min_age = (self._config.log_cleaner_merge_min_age_ms if merge_min_age_ms is None
                   else merge_min_age_ms)
        with self._lock:
            tasks = []
            for name, topic in sorted(self._state.topics.items()):
                if topics is not None and name not in topics:
                    continue
                config = self._config.topic_config(topic["configs"])
                for partition, s in sorted(topic["partitions"].items()):
                    if s["leader"] >= 0:
                        tasks.append(CleanerTask(
                            self._config.root, name, partition, s["leader"],
                            tuple(s["replicas"]), tuple(s["isr"]),
                            config.retention_ms if config.deletes else -1,
                            config.retention_bytes if config.deletes else -1,
                            config.file_delete_delay_ms, config.segment_bytes, min_age,
                            config.compacts, config.min_compaction_lag_ms,
                            config.delete_retention_ms, config.min_cleanable_dirty_ratio))
            return tasks

    def catch_up_tasks(self, broker_id: int) -> list[CatchUpTask]:
        """What the catch-up job copies before broker `broker_id` is relaunched: each replica it
        follows, from the partition's live leader."""
        with self._lock:
            live = {b for b, r in self._brokers.items() if not r.dead}
            return [CatchUpTask(self._config.root, topic, partition, s["leader"], broker_id)
                    for topic, t in sorted(self._state.topics.items())
                    for partition, s in sorted(t["partitions"].items())
                    if broker_id in s["replicas"] and s["leader"] in live - {broker_id}]

    def check_sessions(self) -> list[int]:
        """Fence brokers silent past the session timeout; returns their ids."""
        now = time.monotonic()
        timeout_s = self._config.broker_session_timeout_ms / 1000
        with self._lock:
            expired = [b for b, r in self._brokers.items()
                       if not r.dead and now - r.last_heartbeat > timeout_s]
        for broker_id in expired:
            self.fence_broker(broker_id, "missed heartbeats past broker.session.timeout.ms")
        return expired

    def _elect_leaders(self, leaving: int | None = None) -> None:
        """Take a `leaving` broker (fenced, or in controlled shutdown) out of every ISR it is in
        (but the last member), and give every partition without an eligible leader one: the
        first live in-sync replica in replica order, or, where the topic allows unclean
        election, the first live replica at all. A broker in controlled shutdown keeps what no
        other in-sync replica can take, until it stops.
        Caller holds the lock. Leader changes are metadata records, so epochs survive restarts."""
        live = self._leader_candidates()
        records = []
        for name, topic in self._state.topics.items():
            unclean = self._config.topic_config(topic["configs"]).unclean_leader_election_enable
            for p, s in topic["partitions"].items():
                isr = list(s["isr"])
                if leaving in isr and len(isr) > 1:
                    isr.remove(leaving)
                leader = s["leader"]
                if leader not in live:
                    stopping = self._brokers.get(leader)
                    alive = stopping is not None and not stopping.fenced
                    # Never elect an out-of-sync replica while the leader still runs.
                    leader, isr = _elect(s["replicas"], isr, live, unclean and not alive)
                    if leader == NO_LEADER and alive and s["leader"] in isr:
                        leader = s["leader"]  # controlled shutdown: no one else can lead yet
                change: dict = {}
                if isr != s["isr"]:
                    change["isr"] = isr
                if leader != s["leader"]:
                    change.update(leader=leader, leader_epoch=s["leader_epoch"] + 1)
                    if leader != NO_LEADER and leader not in s["isr"]:
                        log.warning("unclean leader election: %s-%d led by out-of-sync "
                                    "replica %d; records only the old ISR held are lost",
                                    name, p, leader)
                if change:
                    records.append({"type": "partition_change", "topic": name, "partition": p,
                                    **change})
        if records:
            self._log.append(records)
            for record in records:
                self._state.replay(record)

    # ---- elections on request ----------------------------------------------------------------

    def elect_leaders(self, election_type: str = "preferred",
                      partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Kafka's ElectLeaders. "preferred": give each partition its first replica as leader
        where that replica is live and in sync. "unclean": give a partition without a leader any
        live replica. `partitions` None means all; returns an error or None per partition."""
        if election_type not in ("preferred", "unclean"):
            raise errors.InvalidRequestError(
                f"election type must be preferred or unclean, not {election_type!r}")
        with self._lock:
            live = self._leader_candidates()
            if partitions is None:
                partitions = [(t, p) for t, topic in sorted(self._state.topics.items())
                              for p in sorted(topic["partitions"])]
            results: dict[tuple[str, int], errors.DeltaBusError | None] = {}
            records = []
            for topic, partition in partitions:
                s = self._state.topics.get(topic, {}).get("partitions", {}).get(partition)
                if s is None:
                    results[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                        f"The partition {topic}-{partition} does not exist.")
                    continue
                current = s["replicas"][0] if election_type == "preferred" else s["leader"]
                if s["leader"] == current and current in live:
                    results[(topic, partition)] = errors.ElectionNotNeededError(
                        "Leader election not needed for topic partition")
                    continue
                leader, isr = _choose_leader(election_type, s, live)
                if leader == NO_LEADER or leader == s["leader"]:
                    results[(topic, partition)] = errors.PreferredLeaderNotAvailableError(
                        f"Failed to elect leader for partition {topic}-{partition} under "
                        f"strategy {election_type}")
                else:
                    records.append({"type": "partition_change", "topic": topic,
                                    "partition": partition, "leader": leader, "isr": isr,
                                    "leader_epoch": s["leader_epoch"] + 1})
                    results[(topic, partition)] = None
            if records:
                log.info("%s leader election moved %d partitions", election_type, len(records))
                self._commit(records)
            return results

    def rebalance_leaders(self) -> int:
        """auto.leader.rebalance.enable: hand leadership back to preferred replicas that are
        live and in sync (after a restart or failover moved it). Returns how many moved."""
        results = self.elect_leaders("preferred")
        return sum(1 for error in results.values() if error is None)

    # ---- reassignments -----------------------------------------------------------------------

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int]]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Kafka's AlterPartitionReassignments: give partitions new replica lists. Returns once
        each is checked and started; a thread then catches the new replicas up (Spark job),
        adds them, waits for them to join the ISR, and drops the replicas no longer wanted."""
        results: dict[tuple[str, int], errors.DeltaBusError | None] = {}
        started: list[tuple[str, int, list[int]]] = []
        with self._lock:
            live = self._leader_candidates()
            for (topic, partition), replicas in targets.items():
                s = self._state.topics.get(topic, {}).get("partitions", {}).get(partition)
                try:
                    _check_reassignment(topic, partition, s, replicas, live)
                except errors.DeltaBusError as e:
                    results[(topic, partition)] = e
                    continue
                assert s is not None
                results[(topic, partition)] = None
                if list(replicas) != s["replicas"]:
                    started.append((topic, partition, list(replicas)))
        if started:
            threading.Thread(target=self._reassign, args=(started,), daemon=True,
                             name="deltabus-reassignment").start()
        return results

    def _reassign(self, started: list[tuple[str, int, list[int]]]) -> None:
        tasks = []
        with self._lock:
            for topic, partition, replicas in started:
                s = self._state.topics[topic]["partitions"][partition]
                for r in replicas:
                    if r not in s["replicas"] and s["leader"] != NO_LEADER:
                        tasks.append(CatchUpTask(self._config.root, topic, partition,
                                                 s["leader"], r))
        if tasks and self._catch_up is not None:
            try:  # the fetchers copy whatever the job did not
                self._catch_up(tasks, "reassignment")
            except Exception:
                log.exception("catch-up job for a reassignment failed")
        with self._lock:
            records = []
            for topic, partition, replicas in started:
                s = self._state.topics.get(topic, {}).get("partitions", {}).get(partition)
                if s is None:
                    continue
                adding = [r for r in replicas if r not in s["replicas"]]
                removing = [r for r in s["replicas"] if r not in replicas]
                records.append({"type": "partition_change", "topic": topic,
                                "partition": partition, "replicas": replicas + removing,
                                "adding": adding, "removing": removing})
            if records:
                self._commit(records)
        pending = {(t, p) for t, p, _ in started}
        while pending and not self._shutting_down:
            with self._lock:
                for key in sorted(pending):
                    if self._complete_reassignment(*key):
                        pending.discard(key)
                if pending:
                    self._lock.wait(1.0)

    def _complete_reassignment(self, topic: str, partition: int) -> bool:
        """Lock held. Once every added replica is in sync, make the target list the replicas;
        a leader that is not in it hands over. Returns True when done (or moot)."""
        s = self._state.topics.get(topic, {}).get("partitions", {}).get(partition)
        if s is None or not (s.get("adding") or s.get("removing")):
            return True
        if any(r not in s["isr"] for r in s.get("adding", [])):
            return False
        removing = s.get("removing", [])
        replicas = [r for r in s["replicas"] if r not in removing]
        isr = [r for r in replicas if r in s["isr"]]
        change = {"type": "partition_change", "topic": topic, "partition": partition,
                  "replicas": replicas, "isr": isr, "adding": [], "removing": []}
        if s["leader"] not in replicas:
            live = self._leader_candidates()
            leader = next((r for r in replicas if r in isr and r in live), NO_LEADER)
            change.update(leader=leader, leader_epoch=s["leader_epoch"] + 1)
        self._commit([change])
        log.info("reassignment of %s-%d completed: replicas %s", topic, partition, replicas)
        for r in removing:  # the dropped replicas' tables go, as Kafka deletes their logs
            threading.Thread(target=self._drop_replica, args=(topic, partition, r),
                             daemon=True).start()
        return True

    def _drop_replica(self, topic: str, partition: int, broker: int) -> None:
        with self._lock:
            target = self._version
        self._await_brokers(target, 30_000)  # the broker closed the log first
        with self._lock:
            s = self._state.topics.get(topic, {}).get("partitions", {}).get(partition)
            if s is not None and broker in s["replicas"]:
                return  # re-added meanwhile
        self._delete_dir(replica_path(self._config.root, topic, partition, broker))

    # ---- ISR changes -------------------------------------------------------------------------

    def alter_partition(self, broker_id: int, broker_epoch: int, topic: str, partition: int,
                        leader_epoch: int, isr: list[int],
                        new_isr: list[int]) -> tuple[PartitionState, int]:
        """A leader shrinks or grows its partition's ISR (Kafka's AlterPartition). Returns the
        committed partition state and the metadata version that holds it."""
        with self._lock:
            self._check_epoch(broker_id, broker_epoch)
            s = self._state.topics.get(topic, {}).get("partitions", {}).get(partition)
            if s is None:
                raise errors.UnknownTopicOrPartitionError(
                    f"This server does not host this topic-partition: {topic}-{partition}")
            if s["leader"] != broker_id:
                raise errors.NotLeaderOrFollowerError(
                    f"broker {broker_id} does not lead {topic}-{partition} (leader: "
                    f"{s['leader']})")
            if leader_epoch != s["leader_epoch"]:
                raise errors.FencedLeaderEpochError(
                    f"leader epoch {leader_epoch} of {topic}-{partition} is not the current "
                    f"{s['leader_epoch']}")
            if sorted(isr) != sorted(s["isr"]):
                raise errors.InvalidUpdateVersionError(
                    f"the ISR of {topic}-{partition} is {s['isr']}, not {isr}")
            if broker_id not in new_isr or any(r not in s["replicas"] for r in new_isr):
                raise errors.InvalidRequestError(
                    f"ISR {new_isr} must hold the leader and only replicas of {topic}-"
                    f"{partition} ({s['replicas']})")
            live = self._leader_candidates()
            added = [r for r in new_isr if r not in s["isr"]]
            if any(r not in live for r in added):
                raise errors.IneligibleReplicaError(
                    f"replicas {added} cannot join the ISR of {topic}-{partition}: not all live")
            ordered = [r for r in s["replicas"] if r in new_isr]
            if ordered != s["isr"]:
                log.info("%s-%d ISR %s -> %s", topic, partition, s["isr"], ordered)
                self._commit([{"type": "partition_change", "topic": topic,
                               "partition": partition, "isr": ordered}])
            return _partition_state(partition, s), self._version

    def broker_pids(self) -> dict[int, int]:
        with self._lock:
            return {b: r.pid for b, r in self._brokers.items() if not r.fenced}

    def live_brokers(self) -> list[int]:
        with self._lock:
            return self._live_broker_ids()

    def wait_for_brokers(self, count: int, timeout_s: float) -> bool:
        """Wait until `count` brokers are registered and unfenced."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while len(self._live_broker_ids()) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def begin_shutdown(self) -> None:
        """Tell every broker, through its heartbeat, to flush and stop."""
        with self._lock:
            self._shutting_down = True
            self._lock.notify_all()

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down


def _elect(replicas: list[int], isr: list[int], live: set[int],
           unclean: bool) -> tuple[int, list[int]]:
    """(leader, ISR) for a partition whose leader is gone."""
    for r in replicas:
        if r in isr and r in live:
            return r, isr
    if unclean:
        for r in replicas:
            if r in live:
                return r, [r]
    return NO_LEADER, isr


def _check_reassignment(topic: str, partition: int, s: dict | None, replicas: list[int],
                        live: set[int]) -> None:
    if s is None:
        raise errors.UnknownTopicOrPartitionError(
            f"The partition {topic}-{partition} does not exist.")
    if not replicas or len(set(replicas)) != len(replicas):
        raise errors.InvalidReplicaAssignmentError(
            f"The proposed assignment {replicas} for {topic}-{partition} is empty or contains "
            "duplicates.")
    new = [r for r in replicas if r not in s["replicas"]]
    if any(r not in live for r in new):
        raise errors.InvalidReplicaAssignmentError(
            f"The proposed assignment for {topic}-{partition} contains brokers that are not "
            f"live: {[r for r in new if r not in live]}")
    if s.get("adding") or s.get("removing"):
        raise errors.InvalidRequestError(
            f"A reassignment of {topic}-{partition} is already in progress.")


def _choose_leader(election_type: str, s: dict, live: set[int]) -> tuple[int, list[int]]:
    """(leader, ISR) an ElectLeaders request would give a partition (NO_LEADER: none)."""
    if election_type == "preferred":
        preferred = s["replicas"][0]
        if preferred in live and preferred in s["isr"]:
            return preferred, s["isr"]
        return NO_LEADER, s["isr"]
    return _elect(s["replicas"], s["isr"], live, unclean=True)


def _partition_state(partition: int, s: dict) -> PartitionState:
    return PartitionState(partition, s["leader"], s["leader_epoch"], tuple(s["replicas"]),
                          tuple(s["isr"]))


def assign_replicas(brokers: list[int], partitions: int, rf: int,
                    racks: dict[int, str] | None = None) -> list[list[int]]:
    """Kafka's replica assignment: leaders round-robin from a random start, followers shifted so
    that replicas spread evenly. With brokers on more than one rack (executor host), brokers are
    ordered alternating racks and each partition's replicas take distinct racks first, so losing
    one host never takes every replica of a partition."""
    racks = racks or {}
    if len(set(racks.get(b, "") for b in brokers)) > 1:
        brokers = _rack_alternating(brokers, racks)
    n = len(brokers)
    start = random.randrange(n)
    shift = random.randrange(n)
    out = []
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        candidates = [brokers[(first + 1 + (shift + j) % (n - 1)) % n] for j in range(n - 1)]
        replicas = [brokers[first]]
        used = {racks.get(brokers[first], "")}
        for broker in candidates:  # other racks first, then whatever is left
            if len(replicas) < rf and racks.get(broker, "") not in used:
                replicas.append(broker)
                used.add(racks.get(broker, ""))
        for broker in candidates:
            if len(replicas) < rf and broker not in replicas:
                replicas.append(broker)
        out.append(replicas)
    return out


def _rack_alternating(brokers: list[int], racks: dict[int, str]) -> list[int]:
    """Brokers ordered rack by rack in turn: [a1, b1, c1, a2, b2, ...] (as Kafka orders them)."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers):
        by_rack.setdefault(racks.get(b, ""), []).append(b)
    queues = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    while len(out) < len(brokers):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


class ControllerHandler:
    """The controller's DeltaBus door: metadata and admin; it leads no partitions, so data calls
    get NOT_LEADER_OR_FOLLOWER and the client asks the leader named in Metadata."""

    def __init__(self, controller: Controller, auto_create_topics: bool = True) -> None:
        self._controller = controller
        self._auto_create = auto_create_topics
        self.endpoint: BrokerEndpoint | None = None  # set once the server is bound

    def find_coordinator(self, group_id: str) -> BrokerEndpoint:
        """Groups are coordinated here, beside the controller."""
        if self.endpoint is None:
            raise errors.CoordinatorNotAvailableError("the group coordinator is starting")
        return self.endpoint

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage:
        image = self._controller.image()
        missing = [t for t in topics if t not in image.topics]
        if missing and allow_auto_create and self._auto_create:
            self._controller.create_topics([NewTopic(t) for t in missing], timeout_ms=10_000)
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

    def _not_leader(self, topic: str, partition: int) -> errors.DeltaBusError:
        if self._controller.image().partition(topic, partition) is None:
            return errors.UnknownTopicOrPartitionError(
                f"This server does not host this topic-partition: {topic}-{partition}")
        return errors.NotLeaderOrFollowerError(
            f"the controller leads no partitions: send {topic}-{partition} to its leader")

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState) -> Future[AppendResult]:
        raise self._not_leader(topic, partition)

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]:
        return [FetchResult(s.topic, s.partition, self._not_leader(s.topic, s.partition))
                for s in specs]

    def list_offsets(self, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
        raise self._not_leader(topic, partition)

    def offset_for_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int,
                                leader_epoch: int) -> tuple[int, int]:
        raise self._not_leader(topic, partition)

    def init_producer_id(self, transactional_id: str = "") -> tuple[int, int]:
        return self._controller.init_producer_id(transactional_id)

    def elect_leaders(self, election_type: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._controller.elect_leaders(election_type, partitions)

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int]]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return self._controller.reassign_partitions(targets)
