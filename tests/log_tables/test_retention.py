"""Retention on real Delta tables: which files expire (Kafka's time and size rules), their removal
while the broker's log keeps appending, the log start offset moving, vacuum, and a follower
starting again above its old log end (truncateFullyAndStartAt)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.config import LogConfig
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.log_tables.retention import (
    delete_expired_log,
    remove_below,
    retention_cut,
    table_files,
    vacuum,
)
from deltabus.records import normalize_produce, produce_batch
from deltabus.storage import Storage

HOUR_MS = 3_600_000


def _append(log: PartitionLog, n: int, timestamp_ms: int) -> None:
    batch = normalize_produce(produce_batch([b"v" * 100] * n, timestamps_ms=[timestamp_ms] * n))
    log.append(batch, leader_epoch=0).result(30)  # one commit, one file each


def _files(**columns: list) -> pa.Table:
    return pa.table({"size_bytes": columns["size"], "min.offset": columns["first"],
                     "max.offset": [f + 9 for f in columns["first"]],
                     "max.timestamp": columns["newest"]})


def test_time_rule_takes_expired_files_oldest_first_but_never_the_newest() -> None:
    now = 10 * HOUR_MS
    files = _files(first=[0, 10, 20, 30], size=[1] * 4, newest=[1, 2, now, 3])
    # the third file is recent: retention stops there even though the fourth is old
    assert retention_cut(files, now_ms=now, retention_ms=HOUR_MS, retention_bytes=-1,
                         high_watermark=40) == 20
    old = _files(first=[0, 10], size=[1, 1], newest=[1, 2])
    assert retention_cut(old, now_ms=now, retention_ms=HOUR_MS, retention_bytes=-1,
                         high_watermark=20) == 10  # the newest file stays
    assert retention_cut(files, now_ms=now, retention_ms=-1, retention_bytes=-1,
                         high_watermark=40) == -1  # -1: kept forever


def test_nothing_at_or_above_the_high_watermark_goes() -> None:
    files = _files(first=[0, 10, 20], size=[1] * 3, newest=[1, 2, 3])
    assert retention_cut(files, now_ms=HOUR_MS * 10, retention_ms=HOUR_MS, retention_bytes=-1,
                         high_watermark=15) == 10


def test_size_rule_removes_while_the_rest_still_exceeds_retention_bytes() -> None:
    now = HOUR_MS
    files = _files(first=[0, 10, 20, 30], size=[100, 100, 100, 100], newest=[now] * 4)
    # 400 bytes, limit 250: the oldest goes (300 left), the next would leave 200 < 250... Kafka
    # removes a segment only while what remains without it is still at least the limit
    assert retention_cut(files, now_ms=now, retention_ms=-1, retention_bytes=250,
                         high_watermark=40) == 10
    assert retention_cut(files, now_ms=now, retention_ms=-1, retention_bytes=200,
                         high_watermark=40) == 20
    assert retention_cut(files, now_ms=now, retention_ms=-1, retention_bytes=0,
                         high_watermark=40) == 30


def test_removal_while_the_log_appends_then_vacuum(tmp_path: Path) -> None:
    path = str(tmp_path / "replica-0")
    log = PartitionLog(path, topic="t", partition=0)
    now = int(time.time() * 1000)
    for _ in range(3):
        _append(log, 10, now - 5 * HOUR_MS)
    _append(log, 10, now)
    _append(log, 10, now)
    files = table_files(DeltaTable(path))
    assert files.num_rows == 5
    cut = retention_cut(files, now_ms=now, retention_ms=HOUR_MS, retention_bytes=-1,
                        high_watermark=log.high_watermark)
    assert cut == 30
    removed = remove_below(DeltaTable(path), cut, delete_delay_ms=0)
    assert (removed.files, removed.records, removed.log_start_offset) == (3, 30, 30)

    _append(log, 10, now)  # the log's own view of the table is older: no conflict
    assert log.log_end_offset == 60
    log.refresh()
    assert log.log_start_offset == 30
    with pytest.raises(errors.OffsetOutOfRangeError, match="log start offset 30"):
        log.read(29, 1 << 20)
    assert log.read(30, 1 << 20).column("offset")[0].as_py() == 30

    gone = {f for f in files.column("path").to_pylist()[:3]}
    assert vacuum(DeltaTable(path)) == 3  # delay 0: the removed files go at once
    assert not any((tmp_path / "replica-0" / f).exists() for f in gone)
    log.close()
    reopened = PartitionLog(path, topic="t", partition=0)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (30, 60)
    assert reopened.read(30, 1 << 20).num_rows == 30
    reopened.close()


def test_vacuum_waits_out_the_delete_delay(tmp_path: Path) -> None:
    path = str(tmp_path / "replica-0")
    log = PartitionLog(path, topic="t", partition=0)
    for _ in range(3):
        _append(log, 5, 0)
    log.close()
    remove_below(DeltaTable(path), 10, delete_delay_ms=60_000)
    assert vacuum(DeltaTable(path)) == 0
    assert len(list((tmp_path / "replica-0").glob("*.parquet"))) == 3


def test_the_delta_log_keeps_what_a_reader_past_the_delete_delay_needs(tmp_path: Path) -> None:
    """A partition table checkpoints every few versions and commits many times a second; its
    Delta log is cut below the newest checkpoint written before the delay, so it stops growing
    with every commit. The table still opens whole, and a reader holding an old version moves
    to the newest from the kept checkpoint."""
    path = tmp_path / "replica-0"
    log = PartitionLog(str(path), topic="t", partition=0, config=LogConfig(checkpoint_interval=5))
    for _ in range(23):
        _append(log, 2, 0)
    log.close()  # waits for the last checkpoint
    reader = DeltaTable(str(path), version=3)  # a reader that has not looked since
    logs = path / "_delta_log"
    checkpoints = sorted(int(p.name[:20]) for p in logs.glob("*.checkpoint.parquet"))
    assert checkpoints  # one at least (the log writes them on a thread of its own)
    before = {p.name for p in logs.iterdir()}
    storage, now = Storage(str(tmp_path)), int(time.time() * 1000)

    # Written within the delay: every file stays.
    assert delete_expired_log(str(path), storage, older_than_ms=60_000, now_ms=now) == 0
    assert {p.name for p in logs.iterdir()} == before
    # Past it: everything below the newest checkpoint goes; it and what follows it stay.
    deleted = delete_expired_log(str(path), storage, older_than_ms=60_000, now_ms=now + 120_000)
    left = {p.name for p in logs.iterdir()}
    assert deleted == len(before - left) > 0
    kept = checkpoints[-1]
    assert all(int(name[:20]) >= kept for name in left if name[:20].isdigit())
    assert f"{kept:020d}.checkpoint.parquet" in left and "_last_checkpoint" in left
    assert {f"{v:020d}.json" for v in range(kept, 24)} <= left

    reader.update_incremental()
    assert reader.version() == DeltaTable(str(path)).version() == 23
    reopened = PartitionLog(str(path), topic="t", partition=0)
    assert reopened.read(0, 1 << 20, to_log_end=True).num_rows == 46
    reopened.close()


def test_restart_at_empties_the_log_and_continues_above_it(tmp_path: Path) -> None:
    path = str(tmp_path / "replica-1")
    log = PartitionLog(path, topic="t", partition=0, replicated=True)
    _append(log, 10, 0)
    log.restart_at(500).result(30)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (500, 500, 500)
    log.close()
    reopened = PartitionLog(path, topic="t", partition=0, replicated=True)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (500, 500)
    leader = PartitionLog(str(tmp_path / "leader"), topic="t", partition=0)
    _append(leader, 510, 0)
    copied = reopened.append_copy(leader.read(500, 1 << 20)).result(30)
    assert (copied.base_offset, copied.last_offset) == (500, 509)
    leader.close()
    reopened.close()
