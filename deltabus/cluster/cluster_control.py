"""Brokers' lives as the controller sees them: registration, heartbeats (long polls), fencing,
session checks, controlled shutdown, and waiting for brokers to apply a metadata version (KRaft's
ClusterControlManager with its BrokerHeartbeatManager). Runs in the driver, inside the
controller.

Brokers are not in the metadata log: they register at every start (a new broker epoch each
time), and one that misses heartbeats for `broker_session_timeout_ms` (or whose Spark task
ended) is fenced, as KRaft does: it leaves every ISR it is in (unless it is the last member),
and partitions it led elect a new leader from the ISR, in replica order. A partition with no
live ISR member goes offline (leader -1) until one registers again, unless the topic allows
unclean leader election.

Separate from `broker_registry`, which holds what is replayed (the registry), the handlers that
turn a registration, heartbeat, fence or controlled shutdown into records, and the contact
bookkeeping; this is the part that takes the controller's lock, commits through the controller
and waits. It cannot live there: a broker change commits with the elections it brings
(`replication_control`), which imports the registry.

Invariants: a broker change is committed with the leader and ISR changes it brings, in one
commit; a heartbeat's long poll ends when the broker's position is behind the controller's
version, its registration changes, its tables changed, or the controller shuts down.

Thread-safe: every public method takes the controller's lock (a Condition, which also wakes the
long polls and those waiting for brokers), never `_tables_lock`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from deltabus import config as cfg
from deltabus.cluster import broker_registry, replication_control
from deltabus.cluster.broker_registry import BrokerHeartbeatManager
from deltabus.cluster.metadata_records import (
    CommitRecords,
    FenceBrokerRecord,
    MetadataRecord,
    OfflineReplicasRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.metadata import BrokerEndpoint, LogReport, MetadataBatch, MetadataPosition

log = logging.getLogger(__name__)


class ClusterControlManager:
    """Registers, hears from, fences and stops brokers for the controller. Thread-safe."""

    def __init__(self, config: cfg.ClusterConfig, lock: threading.Condition,
                 state: MetadataState, commit: CommitRecords, *,
                 version: Callable[[], int], shutting_down: Callable[[], bool],
                 read_deltas: Callable[[MetadataPosition], MetadataBatch | None],
                 on_fence: Callable[[int, BrokerEndpoint], None] | None = None) -> None:
        """`lock`, `state`, `commit`: the controller's (`commit` is called with `lock` held);
        `version`: its current metadata version; `read_deltas`: what a broker at a position is
        sent (the controller's `MetadataDeltas`); `on_fence`: told of each broker fenced, and
        where its fenced registration said it listens (a fence deletes the registration,
        while the process may still run there), outside the lock."""
        self._config = config
        self._lock = lock
        self._state = state
        self._commit = commit
        self._version = version
        self._shutting_down = shutting_down
        self._read_deltas = read_deltas
        self._on_fence = on_fence
        self._heartbeats = BrokerHeartbeatManager()
        # Times each broker was fenced (missed heartbeats, its task ended): a healthy cluster's
        # stay 0 (bench step (p) counts them while partitions are created by the thousand).
        self.fenced: collections.Counter[int] = collections.Counter()
        self._held: set[int] = set()  # brokers kept down: their registrations are refused
        # The brokers of this cluster (Cluster.scale changes them): others may not register.
        self._members: set[int] = set(range(config.brokers))
        # Bytes in per second of each partition, as its leader last reported it.
        self._loads: dict[tuple[str, int], float] = {}
        # Each partition's high watermark as its leader last said it (consumer lag).
        self._log_reports: dict[tuple[str, int], LogReport] = {}
        # partitions whose tables the log cleaner changed, per broker to tell
        self._refresh_logs: dict[int, set[tuple[str, int]]] = {}

    def _commit_broker_change(self, records: Sequence[MetadataRecord],
                              leaving: int | None = None) -> None:
        """Commit broker registration records with the leader and ISR changes they bring.
        Lock held."""
        self._commit(replication_control.elect_after_broker_change(
            self._state, self._config, records, leaving))

    def register_broker(self, endpoint: BrokerEndpoint, pid: int) -> int:
        """A broker (re)starts: give it a new epoch, unfence it, and let it lead what it may."""
        with self._lock:
            result = broker_registry.register_broker(
                self._state.brokers, endpoint, pid, members=self._members,
                held=self._held, version=self._version())
            if any(isinstance(r, FenceBrokerRecord) for r in result.records):
                # The old incarnation is fenced now: its partitions get new leader epochs.
                self._commit_broker_change(result.records, leaving=endpoint.broker_id)
            else:  # a new registration is fenced: it changes no partition until it catches up
                self._commit(result.records)
            self._heartbeats.register(endpoint.broker_id, time.monotonic())
            epoch = result.response
            log.info("broker %d registered at %s (epoch %d, pid %d)",
                     endpoint.broker_id, endpoint.address, epoch, pid)
            return epoch

    def tables_changed(self, partitions: list[tuple[str, int, tuple[int, ...]]]) -> None:
        """The log cleaner changed these partitions' replica tables ((topic, partition,
        replicas)): each replica's broker hears of it with its next heartbeat, the replicas the
        cleaner's task was made for and the partition's replicas now. A diskless partition's
        leader elected while the run went on opened the table before the cleaner's commits:
        unless told, it would read files that vacuum deletes file.delete.delay.ms later."""
        with self._lock:
            for topic, partition, replicas in partitions:
                registration = self._state.topics.get(topic)
                now = registration.partitions.get(partition) if registration else None
                for broker_id in {*replicas, *(now.replicas if now else ())}:
                    self._refresh_logs.setdefault(broker_id, set()).add((topic, partition))
            self._lock.notify_all()

    def heartbeat(self, broker_id: int, epoch: int, applied_version: int, max_wait_ms: int,
                  offline_replicas: Collection[tuple[str, int]] = (), *,
                  position: MetadataPosition | None = None,
                  partition_loads: Mapping[tuple[str, int], float] | None = None,
                  log_reports: Mapping[tuple[str, int], LogReport] | None = None
                  ) -> tuple[bool, MetadataBatch | None, list[tuple[str, int]]]:
        """Record a heartbeat, then wait (long poll) until there are metadata records past the
        broker's `position` (by default: the end of `applied_version`, the version of the image
        it serves) or its tables changed. `offline_replicas`: the (topic, partition) replicas
        the broker cannot serve (their tables are lost); they leave their ISRs and leadership.
        `partition_loads`: bytes in per second of partitions it leads (the balancer's);
        `log_reports`: the logs of partitions it leads that moved (consumer lag's, the
        console's).
        Returns (should_shut_down, the records to replay or None (`metadata_deltas`), the
        partitions whose tables to refresh)."""
        if position is None:
            position = MetadataPosition(applied_version)
        deadline = time.monotonic() + min(max_wait_ms, cfg.FETCH_WAIT_MS_MAX) / 1000
        self._heartbeats.touch_current(self._state.brokers, broker_id, epoch, time.monotonic())
        with self._lock:
            result = broker_registry.heartbeat(self._state.brokers, broker_id, epoch,
                                               applied_version, frozenset(offline_replicas))
            self._heartbeats.touch(broker_id, time.monotonic())
            self._loads.update(partition_loads or {})
            self._log_reports.update(log_reports or {})
            if self._heartbeats.set_applied_version(broker_id, applied_version):
                self._lock.notify_all()
            if result.records:  # caught up (it may lead again), or its offline replicas changed
                self._log_broker_change(broker_id, applied_version, result.records)
                self._commit_broker_change(result.records)
            while (position == MetadataPosition(self._version()) and not self._shutting_down()
                   and self._may_wait(broker_id, epoch)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            reg = self._state.brokers.check_epoch(broker_id, epoch)
            self._heartbeats.touch(broker_id, time.monotonic())
            # A broker in controlled shutdown stops once it has applied the metadata that moved
            # its leadership away.
            stop = self._shutting_down() or (reg.in_controlled_shutdown
                                             and applied_version >= self._version())
            refresh = sorted(self._refresh_logs.pop(broker_id, set()))
            return stop, self._read_deltas(position), refresh

    def _log_broker_change(self, broker_id: int, applied_version: int,
                           records: Sequence[MetadataRecord]) -> None:
        for record in records:
            if isinstance(record, OfflineReplicasRecord) and record.replicas:
                log.error("broker %d cannot serve its replicas of %s (their tables are lost): "
                          "they leave their ISRs and are not elected", broker_id,
                          ", ".join(f"{t}-{p}" for t, p in sorted(record.replicas)))
            elif isinstance(record, OfflineReplicasRecord):
                log.info("broker %d serves all its replicas again", broker_id)
            else:
                log.info("broker %d unfenced at metadata version %d", broker_id,
                         applied_version)

    def _may_wait(self, broker_id: int, epoch: int) -> bool:
        """A heartbeat keeps polling while its registration is current, not in controlled
        shutdown, and none of its tables changed. Lock held."""
        reg = self._state.brokers.get(broker_id)
        return (reg is not None and reg.epoch == epoch and not reg.in_controlled_shutdown
                and not self._refresh_logs.get(broker_id))

    def log_reports(self) -> dict[tuple[str, int], LogReport]:
        """Each partition's high watermark, as its leader last reported it
        (offsets.report.interval.ms)."""
        with self._lock:
            return dict(self._log_reports)

    def loads(self) -> dict[tuple[str, int], float]:
        """Bytes in per second of each partition, as its leader last reported it."""
        with self._lock:
            return dict(self._loads)

    def members(self) -> list[int]:
        """The brokers of this cluster, live or not, in id order."""
        with self._lock:
            return sorted(self._members)

    def set_members(self, broker_ids: Collection[int]) -> None:
        """The brokers of this cluster after a scale: a broker left out may not register
        again (stop it first: a running one is not stopped here)."""
        with self._lock:
            self._members = set(broker_ids)
            self._lock.notify_all()

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
            records = broker_registry.shut_down_broker(self._state.brokers, broker_id)
            if not records:
                return False
            log.info("broker %d: controlled shutdown", broker_id)
            self._commit_broker_change(records, leaving=broker_id)
            return True

    def registered_endpoint(self, broker_id: int) -> BrokerEndpoint | None:
        """Where a broker's current registration says it listens (None: not registered)."""
        with self._lock:
            registration = self._state.brokers.get(broker_id)
            return registration.endpoint if registration is not None else None

    def fence_broker(self, broker_id: int, reason: str,
                     silent_for_s: float | None = None) -> bool:
        """Declare a broker dead: move leadership off it. Its next registration unfences it.
        `silent_for_s`: only if it is still silent that long once the lock is held (a
        heartbeat that waited for the lock may have arrived). Returns whether it was fenced."""
        with self._lock:
            if silent_for_s is not None and broker_id not in self._heartbeats.expired(
                    self._state.brokers, time.monotonic(), silent_for_s):
                return False
            records = broker_registry.fence_broker(self._state.brokers, broker_id)
            if not records:
                return False
            endpoint = self._state.brokers.registrations[broker_id].endpoint
            log.warning("broker %d fenced: %s", broker_id, reason)
            self._commit_broker_change(records, leaving=broker_id)
            self.fenced[broker_id] += 1
        if self._on_fence is not None:
            self._on_fence(broker_id, endpoint)
        return True

    def check_sessions(self) -> list[int]:
        """Fence brokers silent past the session timeout; returns the ids of those fenced. Each
        is fenced on its own: one whose fence fails (the metadata write was refused) is logged
        and tried again at the next check, and holds up none of the others."""
        now = time.monotonic()
        timeout_s = self._config.broker_session_timeout_ms / 1000
        with self._lock:
            expired = self._heartbeats.expired(self._state.brokers, now, timeout_s)
        fenced = []
        for broker_id in expired:
            try:
                if not self.fence_broker(broker_id, "missed heartbeats past "
                                         "broker.session.timeout.ms", silent_for_s=timeout_s):
                    continue
            except Exception:
                log.exception("fencing silent broker %d failed; trying again at the next "
                              "session check", broker_id)
                continue
            fenced.append(broker_id)
        return fenced

    def broker_pids(self) -> dict[int, int]:
        with self._lock:
            brokers = self._state.brokers
            return {b: brokers.registrations[b].pid for b in brokers.live_broker_ids()}

    def broker_epochs(self) -> dict[int, int]:
        """The registration epoch of each live broker: a relaunched broker has a higher one."""
        with self._lock:
            brokers = self._state.brokers
            return {b: brokers.registrations[b].epoch for b in brokers.live_broker_ids()}

    def live_brokers(self) -> list[int]:
        with self._lock:
            return self._state.brokers.live_broker_ids()

    def applied_version(self, broker_id: int) -> int:
        """The metadata version broker `broker_id` last said it has applied (its heartbeat):
        what it answers requests with, which may lag the controller's image."""
        with self._lock:
            return self._heartbeats.applied_version(broker_id)

    def wait_for_brokers(self, count: int, timeout_s: float) -> bool:
        """Wait until `count` brokers are registered and unfenced."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while len(self._state.brokers.live_broker_ids()) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def await_brokers(self, version: int, timeout_ms: int) -> None:
        """Wait until every live broker has applied `version` (so a new topic can be produced to
        at once), or the timeout passes (clients then retry on LEADER_NOT_AVAILABLE)."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            while True:
                behind = [b for b in self._state.brokers.live_broker_ids()
                          if self._heartbeats.applied_version(b) < version]
                left = deadline - time.monotonic()
                if not behind or left <= 0 or self._shutting_down():
                    return
                self._lock.wait(left)
