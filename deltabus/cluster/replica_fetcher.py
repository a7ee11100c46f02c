"""Followers copy their leaders' logs: one fetcher thread per leader broker, inside the follower's
broker task (Kafka's ReplicaFetcherThread). Runs on executors.

Each round sends one fetch (`RemoteLeaderEndpoint.fetch`) for every partition followed from that
leader, at the follower's log end offset with the epoch of its last record; the leader answers
with records up to its log end offset, its high watermark, or where the two logs diverge. Records
are appended as copies (same offsets, one Delta commit per partition per round), a divergence is
truncated, and only once those commits are durable does the next fetch report the new log end
offset, so the leader's high watermark never counts a record a follower could still lose.

Thread-safe: the broker adds and removes partitions from its metadata thread.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import FetchResult, FetchSpec
from deltabus.cluster.partition import Partition
from deltabus.cluster.replication_quota import ReplicationQuota
from deltabus.log_tables.partition_log import AppendResult, LogFile
from deltabus.rpc.leader_endpoint import RemoteLeaderEndpoint

log = logging.getLogger(__name__)

COPY_TIMEOUT_S = 120.0  # a follower's Delta commit that takes longer is treated as failed


@dataclass
class _Followed:
    partition: Partition
    leader_epoch: int
    retry_at: float = 0.0  # after an error: not fetched before this time
    last_error: str = ""  # the error of its last failed copy, said once at INFO


class ReplicaFetcher:
    """Copies the partitions this broker follows from one leader broker."""

    def __init__(self, broker_id: int, leader_id: int, leaders: RemoteLeaderEndpoint,
                 config: cfg.ClusterConfig, quota: ReplicationQuota | None = None) -> None:
        """`quota`: the broker's follower.replication.throttled.rate, shared by its fetchers."""
        self.broker_id = broker_id
        self.leader_id = leader_id
        self._leaders = leaders
        self._config = config
        self._quota = quota or ReplicationQuota(config.follower_replication_throttled_rate)
        self._lock = threading.Condition()
        # Held while a round's answers are copied: `unfollow` waits on it, so a copy in flight
        # lands before the broker takes the partition over, never after it leads.
        self._round_lock = threading.Lock()
        self._followed: dict[tuple[str, int], _Followed] = {}
        self._address = ""
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"replica-fetcher-{leader_id}")
        self._thread.start()

    def set_address(self, address: str) -> None:
        with self._lock:
            self._address = address
            self._lock.notify_all()

    def follow(self, partition: Partition, leader_epoch: int) -> None:
        key = (partition.topic, partition.partition)
        with self._lock:
            current = self._followed.get(key)
            if current is None or current.leader_epoch != leader_epoch:
                self._followed[key] = _Followed(partition, leader_epoch)
                self._lock.notify_all()

    def unfollow(self, key: tuple[str, int]) -> None:
        """Stop copying `key`; returns once no copy of it is in flight (Kafka's
        removeFetcherForPartitions). A copy committed after this broker became the leader
        would put the old leader's records above the new epoch's start offset, where a
        producer's retry already landed: the same records twice."""
        with self._lock:
            if self._followed.pop(key, None) is None:
                return
        with self._round_lock:
            pass

    def keys(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._followed)

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        self._thread.join(timeout_s)

    # ---- the fetch loop ------------------------------------------------------------------------

    def _run(self) -> None:
        failed_since, failures = 0.0, 0  # the run of failed rounds going on, if any
        while True:
            with self._lock:
                while not self._stopped and not (self._address and self._ready()):
                    self._lock.wait(self._config.replica_fetch_backoff_ms / 1000)
                if self._stopped:
                    return
                address, followed = self._address, self._ready()
            try:
                self._fetch_round(address, followed)
                if failures:
                    log.info("broker %d: fetching from leader %d again, after %d failed "
                             "rounds in %.1f s", self.broker_id, self.leader_id, failures,
                             time.monotonic() - failed_since)
                    failures = 0
            except errors.DeltaBusError as e:  # the leader is unreachable or restarting
                # Said once a run (a round is retried every replica.fetch.backoff.ms): the
                # rest at DEBUG, and the run's length when fetching works again.
                if not failures:
                    failed_since = time.monotonic()
                failures += 1
                log.log(logging.INFO if failures == 1 else logging.DEBUG,
                        "broker %d: fetch from leader %d at %s failed: %s", self.broker_id,
                        self.leader_id, address, e)
                with self._lock:
                    self._lock.wait(self._config.replica_fetch_backoff_ms / 1000)
            except Exception:  # a bug: keep the fetcher alive, but say so loudly
                log.exception("broker %d: replica fetcher for leader %d", self.broker_id,
                              self.leader_id)
                with self._lock:
                    self._lock.wait(1.0)

    def _ready(self) -> list[_Followed]:
        """The partitions to fetch now: not backing off after an error, and not moving
        (a replica a reassignment adds) while the follower rate is exceeded (Kafka's
        shouldFollowerThrottle)."""
        now = time.monotonic()
        throttled = self._quota.exceeded()
        return [f for f in self._followed.values() if f.retry_at <= now
                and not (throttled and self._moving(f))]

    def _moving(self, f: _Followed) -> bool:
        return self.broker_id in f.partition.adding_replicas

    def _fetch_round(self, address: str, followed: list[_Followed]) -> None:
        config = self._config
        by_key = {}
        fetched_from = {}
        specs = []
        for f in followed:
            plog = f.partition.log
            key = (f.partition.topic, f.partition.partition)
            fetched_from[key] = plog.log_end_offset
            max_bytes = config.replica_fetch_max_bytes
            if self._moving(f):
                max_bytes = self._quota.fetch_bytes(max_bytes)
            specs.append(FetchSpec(*key, fetched_from[key], max_bytes,
                                   current_leader_epoch=f.leader_epoch,
                                   last_fetched_epoch=plog.last_epoch,
                                   log_start_offset=plog.log_start_offset))
            by_key[key] = f
        results = self._leaders.fetch(address, specs, max_wait_ms=config.replica_fetch_wait_max_ms,
                                      max_bytes=config.replica_fetch_response_max_bytes)
        with self._round_lock:
            self._copy_answers(results, by_key, fetched_from)

    def _copy_answers(self, results: list[FetchResult], by_key: dict[tuple[str, int], _Followed],
                      fetched_from: dict[tuple[str, int], int]) -> None:
        """Copy what the leader answered, for the partitions still followed; returns once the
        copies are committed."""
        pending: list[tuple[_Followed, Future[AppendResult], int]] = []
        copied_bytes: dict[int, int] = {}
        for r in results:
            found = by_key.get((r.topic, r.partition))
            if found is None or not self._still_follows(found):
                continue
            copied_bytes[id(found)] = (sum(f.size_bytes for f in r.files or ())
                                       + (r.records.nbytes if r.records is not None else 0))
            try:
                step = self._start_copy(found, r, fetched_from[(r.topic, r.partition)])
            except Exception as e:  # a file that vanished, a closed log: try again later
                self._on_error(found, e)
                continue
            if step is not None:
                pending.append((found, *step))
        for f, future, high_watermark in pending:
            try:
                future.result(COPY_TIMEOUT_S)
            except Exception as e:
                self._on_error(f, e)
                continue
            f.last_error = ""
            if self._moving(f):
                self._quota.record(copied_bytes[id(f)])
            if high_watermark >= 0:
                f.partition.follower_high_watermark(high_watermark)
        self._take_log_starts(results, by_key)

    def _take_log_starts(self, results: list[FetchResult],
                         by_key: dict[tuple[str, int], _Followed]) -> None:
        """Move each log start offset up to the leader's, as far as this log reaches (Kafka's
        follower: maybeIncrementLogStartOffset), committed before the next fetch reports it:
        the leader answers DeleteRecords once the ISR holds it, and this replica, should it
        lead, serves nothing below it."""
        pending: list[tuple[_Followed, Future[AppendResult]]] = []
        for r in results:
            found = by_key.get((r.topic, r.partition))
            if found is None or r.error is not None or r.diverging_epoch is not None:
                continue
            plog = found.partition.log
            offset = min(r.log_start_offset, plog.log_end_offset)
            if offset > plog.log_start_offset and self._still_follows(found):
                try:
                    pending.append((found, plog.advance_log_start(offset)))
                except errors.DeltaBusError as e:
                    self._on_error(found, e)
        for f, future in pending:
            try:
                future.result(COPY_TIMEOUT_S)
            except Exception as e:
                self._on_error(f, e)

    def _start_copy(self, f: _Followed, r: FetchResult, fetch_offset: int
                    ) -> tuple[Future[AppendResult], int] | None:
        """Queue what one partition's answer asks for: a truncation, file or record copies.
        Returns the future of the commit and the leader's high watermark (-1: none to take)."""
        plog = f.partition.log
        if (isinstance(r.error, errors.OffsetOutOfRangeError)
                and r.log_start_offset > plog.log_end_offset):
            # Retention moved the leader's log start past our log end: what we hold is gone on
            # the leader; start again at its log start offset (Kafka's truncateFullyAndStartAt).
            log.info("broker %d: %s-%d ends at %d, below leader %d's log start offset %d; "
                     "starting again there", self.broker_id, r.topic, r.partition,
                     plog.log_end_offset, self.leader_id, r.log_start_offset)
            return plog.restart_at(r.log_start_offset), -1
        if r.error is not None:
            self._on_error(f, r.error)
            return None
        if r.diverging_epoch is not None:
            offset = f.partition.truncation_offset(r.diverging_epoch)
            log.info("broker %d: %s-%d diverges from leader %d at epoch %d; truncating to %d",
                     self.broker_id, r.topic, r.partition, self.leader_id,
                     r.diverging_epoch[0], offset)
            return plog.truncate_to(offset), -1
        if r.files:
            leader_dir = posixpath.join(posixpath.dirname(plog.path), f"replica-{self.leader_id}")
            strays = files_outside(r.files, leader_dir)
            if strays:  # copy only the leader's own table files, whatever an answer names
                self._on_error(f, errors.CorruptMessageError(
                    f"leader {self.leader_id} offered files outside its replica of "
                    f"{r.topic}-{r.partition}: {strays[:3]}"))
                return None
            return plog.append_files(r.files), r.high_watermark
        if r.records is not None and r.records.num_rows:
            return plog.append_copy(r.records, fetch_offset), r.high_watermark
        f.partition.follower_high_watermark(r.high_watermark)
        return None

    def _still_follows(self, f: _Followed) -> bool:
        with self._lock:
            return self._followed.get((f.partition.topic, f.partition.partition)) is f

    def _on_error(self, f: _Followed, error: BaseException) -> None:
        """Back off this partition; metadata (a new leader or epoch) re-adds it when needed."""
        said = str(error)
        retriable = isinstance(error, errors.DeltaBusError) and error.retriable
        # A retriable error repeats every replica.fetch.backoff.ms until the metadata changes:
        # said once, the repeats at DEBUG.
        level = (logging.WARNING if not retriable
                 else logging.DEBUG if said == f.last_error else logging.INFO)
        f.last_error = said
        log.log(level, "broker %d: copying %s-%d from leader %d: %s", self.broker_id,
                f.partition.topic, f.partition.partition, self.leader_id, error)
        with self._lock:
            f.retry_at = time.monotonic() + self._config.replica_fetch_backoff_ms / 1000


def files_outside(files: list[LogFile], leader_dir: str) -> list[str]:
    """The URIs among a leader's offered files that are not data files directly in its replica
    directory `leader_dir` (a follower copies nothing else into its table)."""
    return [f.uri for f in files
            if posixpath.dirname(f.uri) != leader_dir
            or posixpath.basename(f.uri) in ("", ".", "..")
            or not f.uri.endswith(".parquet")]
