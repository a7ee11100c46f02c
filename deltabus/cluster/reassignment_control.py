"""Changes of partitions' replicas and leaders an admin asks for: leader elections on request
(Kafka's ElectLeaders, and auto.leader.rebalance.enable's preferred elections) and partition
reassignments (Kafka's AlterPartitionReassignments), with the thread that carries a reassignment
out. Runs in the driver, inside the controller.

A reassignment is answered as started once checked; a thread then creates the new replicas'
tables (`topic_tables`), copies their records (the catch-up Spark job, `catch_up`), commits the
start (the new replicas are added), waits for them to join the ISR, completes it (the target list
becomes the replicas, a leader not in it hands over) and drops the replicas no longer wanted,
whose tables go once brokers closed them, as Kafka deletes their logs. The decisions are
`replication_control`'s handlers; this is the part that waits, retries and runs threads, which
is why it is apart from them.

Invariants: a reassignment cancelled before its start is committed never starts, and the tables
made for it go; a dropped replica's table goes only when the replica is not assigned again and
no reassignment starting may assign it (checked under `tables_lock` and the controller's lock).
A commit that fails is tried again each second until the controller shuts down.

Thread-safe: every public method takes the controller's lock; `tables_lock` is taken before it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import balancer, replication_control
from deltabus.cluster.catch_up import REASSIGNMENT, CatchUpTask
from deltabus.cluster.metadata_records import CommitRecords, PartitionChangeRecord
from deltabus.cluster.metadata_state import MetadataState
from deltabus.cluster.topic_tables import TopicTables
from deltabus.log_tables.layout import replica_path

log = logging.getLogger(__name__)


class ReassignmentControlManager:
    """Runs elections on request and partition reassignments for the controller. Thread-safe."""

    def __init__(self, config: cfg.ClusterConfig, lock: threading.Condition,
                 tables_lock: threading.Lock, state: MetadataState, commit: CommitRecords, *,
                 version: Callable[[], int], shutting_down: Callable[[], bool],
                 await_brokers: Callable[[int, int], None], topic_tables: TopicTables,
                 catch_up: Callable[[list[CatchUpTask], str], object] | None = None) -> None:
        """`lock`, `tables_lock`, `state`, `commit`: the controller's; `version`: its current
        metadata version; `await_brokers(version, timeout_ms)`: returns once the live brokers
        applied `version`, so a dropped replica's log is closed before its table goes;
        `catch_up`: runs the catch-up Spark job (given by Cluster; None: the fetchers copy)."""
        self._config = config
        self._lock = lock
        self._tables_lock = tables_lock
        self._state = state
        self._commit = commit
        self._version = version
        self._shutting_down = shutting_down
        self._await_brokers = await_brokers
        self._topic_tables = topic_tables
        self._catch_up = catch_up
        # Reassignments answered as started whose start is not committed yet (their new
        # replicas are being copied), and those of them cancelled meanwhile.
        self._starting: set[tuple[str, int]] = set()
        self._cancelled: set[tuple[str, int]] = set()
        # Partitions a balance moves: their preferred leaders are elected once they complete.
        self._balancing: set[tuple[str, int]] = set()

    def elect_leaders(self, election_type: str = "preferred",
                      partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Kafka's ElectLeaders. "preferred": give each partition its first replica as leader
        where that replica is live and in sync. "unclean": give a partition without a leader any
        live replica. `partitions` None means all; returns an error or None per partition."""
        with self._lock:
            result = replication_control.elect_leaders(self._state, election_type, partitions)
            if result.records:
                log.info("%s leader election moved %d partitions", election_type,
                         len(result.records))
                self._commit(result.records)
            return result.response

    def rebalance_leaders(self) -> int:
        """auto.leader.rebalance.enable: hand leadership back to preferred replicas that are
        live and in sync (after a restart or failover moved it). Returns how many moved."""
        results = self.elect_leaders("preferred")
        return sum(1 for error in results.values() if error is None)

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int] | None]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Kafka's AlterPartitionReassignments: give partitions new replica lists, or cancel
        (None) the reassignment in progress. Returns once each is checked and started (a
        cancel: done); a thread then catches the new replicas up (Spark job), adds them, waits
        for them to join the ISR, and drops the replicas no longer wanted."""
        moves = {k: r for k, r in targets.items() if r is not None}
        results = self._cancel_reassignments([k for k, r in targets.items() if r is None])
        with self._lock:
            result = replication_control.reassign_partitions(self._state, moves)
            moved, started = result.response
            if result.records:  # diskless partitions: moved now, in metadata only
                self._commit(result.records)
                self._balancing.difference_update((r.topic, r.partition) for r in result.records
                                                  if isinstance(r, PartitionChangeRecord))
            self._starting.update((t, p) for t, p, _ in started)
        results.update(moved)
        if started:
            threading.Thread(target=self._reassign, args=(started,), daemon=True,
                             name="deltabus-reassignment").start()
        return results

    def balance(self, brokers: Collection[int], *, execute: bool = False,
                bytes_in_per_s: Mapping[tuple[str, int], float] | None = None
                ) -> balancer.BalancePlan:
        """Plan (and with `execute`, start) the moves that spread every partition over
        `brokers` (the cluster's brokers less any leaving), by the balancer's goals. Partitions
        being reassigned are left as they are. Each moved partition's preferred leader is
        elected once its move completes, so leaders spread too. Raises BrokerNotAvailableError
        while one of `brokers` is down (its replicas would be moved away for nothing)."""
        with self._lock:
            live = self._state.brokers.leader_candidates()
            down = sorted(set(brokers) - live)
            if down:
                raise errors.BrokerNotAvailableError(
                    f"brokers {down} are not up: a balance waits until every broker is")
            assignment = {(t, p): list(s.replicas)
                          for t, topic in self._state.topics.items()
                          for p, s in topic.partitions.items()
                          if not (s.adding_replicas or s.removing_replicas)
                          and (t, p) not in self._starting}
            racks = self._state.brokers.racks(sorted(brokers))
        plan = balancer.plan(assignment, racks, bytes_in_per_s)
        if execute and plan.moves:
            with self._lock:
                self._balancing.update(plan.moves)
            results = self.reassign_partitions(dict(plan.moves))
            for (t, p), error in sorted(results.items()):
                if error is not None:
                    log.warning("balance: %s-%d not moved: %s", t, p, error)
            log.info("balance started: %d partitions to move (%d replicas to copy) over "
                     "brokers %s", len(plan.moves), plan.copies,
                     sorted(brokers))
        return plan

    def starting(self) -> set[tuple[str, int]]:
        """Reassignments answered as started whose start is not committed yet."""
        with self._lock:
            return set(self._starting)

    def _cancel_reassignments(self, keys: list[tuple[str, int]]
                              ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Cancel each reassignment: one still copying before it starts never starts
        (`_start_reassignments` skips it); a started one goes back to its old replicas, and the
        added replicas' tables go."""
        results: dict[tuple[str, int], errors.DeltaBusError | None] = {}
        with self._lock:
            for key in keys:
                results[key] = None
                if key in self._starting:
                    self._starting.discard(key)
                    self._cancelled.add(key)
                    continue
                try:
                    result = replication_control.cancel_reassignment(self._state, *key)
                except errors.DeltaBusError as e:
                    results[key] = e
                    continue
                self._commit(result.records)
                log.info("reassignment of %s-%d cancelled: replicas %s dropped", *key,
                         list(result.response))
                for r in result.response:
                    threading.Thread(target=self._drop_replica, args=(*key, r),
                                     daemon=True).start()
        return results

    def _reassign(self, started: list[replication_control.Reassignment]) -> None:
        with self._lock:
            tasks = replication_control.reassignment_catch_up_tasks(
                self._state, self._config.storage, started)
            adding = replication_control.added_replicas(self._state, started)
        try:  # before anything copies into them or a broker opens them
            with self._tables_lock:
                self._topic_tables.create_replica_tables(adding)
        except Exception:  # the new replicas stay offline: the reassignment cannot complete
            log.exception("creating the tables of replicas %s for a reassignment failed",
                          adding)
        if tasks and self._catch_up is not None:
            try:  # the fetchers copy whatever the job did not
                self._catch_up(tasks, REASSIGNMENT)
            except Exception:
                log.exception("catch-up job for a reassignment failed")
        if self._start_reassignments(started):
            self._complete_reassignments({(t, p) for t, p, _ in started})

    def _start_reassignments(self, started: list[replication_control.Reassignment]) -> bool:
        """Commit the reassignments' start, trying again each second while the write fails
        (they were answered as started): False when the controller stops first."""
        while not self._shutting_down():
            with self._lock:
                try:
                    kept = [r for r in started if (r[0], r[1]) not in self._cancelled]
                    if kept:
                        self._commit(replication_control.start_reassignments(self._state, kept))
                    self._drop_cancelled([r for r in started if r not in kept])
                    self._starting -= {(t, p) for t, p, _ in kept}
                    return True
                except Exception:
                    log.exception("starting the reassignment of %s failed; trying again",
                                  ", ".join(f"{t}-{p}" for t, p, _ in started))
                self._lock.wait(1.0)
        return False

    def _drop_cancelled(self, cancelled: list[replication_control.Reassignment]) -> None:
        """Lock held. Reassignments cancelled before they started: the tables made for their
        new replicas go, and they are no longer starting."""
        self._cancelled -= {(t, p) for t, p, _ in cancelled}
        for t, p, r in replication_control.added_replicas(self._state, cancelled):
            threading.Thread(target=self._drop_replica, args=(t, p, r), daemon=True).start()

    def _complete_reassignments(self, pending: set[tuple[str, int]]) -> None:
        """Complete each reassignment once its new replicas are in sync; one whose write
        fails is tried again a second later, with the others."""
        while pending and not self._shutting_down():
            with self._lock:
                for key in sorted(pending):
                    try:
                        if self._complete_reassignment(*key):
                            pending.discard(key)
                    except Exception:
                        log.exception("completing the reassignment of %s-%d failed; trying "
                                      "again", *key)
                if pending:
                    self._lock.wait(1.0)

    def _complete_reassignment(self, topic: str, partition: int) -> bool:
        """Lock held. Once every added replica is in sync, make the target list the replicas;
        a leader that is not in it hands over. Returns True when done (or moot)."""
        result = replication_control.complete_reassignment(self._state, topic, partition)
        removed = result.response
        if removed is None:
            return False
        if result.records:
            self._commit(result.records)
            s = self._state.partition(topic, partition)
            log.info("reassignment of %s-%d completed: replicas %s", topic, partition,
                     list(s.replicas) if s is not None else [])
        if (topic, partition) in self._balancing:
            self._balancing.discard((topic, partition))
            election = replication_control.elect_leaders(self._state, "preferred",
                                                         [(topic, partition)])
            if election.records:
                self._commit(election.records)
        for r in removed:  # the dropped replicas' tables go, as Kafka deletes their logs
            threading.Thread(target=self._drop_replica, args=(topic, partition, r),
                             daemon=True).start()
        return True

    def _drop_replica(self, topic: str, partition: int, broker: int) -> None:
        with self._lock:
            target = self._version()
        self._await_brokers(target, 30_000)  # the broker closed the log first
        # Under `_tables_lock`, as a deleted topic's directory is removed: a removal walking
        # the topic's directory fails on a replica's directory removed under it.
        with self._tables_lock, self._lock:
            s = self._state.partition(topic, partition)
            if (s is not None and broker in s.replicas) or (topic, partition) in self._starting:
                return  # re-added meanwhile, or a reassignment starting may re-add it
            self._topic_tables.delete_dir(
                replica_path(self._config.root, topic, partition, broker))

