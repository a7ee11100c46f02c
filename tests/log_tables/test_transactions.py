"""A partition log's transactions on a real Delta table: markers are rows, the last stable offset
stops at the oldest open transaction, aborted transactions are indexed, an older epoch's marker is
refused and a marker's epoch fences older batches, and a reopened log (a new leader) rebuilds the
same state from its table and the producers the metadata says are open."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.log_tables import LogConfig, PartitionLog
from deltabus.log_tables.control_records import control_mask, is_commit
from deltabus.log_tables.transactions import AbortedTxn
from deltabus.records import ProducerState, normalize_produce, produce_batch


def batch(prefix: str, n: int):
    return normalize_produce(produce_batch([f"{prefix}-{i}".encode() for i in range(n)]))


def open_log(tmp_path) -> PartitionLog:
    return PartitionLog(str(tmp_path / "log"), topic="t", partition=0, config=LogConfig())


def txn(pid: int, seq: int, epoch: int = 0) -> ProducerState:
    return ProducerState(pid, epoch, seq, transactional=True)


def marker(log: PartitionLog, pid: int, committed: bool, epoch: int = 0) -> int:
    return log.append_marker(pid, epoch, committed=committed, coordinator_epoch=3,
                             leader_epoch=0).result(10).base_offset


def test_markers_move_the_lso_and_index_aborted_transactions(tmp_path):
    log = open_log(tmp_path)
    log.append(batch("plain", 2), leader_epoch=0).result(10)  # offsets 0-1
    log.append(batch("a", 3), leader_epoch=0, producer=txn(7, 0)).result(10)  # 2-4
    log.append(batch("b", 2), leader_epoch=0, producer=txn(8, 0)).result(10)  # 5-6
    assert log.last_stable_offset() == 2  # producer 7's transaction is open
    assert marker(log, 7, committed=False) == 7
    assert log.last_stable_offset() == 5  # now producer 8's
    assert marker(log, 8, committed=True) == 8
    assert log.last_stable_offset() == log.high_watermark == 9
    assert log.aborted_transactions(0, 9) == [AbortedTxn(7, 2, 7)]
    assert log.aborted_transactions(8, 9) == []  # ended before the range
    rows = log.read(0, 1 << 30)
    markers = rows.filter(control_mask(rows))
    assert markers.column("offset").to_pylist() == [7, 8]
    assert [is_commit(k) for k in markers.column("key").to_pylist()] == [False, True]
    log.close()


def test_a_reopened_log_rebuilds_open_and_aborted_transactions(tmp_path):
    log = open_log(tmp_path)
    log.append(batch("a", 3), leader_epoch=0, producer=txn(7, 0)).result(10)  # 0-2
    marker(log, 7, committed=False)  # 3
    log.append(batch("a2", 2), leader_epoch=0, producer=txn(7, 3)).result(10)  # 4-5: open
    log.append(batch("b", 2), leader_epoch=0, producer=txn(8, 0)).result(10)  # 6-7
    marker(log, 8, committed=True)  # 8
    log.close()
    reopened = open_log(tmp_path)
    reopened.reset_transactions(frozenset({7, 8}))  # the image: both in a transaction
    assert reopened.last_stable_offset() == 4
    assert reopened.aborted_transactions(0, 9) == [AbortedTxn(7, 0, 3)]
    marker(reopened, 7, committed=False)  # 9: names offset 4 as its first
    assert reopened.last_stable_offset() == 10
    reopened.close()
    again = open_log(tmp_path)
    assert again.aborted_transactions(0, 10) == [AbortedTxn(7, 0, 3), AbortedTxn(7, 4, 9)]
    again.close()


def test_an_older_epochs_marker_is_refused_and_a_newer_one_fences(tmp_path):
    log = open_log(tmp_path)
    log.append(batch("a", 1), leader_epoch=0, producer=txn(7, 0, epoch=2)).result(10)
    with pytest.raises(errors.InvalidProducerEpochError):
        log.append_marker(7, 1, committed=True, coordinator_epoch=0, leader_epoch=0)
    marker(log, 7, committed=False, epoch=3)  # the coordinator aborted it with a bumped epoch
    with pytest.raises(errors.InvalidProducerEpochError):
        log.append(batch("zombie", 1), leader_epoch=0, producer=txn(7, 1, epoch=2)).result(10)
    log.append(batch("new", 1), leader_epoch=0, producer=txn(7, 0, epoch=3)).result(10)
    assert log.last_stable_offset() == 2
    log.close()


def test_a_marker_for_a_producer_with_nothing_here_is_appended(tmp_path):
    log = open_log(tmp_path)
    assert marker(log, 42, committed=False) == 0
    assert log.aborted_transactions(0, 1) == []  # it aborted nothing here
    assert log.last_stable_offset() == 1
    log.close()
