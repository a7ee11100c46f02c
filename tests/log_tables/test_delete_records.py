"""DeleteRecords on one partition log: the log start offset moves up, is recorded in the table
(it survives a reopen), and no read, from the log or straight from the table, returns a record
below it; the cleaner's removal then takes the files wholly below it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.log_tables.log_reader import LogReader
from deltabus.log_tables.partition_log import EARLIEST_TIMESTAMP, PartitionLog
from deltabus.log_tables.retention import recorded_cut, remove_below, table_files
from deltabus.records import normalize_produce, produce_batch


def _append(log: PartitionLog, n: int) -> None:
    now = int(time.time() * 1000)
    batch = normalize_produce(produce_batch([b"v"] * n, timestamps_ms=[now] * n))
    log.append(batch, leader_epoch=0).result(30)  # one commit, one file each


def test_the_log_start_moves_up_survives_a_reopen_and_hides_what_is_below(
        tmp_path: Path) -> None:
    path = str(tmp_path / "replica-0")
    log = PartitionLog(path, topic="t", partition=0)
    for _ in range(3):
        _append(log, 10)  # files [0, 9], [10, 19], [20, 29]
    assert log.advance_log_start(15).result(30).log_start_offset == 15
    assert log.advance_log_start(5).result(30).log_start_offset == 15  # never down
    with pytest.raises(errors.OffsetOutOfRangeError):
        log.advance_log_start(31)
    assert log.log_start_offset == 15
    with pytest.raises(errors.OffsetOutOfRangeError, match="log start offset 15"):
        log.read(14, 1 << 20)
    assert log.read(15, 1 << 20).column("offset")[0].as_py() == 15
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP)[0] == 15
    assert log.offset_for_timestamp(0)[0] == 15  # by timestamp: nothing below it either
    log.close()

    reopened = PartitionLog(path, topic="t", partition=0)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (15, 30)
    reader = LogReader(path)
    assert reader.log_start_offset == 15
    assert [t.column("offset")[0].as_py() for t in reader.read(0, 30)][0] == 15

    removed = remove_below(DeltaTable(path), recorded_cut(DeltaTable(path)), delete_delay_ms=0)
    assert (removed.files, removed.records) == (1, 10)  # [10, 19] straddles it and stays
    assert table_files(DeltaTable(path)).column("min.offset").to_pylist() == [10, 20]
    _append(reopened, 5)
    reopened.refresh()
    assert reopened.log_start_offset == 15
    assert reopened.read(15, 1 << 20).num_rows == 20
    reopened.close()
