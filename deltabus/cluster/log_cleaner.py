"""The log cleaner, as Spark work: every `log.retention.check.interval.ms` the driver runs one
Spark job ("deltabus log cleaner: retention") with a task per partition whose topic deletes old
data. Each task decides on the leader's table how far retention reaches, removes the expired files
from every replica's table, and vacuums files removed longer than `file.delete.delay.ms` ago (see
log_tables/retention.py). The controller tells the replicas' brokers with their next heartbeat,
and they take the new log start offset in from their tables.

The cleaner never competes with brokers for their task slots or threads: it is an ordinary short
Spark job, visible in the Spark UI under its job group, and each run logs what it removed per
partition.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable

from deltabus.log_tables.layout import replica_path
from deltabus.log_tables.retention import (
    Removed,
    log_end_offset,
    remove_below,
    retention_cut,
    table_files,
    vacuum,
)

log = logging.getLogger(__name__)

JOB_GROUP = "deltabus-log-cleaner"


@dataclass(frozen=True)
class RetentionTask:
    """Apply retention to partition `topic`-`partition` (all its replica tables)."""

    root: str
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    retention_ms: int
    retention_bytes: int
    file_delete_delay_ms: int
    vacuum: bool = True


@dataclass(frozen=True)
class RetentionResult:
    task: RetentionTask
    log_start_offset: int  # the leader's, after this run (-1: nothing removed)
    removed: dict[int, Removed] = field(default_factory=dict)  # per replica
    vacuumed: int = 0
    elapsed_s: float = 0.0
    error: str = ""


def run_retention(task: RetentionTask) -> RetentionResult:
    """The Spark task body, on an executor: one partition, every replica table. Errors are
    reported, not raised, so one partition's trouble does not fail the others."""
    started = time.monotonic()
    now_ms = int(time.time() * 1000)
    try:
        tables = {}
        for r in task.replicas:
            path = replica_path(task.root, task.topic, task.partition, r)
            if os.path.exists(os.path.join(path, "_delta_log")) or "://" in path:
                tables[r] = DeltaTable(path)
        if task.leader not in tables:
            return RetentionResult(task, -1, error="the leader's table is missing")
        # Every in-sync replica holds the log below the high watermark; the smallest log end
        # among them bounds it from above.
        high_watermark = min(log_end_offset(tables[r]) for r in task.isr if r in tables)
        cut = retention_cut(table_files(tables[task.leader]), now_ms=now_ms,
                            retention_ms=task.retention_ms, retention_bytes=task.retention_bytes,
                            high_watermark=high_watermark)
        removed = {}
        if cut > 0:
            for r, table in tables.items():
                removed[r] = remove_below(table, cut, delete_delay_ms=task.file_delete_delay_ms,
                                          now_ms=now_ms)
        vacuumed = 0
        if task.vacuum:
            for r in tables:
                vacuumed += vacuum(DeltaTable(replica_path(task.root, task.topic,
                                                           task.partition, r)))
        return RetentionResult(task, cut, removed, vacuumed, time.monotonic() - started)
    except Exception as e:  # a table a concurrent delete removed, storage trouble
        return RetentionResult(task, -1, error=f"{type(e).__name__}: {e}",
                               elapsed_s=time.monotonic() - started)


class LogCleaner:
    """Driver side: runs the retention job now (`run`) or every `interval_s` (`start`).
    Thread-safe (one run at a time); `interval_s` may be changed while it runs."""

    def __init__(self, spark: Any, tasks: Any, changed: Any, interval_ms: int) -> None:
        self._spark = spark
        self._tasks = tasks  # () -> list[RetentionTask], from the controller's metadata
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
            except Exception as e:  # cancelled at stop, or Spark trouble: try again next time
                if not self._stopping.is_set():
                    log.warning("log cleaner run failed: %s", str(e).splitlines()[0][:300])

    def run(self) -> list[RetentionResult]:
        """One retention run over every partition that may have data to remove; returns what
        it did per partition (also logged)."""
        with self._run_lock:
            tasks = self._tasks()
            if not tasks:
                return []
            sc = self._spark.sparkContext
            sc.setJobGroup(JOB_GROUP, f"deltabus log cleaner: retention of {len(tasks)} "
                           "partitions", interruptOnCancel=True)
            started = time.monotonic()
            results: list[RetentionResult] = (
                sc.parallelize(tasks, len(tasks)).map(run_retention).collect())
            self.runs += 1
        self._changed([(r.task.topic, r.task.partition, r.task.replicas) for r in results
                       if any(x.files for x in r.removed.values())])
        for r in results:
            t = r.task
            if r.error:
                log.warning("log cleaner: retention of %s-%d failed: %s", t.topic, t.partition,
                            r.error)
            elif r.removed or r.vacuumed:
                removed = ", ".join(f"replica {b}: {x.files} files, {x.records} records, "
                                    f"{x.bytes} bytes" for b, x in sorted(r.removed.items()))
                log.info("log cleaner: %s-%d log start offset %d (%s); %d removed files "
                         "deleted", t.topic, t.partition, r.log_start_offset,
                         removed or "nothing new", r.vacuumed)
        log.debug("log cleaner: retention of %d partitions took %.1f s", len(tasks),
                  time.monotonic() - started)
        return results
