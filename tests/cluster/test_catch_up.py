"""copy_replica, the body of a catch-up task, on real Delta tables (no Spark needed)."""

from __future__ import annotations

import time
from pathlib import Path

from deltabus.cluster.catch_up import CatchUpTask, copy_replica, run_catch_up
from deltabus.log_tables.layout import replica_path
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.records import normalize_produce, produce_batch
from deltabus.storage import Storage


def _log(path: str) -> PartitionLog:
    return PartitionLog(path, topic="t", partition=0)


def _append(log: PartitionLog, prefix: str, n: int, epoch: int) -> None:
    batch = normalize_produce(produce_batch([f"{prefix}{i}".encode() for i in range(n)]))
    log.append(batch, leader_epoch=epoch).result(30)


def _values(log: PartitionLog) -> list[bytes]:
    return log.read(0, 1 << 30, to_log_end=True).column("value").to_pylist()


def test_catch_up_truncates_a_diverged_replica_then_copies_the_rest(tmp_path: Path) -> None:
    root = str(tmp_path)
    leader = _log(replica_path(root, "t", 0, 0))
    stale = _log(replica_path(root, "t", 0, 1))
    _append(leader, "a", 3, epoch=0)
    _append(stale, "a", 3, epoch=0)
    _append(stale, "lost", 2, epoch=0)  # only the old leader had these
    _append(leader, "b", 4, epoch=1)  # the new leader's epoch
    _append(leader, "c", 2, epoch=1)
    stale.close()
    leader.close()
    result = run_catch_up(CatchUpTask(Storage(root), "t", 0, source=0, target=1))
    assert (result.truncated_to, result.log_end_offset) == (3, 9)
    assert result.records_copied == 6
    copied, source = _log(replica_path(root, "t", 0, 1)), _log(replica_path(root, "t", 0, 0))
    try:
        assert _values(copied) == _values(source)
        assert copied.end_offset_for_epoch(0) == (0, 3)
        assert copy_replica(source, copied) == (-1, 0)  # again: nothing to do
    finally:
        copied.close()
        source.close()


def test_a_throttled_copy_keeps_to_its_rate_and_copies_everything(tmp_path: Path) -> None:
    """A reassignment's catch-up task at `bytes_per_s` (replication_quota.move_rates): rounds
    of a second of the rate, paced so the copy never runs ahead of it."""
    root = str(tmp_path)
    leader = _log(replica_path(root, "t", 0, 0))
    for n in range(12):  # twelve files of about 20 KB
        batch = normalize_produce(produce_batch([bytes([n]) * 1000 for _ in range(20)]))
        leader.append(batch, leader_epoch=0).result(30)
    moving = _log(replica_path(root, "t", 0, 1))
    total = sum(f.size_bytes for f in leader.files_from(0, 1 << 30))
    rate = total / 3  # three seconds' worth
    try:
        started = time.monotonic()
        assert copy_replica(leader, moving, bytes_per_s=rate) == (-1, 240)
        elapsed = time.monotonic() - started
        assert _values(moving) == _values(leader)
        # the last round waits out the rate too: the copy took at least total / rate
        assert elapsed >= total / rate * 0.95, (elapsed, total, rate)
    finally:
        moving.close()
        leader.close()
