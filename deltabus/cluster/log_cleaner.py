"""The log cleaner, as Spark work: every `log.retention.check.interval.ms` the driver runs one
Spark job ("deltabus log cleaner") with a task per partition. Each task decides on the leader's
table how far retention reaches (topics whose cleanup.policy includes delete) and removes the
expired files, and those wholly below the log start offset DeleteRecords recorded, from every
replica's table (log_tables/retention.py), compacts each replica table to the latest record per
key (topics whose cleanup.policy includes compact: log_tables/compaction.py), merges each
replica table's runs of small old files into files of up to `segment.bytes`
(log_tables/merge.py), vacuums files removed longer than `file.delete.delay.ms` ago, and
deletes the Delta log's commits and checkpoints older than that (`delete_expired_log`). The
controller tells the replicas' brokers with their next heartbeat, and they take the changed
tables in (the new log start offset).

The cleaner never competes with brokers for their task slots or threads: it is an ordinary short
Spark job, visible in the Spark UI under its job group, and each run logs what it removed per
partition. Its partitions are shared out over at most the task slots the brokers leave, less
one (`cleaner_slices`): a job of a task per partition kept every free slot for minutes over
thousands of partitions (bench step (p), 12,000), and a killed broker's relaunch, a later job,
waited behind it.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable

from deltabus.cluster.driver_metrics import DriverMetrics
from deltabus.log_tables.compaction import Compacted, compact
from deltabus.log_tables.delta_reads import open_table
from deltabus.log_tables.layout import log_path
from deltabus.log_tables.merge import Merged, merge_small_files
from deltabus.log_tables.retention import (
    Removed,
    delete_expired_log,
    log_end_offset,
    recorded_cut,
    remove_below,
    retention_cut,
    table_files,
    vacuum,
)
from deltabus.storage import Storage

log = logging.getLogger(__name__)

JOB_GROUP = "deltabus-log-cleaner"


@dataclass(frozen=True)
class CleanerTask:
    """Clean partition `topic`-`partition` (all its replica tables); retention_ms and
    retention_bytes are -1 where the topic's cleanup.policy does not include delete, and
    `compact` is false where it does not include compact."""

    storage: Storage  # the cluster root and its options
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    retention_ms: int
    retention_bytes: int
    file_delete_delay_ms: int
    segment_bytes: int
    merge_min_age_ms: int
    compact: bool = False
    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    # Compaction stays below the last stable offset: the producers with a transaction open on
    # the partition in the controller's metadata, and when the task was made (driver's clock).
    open_producers: tuple[int, ...] = ()
    open_as_of_ms: int = 0
    diskless: bool = False  # one table, the partition's own (its one replica is its leader)


@dataclass(frozen=True)
class CleanerResult:
    task: CleanerTask
    log_start_offset: int  # the leader's, after this run (-1: nothing removed)
    removed: dict[int, Removed] = field(default_factory=dict)  # per replica
    merged: dict[int, Merged] = field(default_factory=dict)  # per replica
    compacted: dict[int, Compacted] = field(default_factory=dict)  # per replica
    vacuumed: int = 0
    log_files_deleted: int = 0  # expired Delta log files (commits, checkpoints)
    elapsed_s: float = 0.0
    error: str = ""

    @property
    def changed(self) -> bool:
        """Did the run change a table the brokers read (they must refresh)?"""
        return (any(x.files for x in self.removed.values())
                or any(x.merged_files for x in self.merged.values())
                or any(x.files_rewritten for x in self.compacted.values()))


def cleaner_slices(partitions: int, slots: int, reserved: int) -> int:
    """The Spark tasks a cleaner run of `partitions` partitions is split into: at most the
    `slots` Spark offers less the `reserved` ones, and at least one."""
    return max(1, min(partitions, slots - reserved))


def run_cleaner(task: CleanerTask) -> CleanerResult:
    """The Spark task body, on an executor: one partition, every replica table. Errors are
    reported, not raised, so one partition's trouble does not fail the others."""
    started = time.monotonic()
    now_ms = int(time.time() * 1000)
    storage = task.storage

    def path(replica: int) -> str:
        return log_path(storage.root, task.topic, task.partition, replica, task.diskless)

    def table(replica: int) -> DeltaTable:
        return open_table(path(replica), storage_options=storage.delta_options)

    try:
        tables = {}
        for r in task.replicas:
            if storage.exists(posixpath.join(path(r), "_delta_log")):
                tables[r] = table(r)
        if task.leader not in tables:
            return CleanerResult(task, -1, error="the leader's table is missing")
        # Every in-sync replica holds the log below the high watermark; the smallest log end
        # among them bounds it from above.
        high_watermark = min(log_end_offset(tables[r]) for r in task.isr if r in tables)
        cut = retention_cut(table_files(tables[task.leader]), now_ms=now_ms,
                            retention_ms=task.retention_ms, retention_bytes=task.retention_bytes,
                            high_watermark=high_watermark)
        cut = max(cut, recorded_cut(tables[task.leader]))  # DeleteRecords' log start offset
        removed = {}
        if cut > 0:
            for r, t in tables.items():
                removed[r] = remove_below(t, cut, delete_delay_ms=task.file_delete_delay_ms,
                                          now_ms=now_ms, storage=storage)
        compacted = {}
        if task.compact:
            for r in tables:
                compacted[r] = compact(
                    table(r), high_watermark=high_watermark,
                    min_lag_ms=task.min_compaction_lag_ms,
                    delete_retention_ms=task.delete_retention_ms,
                    delete_delay_ms=task.file_delete_delay_ms,
                    min_dirty_ratio=task.min_cleanable_dirty_ratio, now_ms=now_ms,
                    storage=storage, open_producers=task.open_producers,
                    open_as_of_ms=task.open_as_of_ms)
        merged = {}
        for r in tables:
            merged[r] = merge_small_files(
                table(r), target_bytes=task.segment_bytes,
                min_age_ms=task.merge_min_age_ms, high_watermark=high_watermark,
                delete_delay_ms=task.file_delete_delay_ms, now_ms=now_ms, storage=storage)
        vacuumed, log_files_deleted, vacuum_error = 0, 0, ""
        try:
            vacuumed = sum(vacuum(table(r), storage) for r in tables)
            log_files_deleted = sum(
                delete_expired_log(path(r), storage, older_than_ms=task.file_delete_delay_ms,
                                   now_ms=now_ms) for r in tables)
        except Exception as e:
            # The store failed: the files wait for a later run, and what this run removed,
            # merged and compacted is still reported, so brokers take it in.
            vacuum_error = f"vacuum: {type(e).__name__}: {e}"
        return CleanerResult(task, cut, removed, merged, compacted, vacuumed,
                             log_files_deleted, time.monotonic() - started, error=vacuum_error)
    except Exception as e:  # a table a concurrent delete removed, storage trouble
        return CleanerResult(task, -1, error=f"{type(e).__name__}: {e}",
                             elapsed_s=time.monotonic() - started)


class LogCleaner:
    """Driver side: runs the retention job now (`run`) or every `interval_s` (`start`).
    Thread-safe (one run at a time); `interval_s` may be changed while it runs."""

    def __init__(self, spark: Any, tasks: Any, changed: Any, interval_ms: int, *,
                 reserved_slots: int | Callable[[], int] = 0,
                 metrics: DriverMetrics | None = None) -> None:
        """`reserved_slots`: the Spark task slots the cleaner leaves to others (the brokers'
        own, and one for a broker's relaunch), or how to count them (brokers come and go);
        `metrics`: the driver's, which time each run."""
        self._metrics = metrics
        self._spark = spark
        self._reserved_slots = (reserved_slots if callable(reserved_slots)
                                else lambda: reserved_slots)
        # (topics, merge_min_age_ms) -> list[CleanerTask], from the controller's metadata
        self._tasks = tasks
        self._changed = changed  # (list[(topic, partition, replicas)]) -> None: tell brokers
        self.interval_s = interval_ms / 1000
        self._run_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.runs = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="deltabus-log-cleaner",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._spark.sparkContext.cancelJobGroup(JOB_GROUP)
            self._thread.join(30)

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stopping.wait(0.2):
            if time.monotonic() - last < self.interval_s:
                continue
            last = time.monotonic()
            try:
                self.run()
            except Exception:  # cancelled at stop, or Spark trouble: try again next time
                if not self._stopping.is_set():
                    log.exception("log cleaner run failed; the next runs in %.0f s",
                                  self.interval_s)

    def run(self, topics: list[str] | None = None,
            merge_min_age_ms: int | None = None) -> list[CleanerResult]:
        """One cleaner run over every partition (of `topics`, when given; small files younger
        than `merge_min_age_ms` are left, the cluster's setting by default); returns what it did
        per partition (also logged)."""
        with self._run_lock:
            tasks = self._tasks(topics, merge_min_age_ms)
            if not tasks:
                return []
            sc = self._spark.sparkContext
            sc.setJobGroup(JOB_GROUP, f"deltabus log cleaner: retention, compaction and "
                           f"small-file merge of {len(tasks)} partitions", interruptOnCancel=True)
            started = time.monotonic()
            slices = cleaner_slices(len(tasks), sc.defaultParallelism, self._reserved_slots())
            with (self._metrics.timed("log_cleaner") if self._metrics
                  else contextlib.nullcontext()):
                results: list[CleanerResult] = (
                    sc.parallelize(tasks, slices).map(run_cleaner).collect())
            self.runs += 1
        self._changed([(r.task.topic, r.task.partition, r.task.replicas) for r in results
                       if r.changed])
        for r in results:
            t = r.task
            if r.error:  # the others were cleaned; this one is tried again next round
                log.error("log cleaner: %s-%d failed: %s", t.topic, t.partition, r.error)
                continue
            if any(x.files for x in r.removed.values()):
                log.info("log cleaner: %s-%d retention moved the log start offset to %d, "
                         "removing %s", t.topic, t.partition, r.log_start_offset, ", ".join(
                             f"replica {b}: {x.files} files, {x.records} records, {x.bytes} "
                             "bytes" for b, x in sorted(r.removed.items())))
            if any(x.files_rewritten for x in r.compacted.values()):
                log.info("log cleaner: %s-%d compacted below offset %d: %s", t.topic,
                         t.partition, max(x.cleanable_end for x in r.compacted.values()),
                         ", ".join(f"replica {b}: {x.removed} of {x.records_before} records "
                                   f"removed ({x.tombstones_removed} tombstones), "
                                   f"{x.files_rewritten} files rewritten"
                                   for b, x in sorted(r.compacted.items()) if x.files_rewritten))
            if any(x.merged_files for x in r.merged.values()):
                log.info("log cleaner: %s-%d merged small files: %s", t.topic, t.partition,
                         ", ".join(f"replica {b}: {x.merged_files} files ({x.records} records) "
                                   f"into {x.merged_files - x.files_before + x.files_after}, "
                                   f"{x.files_after} files now"
                                   for b, x in sorted(r.merged.items()) if x.merged_files))
            if r.vacuumed:
                log.info("log cleaner: %s-%d deleted %d removed files from disk", t.topic,
                         t.partition, r.vacuumed)
            if r.log_files_deleted:
                log.info("log cleaner: %s-%d deleted %d expired Delta log files", t.topic,
                         t.partition, r.log_files_deleted)
        log.debug("log cleaner: %d partitions took %.1f s", len(tasks),
                  time.monotonic() - started)
        return results
