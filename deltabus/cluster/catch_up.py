"""Catching a replica up as a Spark job: one task per partition replica, copying the leader's
committed Delta files (whole, with their statistics) into the replica's table, in parallel.

The driver runs it where a replica is brand new or far behind: before a reassignment adds it,
and before a lost broker is relaunched. The replica's broker is not writing the table then (it
is not yet a replica, or it is down), and the `deltabus.log` app transaction would make a
concurrent writer fail rather than duplicate. Afterwards the broker's own fetcher copies the few
batches committed meanwhile and the leader adds the replica to the ISR.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from deltabus.cluster.driver_metrics import DriverMetrics
from deltabus.log_tables.layout import replica_path
from deltabus.log_tables.partition_log import LogConfig, PartitionLog
from deltabus.storage import Storage

log = logging.getLogger(__name__)

COPY_ROUND_BYTES_MAX = 256 * 1024 * 1024  # files copied per commit
RECORDS_ROUND_BYTES_MAX = 8 * 1024 * 1024  # records copied per commit (not at a file boundary)
COMMIT_TIMEOUT_S = 300.0
REASSIGNMENT = "reassignment"  # the reason of a reassignment's catch-up job (throttled)


@dataclass(frozen=True)
class CatchUpTask:
    """Copy partition `topic`-`partition` from broker `source`'s replica to `target`'s."""

    storage: Storage  # the cluster root and its options
    topic: str
    partition: int
    source: int
    target: int
    # A reassignment's copy is paced at this rate (replication_quota.move_rates); 0: as fast
    # as it goes (a relaunched broker's own replicas, which Kafka never throttles either).
    bytes_per_s: float = 0.0


@dataclass(frozen=True)
class CatchUpResult:
    task: CatchUpTask
    truncated_to: int  # -1 when the replica did not diverge
    records_copied: int
    log_end_offset: int
    elapsed_s: float
    error: str = ""  # this replica was not caught up (the others may have been)


def copy_replica(source: PartitionLog, target: PartitionLog,
                 bytes_per_s: float = 0.0) -> tuple[int, int]:
    """Make `target` hold `source`'s log as it is now: drop what diverges (by leader epoch, as a
    follower does), then copy whole files where `target` ends at a file boundary and records
    elsewhere, at most `bytes_per_s` on average when given (a round is then a second of it).
    Returns (offset truncated to or -1, records copied)."""
    truncated = _truncate_divergence(source, target)
    if target.log_end_offset < source.log_start_offset:  # retention took what it lacks
        target.restart_at(source.log_start_offset).result(COMMIT_TIMEOUT_S)
    until = source.log_end_offset
    copied = copied_bytes = 0
    started = time.monotonic()
    files_max, records_max = COPY_ROUND_BYTES_MAX, RECORDS_ROUND_BYTES_MAX
    if bytes_per_s > 0:
        files_max = records_max = max(1, min(COPY_ROUND_BYTES_MAX, int(bytes_per_s)))
    while target.log_end_offset < until:
        files = source.files_from(target.log_end_offset, files_max)
        if files:
            result = target.append_files(files).result(COMMIT_TIMEOUT_S)
            copied_bytes += sum(f.size_bytes for f in files)
        else:
            fetch_offset = target.log_end_offset
            records = source.read(fetch_offset, min(records_max, RECORDS_ROUND_BYTES_MAX),
                                  to_log_end=True)
            result = target.append_copy(records, fetch_offset).result(COMMIT_TIMEOUT_S)
            copied_bytes += records.nbytes
        copied += result.last_offset - result.base_offset + 1
        if bytes_per_s > 0:  # the copy so far at the rate: wait out what it ran ahead
            time.sleep(max(0.0, copied_bytes / bytes_per_s - (time.monotonic() - started)))
    return truncated, copied


def _truncate_divergence(source: PartitionLog, target: PartitionLog) -> int:
    if target.log_end_offset == 0:
        return -1
    cut = target.log_end_offset
    epoch, end = source.end_offset_for_epoch(target.last_epoch)
    if epoch < 0:  # the source holds nothing
        cut = source.log_end_offset
    elif end < target.log_end_offset or epoch < target.last_epoch:
        own_epoch, own_end = target.end_offset_for_epoch(epoch)
        cut = min(end, own_end) if own_epoch >= 0 else min(end, cut)
    cut = min(cut, source.log_end_offset)
    if cut >= target.log_end_offset:
        return -1
    target.truncate_to(cut).result(COMMIT_TIMEOUT_S)
    return cut


def run_catch_up(task: CatchUpTask) -> CatchUpResult:
    """The Spark task body: open both tables, copy, close. Neither table is ever created
    here (the controller creates a replica's table with its assignment): a missing one is
    this task's error, reported rather than raised, so the other replicas are caught up."""
    started = time.monotonic()
    try:
        truncated, copied, leo = _catch_up(task)
    except Exception as e:  # a lost table, storage trouble: the broker's fetchers take over
        return CatchUpResult(task, -1, 0, -1, time.monotonic() - started,
                             error=f"{type(e).__name__}: {e}")
    return CatchUpResult(task, truncated, copied, leo, time.monotonic() - started)


def _catch_up(task: CatchUpTask) -> tuple[int, int, int]:
    root = task.storage.root
    source = PartitionLog(replica_path(root, task.topic, task.partition, task.source),
                          topic=task.topic, partition=task.partition, config=LogConfig(),
                          storage=task.storage, create=False)
    try:
        target = PartitionLog(replica_path(root, task.topic, task.partition, task.target),
                              topic=task.topic, partition=task.partition, config=LogConfig(),
                              storage=task.storage, replicated=True, create=False)
        try:
            truncated, copied = copy_replica(source, target, task.bytes_per_s)
            return truncated, copied, target.log_end_offset
        finally:
            target.close()
    finally:
        source.close()


def catch_up_replicas(spark: Any, tasks: list[CatchUpTask], why: str,
                      group: str = "deltabus-catch-up",
                      metrics: DriverMetrics | None = None) -> list[CatchUpResult]:
    """Run the catch-up job (one task per replica, in job group `group`, so it can be
    cancelled; timed in the driver's `metrics`) and log what each task did."""
    if not tasks:
        return []
    sc = spark.sparkContext
    sc.setJobGroup(group, f"deltabus catch-up: {why}", interruptOnCancel=True)
    started = time.monotonic()
    log.info("catch-up job (%s): %d replicas", why, len(tasks))
    with metrics.timed("catch_up") if metrics else contextlib.nullcontext():
        results: list[CatchUpResult] = (
            sc.parallelize(tasks, len(tasks)).map(run_catch_up).collect())
    for r in results:
        if r.error:
            log.error("catching up %s-%d on broker %d from broker %d failed: %s",
                      r.task.topic, r.task.partition, r.task.target, r.task.source, r.error)
            continue
        log.info("caught up %s-%d on broker %d from broker %d: %d records copied in %.1f s, "
                 "log end offset %d%s", r.task.topic, r.task.partition, r.task.target,
                 r.task.source, r.records_copied, r.elapsed_s, r.log_end_offset,
                 f", truncated to {r.truncated_to}" if r.truncated_to >= 0 else "")
    log.info("catch-up job (%s) done in %.1f s", why, time.monotonic() - started)
    return results


def catch_up_before_relaunch(spark: Any, tasks: list[CatchUpTask], broker_id: int, group: str,
                             timeout_ms: int, stopping: threading.Event,
                             metrics: DriverMetrics | None = None) -> None:
    """The catch-up job of a lost broker's follower replicas, in job group `group`, cancelled
    past `timeout_ms` or once `stopping` is set: the job may wait for a task slot (a killed
    executor's replacement is still starting), and the broker must come back regardless; its
    fetchers copy whatever the job did not."""
    if not tasks:
        return
    done = threading.Event()

    def run() -> None:
        try:
            catch_up_replicas(spark, tasks, f"broker {broker_id} relaunching", group, metrics)
        except Exception as e:  # cancelled, or a task failed: the fetchers take over
            log.warning("catch-up before relaunching broker %d ended early: %s", broker_id,
                        str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        finally:
            done.set()

    threading.Thread(target=run, name=group, daemon=True).start()
    deadline = time.monotonic() + timeout_ms / 1000
    while not done.wait(0.1):
        if stopping.is_set() or time.monotonic() > deadline:
            log.warning("catch-up before relaunching broker %d cancelled after %.0f s",
                        broker_id, timeout_ms / 1000)
            spark.sparkContext.cancelJobGroup(group)
            done.wait(10)  # the job ends once its tasks are killed
            return
