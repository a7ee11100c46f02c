"""Key compaction on real Delta tables: the latest record per key stays at its offset, the log
start and end offsets do not move, reads from inside a gap get the next record, tombstones and
keyless records go when they should, and followers copying compacted files or gapped records
hold the same log."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.log_tables.compaction import cleanable_end, compact, retained
from deltabus.log_tables.delta_reads import open_table
from deltabus.log_tables.log_reader import LogReader
from deltabus.log_tables.merge import merge_small_files
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.records import ProducerState, normalize_produce, produce_batch

NOW_MS = 1_800_000_000_000
HOUR_MS = 3_600_000


def _append(log: PartitionLog, keys: list[bytes | None], values: list[bytes | None],
            timestamp_ms: int | None = None, producer: ProducerState | None = None) -> None:
    batch = normalize_produce(produce_batch(values, keys=keys,
                                            timestamps_ms=[timestamp_ms] * len(values)))
    kwargs = {} if producer is None else {"producer": producer}
    log.append(batch, leader_epoch=0, **kwargs).result(30)


def _latest(records: pa.Table) -> dict[bytes, tuple[int, bytes | None]]:
    """key -> (offset, value) of the last record of each key, as a consumer ends up with."""
    out: dict[bytes, tuple[int, bytes | None]] = {}
    for row in records.select(["offset", "key", "value"]).to_pylist():
        out[row["key"]] = (row["offset"], row["value"])
    return out


def test_retained_keeps_the_latest_per_key_recent_tombstones_and_each_producers_last() -> None:
    old, recent = NOW_MS - 2 * HOUR_MS, NOW_MS - 1000
    records = pa.table({
        "offset": pa.array([0, 1, 2, 3, 4, 5, 6, 7], pa.int64()),
        "timestamp": pa.array([1000 * t for t in (old, old, old, old, recent, old, old, recent)],
                              pa.timestamp("us", tz="UTC")),
        "key": pa.array([b"a", b"b", b"a", b"b", b"c", None, b"d", b"a"], pa.binary()),
        "producer_id": pa.array([-1, -1, 7, -1, -1, -1, 7, -1], pa.int64()),
    })
    tombstone = pa.array([False, False, False, True, True, False, True, False])
    keep, tombstones_removed = retained(records, tombstone, now_ms=NOW_MS,
                                        delete_retention_ms=HOUR_MS)
    # a: 7 is the latest; b: its tombstone (3) is past delete.retention.ms; c: the recent
    # tombstone stays; the keyless record goes; producer 7's last record (6) stays although it
    # is an expired tombstone; 2 was producer 7's but not its last
    assert sorted(keep.to_pylist()) == [4, 6, 7]
    assert tombstones_removed == 2  # 3 and 6 were due (6 is kept for its producer)


def _files(firsts: list[int], lasts: list[int], newest_ms: list[int]) -> pa.Table:
    return pa.table({"min.offset": firsts, "max.offset": lasts,
                     "max.timestamp": pa.array(newest_ms, pa.timestamp("ms"))})


def test_the_cleanable_end_stops_at_the_newest_file_the_high_watermark_and_young_records() -> None:
    files = _files([0, 10, 20, 30], [9, 19, 29, 39], [NOW_MS - HOUR_MS] * 4)
    assert cleanable_end(files, now_ms=NOW_MS, min_lag_ms=0, high_watermark=40) == 30
    assert cleanable_end(files, now_ms=NOW_MS, min_lag_ms=0, high_watermark=25) == 20
    young = _files([0, 10, 20, 30], [9, 19, 29, 39],
                   [NOW_MS - HOUR_MS, NOW_MS - 1000, NOW_MS - HOUR_MS, NOW_MS])
    assert cleanable_end(young, now_ms=NOW_MS, min_lag_ms=60_000, high_watermark=40) == 10
    assert cleanable_end(young, now_ms=NOW_MS, min_lag_ms=0, high_watermark=40) == 30


def _keyed_log(tmp_path: Path, name: str = "leader") -> PartitionLog:
    """20 commits of 10 updates each to keys k0..k9, then the newest commit; keys k0 and k1
    deleted (tombstones) in commit 19."""
    log = PartitionLog(str(tmp_path / name), topic="t", partition=0)
    for c in range(19):
        _append(log, [f"k{i}".encode() for i in range(10)],
                [f"v{c}-{i}".encode() for i in range(10)])
    _append(log, [b"k0", b"k1"], [None, None])
    _append(log, [b"k9"], [b"newest"])  # the newest file: never compacted
    return log


def test_compaction_keeps_the_latest_value_per_key_at_its_offset(tmp_path: Path) -> None:
    log = _keyed_log(tmp_path)
    before = log.read(0, 1 << 30)
    end_before = log.log_end_offset
    result = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                     delete_retention_ms=HOUR_MS, delete_delay_ms=0)
    assert result.cleanable_end == 192 and result.records_before == 192
    assert result.removed == 182 and result.files_rewritten == 19 and result.tombstones_removed == 0
    log.refresh()
    after = log.read(0, 1 << 30)
    assert _latest(after) == _latest(before)  # what a consumer ends up with is unchanged
    assert after.column("offset").to_pylist() == [*range(182, 190), 190, 191, 192]
    assert after.column("key").to_pylist()[:2] == [b"k2", b"k3"]
    # The log's bounds stay where they were, reopened too, and a read from inside the gap
    # gets the next record.
    reopened = PartitionLog(log.path, topic="t", partition=0)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, end_before)
    assert reopened.read(50, 1 << 30).column("offset")[0].as_py() == 182
    assert LogReader(log.path).log_start_offset == 0
    reopened.close()
    log.close()


def test_compaction_waits_until_the_dirty_share_reaches_min_cleanable_dirty_ratio(
        tmp_path: Path) -> None:
    log = _keyed_log(tmp_path)
    first = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                    delete_retention_ms=HOUR_MS, delete_delay_ms=0, min_dirty_ratio=0.5)
    assert first.dirty_ratio == 1.0 and first.removed == 182  # never compacted: all dirty
    for c in range(3):  # a little new data: below half of the cleanable bytes
        _append(log, [b"k2"], [f"again{c}".encode()])
    waits = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                    delete_retention_ms=HOUR_MS, delete_delay_ms=0, min_dirty_ratio=0.5)
    assert 0 < waits.dirty_ratio < 0.5 and waits.records_before == 0 and waits.removed == 0
    runs = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                   delete_retention_ms=HOUR_MS, delete_delay_ms=0, min_dirty_ratio=0.0)
    assert runs.removed == 3  # k2 at 182 and again0; k9 at 189 (its newest is cleanable now)
    again = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                    delete_retention_ms=HOUR_MS, delete_delay_ms=0, min_dirty_ratio=0.0)
    assert again.dirty_ratio == 0 and again.records_before == 0  # clean: not read again
    log.close()


def test_tombstones_go_after_delete_retention_and_records_stay_until_min_lag(
        tmp_path: Path) -> None:
    log = _keyed_log(tmp_path)
    young = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=HOUR_MS,
                    delete_retention_ms=0, delete_delay_ms=0)
    assert young.cleanable_end == 0 and young.removed == 0  # every record is younger than 1 h
    compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
            delete_retention_ms=0, delete_delay_ms=0, now_ms=int(time.time() * 1000) + 1000)
    log.refresh()
    keys = log.read(0, 1 << 30).column("key").to_pylist()
    assert b"k0" not in keys and b"k1" not in keys  # deleted: tombstones and all
    assert sorted(keys) == sorted([f"k{i}".encode() for i in range(2, 10)] + [b"k9"])
    log.close()


def test_a_compacted_topic_refuses_keyless_records_and_keeps_what_it_has(tmp_path: Path) -> None:
    log = PartitionLog(str(tmp_path / "l"), topic="t", partition=0)
    _append(log, [b"a"], [b"1"])
    batch = normalize_produce(produce_batch([b"2", b"3", b"4", b"5"],
                                            keys=[b"b", None, b"c", None]))
    with pytest.raises(errors.InvalidRecordError, match="Compacted topic cannot accept message "
                       "without key in topic partition t-0") as refused:
        log.append(batch, leader_epoch=0, compacted=True)
    # Each keyless record is named by its index in the batch (KIP-467); none is written.
    assert refused.value.record_errors == tuple(errors.RecordError(
        i, "Compacted topic cannot accept message without key in topic partition t-0.")
        for i in (1, 3))
    assert log.read(0, 1 << 30).column("value").to_pylist() == [b"1"]
    log.close()


def test_followers_copy_compacted_files_and_gapped_records_into_the_same_log(
        tmp_path: Path) -> None:
    leader = _keyed_log(tmp_path)
    compact(DeltaTable(leader.path), high_watermark=leader.high_watermark, min_lag_ms=0,
            delete_retention_ms=HOUR_MS, delete_delay_ms=0)
    leader.refresh()
    expected = leader.read(0, 1 << 30, to_log_end=True)
    by_files = PartitionLog(str(tmp_path / "by-files"), topic="t", partition=0, replicated=True)
    while by_files.log_end_offset < leader.log_end_offset:
        files = leader.files_from(by_files.log_end_offset, 1 << 30)
        assert files, f"no whole files from {by_files.log_end_offset}"
        by_files.append_files(files).result(30)
    by_records = PartitionLog(str(tmp_path / "by-records"), topic="t", partition=0,
                              replicated=True)
    while by_records.log_end_offset < leader.log_end_offset:
        fetch_offset = by_records.log_end_offset
        by_records.append_copy(leader.read(fetch_offset, 1000, to_log_end=True),
                               fetch_offset).result(30)
    gapped = leader.read(0, 1 << 30, to_log_end=True)  # starts at 182
    strict = PartitionLog(str(tmp_path / "strict"), topic="t", partition=0, replicated=True)
    with pytest.raises(errors.InvalidRecordError, match="continues at 0"):
        strict.append_copy(gapped).result(30)  # not the answer to a read from 0
    strict.close()
    for follower in (by_files, by_records):
        assert follower.read(0, 1 << 30, to_log_end=True).equals(expected)
        assert follower.log_end_offset == leader.log_end_offset
        follower.close()
    leader.close()


def test_compaction_and_merging_run_while_the_log_appends(tmp_path: Path) -> None:
    log = _keyed_log(tmp_path)
    stop = threading.Event()
    appended: list[int] = []

    def keep_appending() -> None:
        while not stop.is_set():
            _append(log, [b"k5"], [f"late{len(appended)}".encode()])
            appended.append(1)

    writer = threading.Thread(target=keep_appending)
    writer.start()
    try:
        # loaded as the cleaner loads them: a listing may miss a commit landing meanwhile
        compact(open_table(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                delete_retention_ms=HOUR_MS, delete_delay_ms=0)
        merged = merge_small_files(open_table(log.path), target_bytes=1 << 20, min_age_ms=0,
                                   high_watermark=log.high_watermark, delete_delay_ms=0)
    finally:
        stop.set()
        writer.join()
    assert appended and merged.merged_files > 1
    log.refresh()
    records = log.read(0, 1 << 30)
    offsets = records.column("offset").to_pylist()
    assert offsets == sorted(offsets) and offsets[0] == 182
    assert offsets[-1] == log.log_end_offset - 1
    assert records.column("value").to_pylist()[-1] == f"late{len(appended) - 1}".encode()
    reopened = PartitionLog(log.path, topic="t", partition=0)
    assert reopened.log_start_offset == 0  # the merged file still covers the compacted range
    assert reopened.read(0, 1 << 30).equals(records)
    reopened.close()
    log.close()


def test_compaction_keeps_markers_and_drops_aborted_records_which_hide_nothing(tmp_path) -> None:
    log = PartitionLog(str(tmp_path / "log"), topic="t", partition=0)
    _append(log, [b"k"], [b"v1"])  # 0: committed (no transaction)
    _append(log, [b"k"], [b"v2"], producer=ProducerState(7, 0, 0, transactional=True))  # 1
    log.append_marker(7, 0, committed=False, coordinator_epoch=0, leader_epoch=0).result(30)  # 2
    _append(log, [b"l"], [b"w1"], producer=ProducerState(8, 0, 0, transactional=True))  # 3
    log.append_marker(8, 0, committed=True, coordinator_epoch=0, leader_epoch=0).result(30)  # 4
    _append(log, [b"l"], [b"w2"])  # 5
    _append(log, [b"z"], [b"last"])  # 6: the newest file is never cleaned
    compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
            delete_retention_ms=HOUR_MS, delete_delay_ms=0)
    log.refresh()
    # k's committed v1 stays (the aborted v2 goes and hides nothing); l's w1 is hidden by w2;
    # both markers stay, and a leader rebuilding its state still finds the aborted one.
    assert log.read(0, 1 << 30).column("offset").to_pylist() == [0, 2, 4, 5, 6]
    reopened = PartitionLog(log.path, topic="t", partition=0)
    assert [(a.producer_id, a.first_offset, a.last_offset)
            for a in reopened.aborted_transactions(0, 7)] == [(7, 1, 2)]
    reopened.close()
    log.close()


def test_compaction_stays_below_an_open_transaction_which_may_yet_abort(tmp_path) -> None:
    log = PartitionLog(str(tmp_path / "log"), topic="t", partition=0)
    _append(log, [b"k"], [b"v1"])  # 0: committed (no transaction)
    _append(log, [b"k"], [b"v2"], producer=ProducerState(7, 0, 0, transactional=True))  # 1
    _append(log, [b"l"], [b"w"])  # 2
    _append(log, [b"z"], [b"last"])  # 3: the newest file is never cleaned
    result = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                     delete_retention_ms=HOUR_MS, delete_delay_ms=0, open_producers=[7])
    assert result.cleanable_end == 1  # the last stable offset: 7's transaction is open
    log.append_marker(7, 0, committed=False, coordinator_epoch=0, leader_epoch=0).result(30)
    _append(log, [b"z"], [b"later"])
    compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
            delete_retention_ms=HOUR_MS, delete_delay_ms=0)
    log.refresh()
    # 7 aborted: its v2 goes, and k's v1, which v2 never replaced, is still there to read
    assert log.read(0, 1 << 30).column("offset").to_pylist() == [0, 2, 3, 4, 5]
    log.close()


def _next_millisecond(after_ms: int) -> int:
    """Waits until the clock reads a millisecond past `after_ms`; returns it."""
    while (now_ms := int(time.time() * 1000)) <= after_ms:
        time.sleep(0.001)
    return now_ms


def test_compaction_leaves_files_committed_since_the_open_transactions_were_known(
        tmp_path) -> None:
    log = PartitionLog(str(tmp_path / "log"), topic="t", partition=0)
    _append(log, [b"k"], [b"v1"])  # 0
    committed_ms = int(time.time() * 1000)
    # a commit takes under a millisecond: the metadata is read in a later one than file 0's
    # (a file stamped in the very millisecond the metadata was read counts as committed since)
    open_as_of_ms = _next_millisecond(committed_ms)  # the controller's metadata: nothing open
    _next_millisecond(open_as_of_ms)  # the next file is committed after it
    # 1: a transaction that opened after the metadata was read
    _append(log, [b"k"], [b"v2"], producer=ProducerState(9, 0, 0, transactional=True))
    _append(log, [b"l"], [b"w"])  # 2
    _append(log, [b"z"], [b"last"])  # 3
    result = compact(DeltaTable(log.path), high_watermark=log.high_watermark, min_lag_ms=0,
                     delete_retention_ms=HOUR_MS, delete_delay_ms=0, open_as_of_ms=open_as_of_ms)
    assert result.cleanable_end == 1
    log.refresh()
    assert log.read(0, 1 << 30).column("offset").to_pylist() == [0, 1, 2, 3]
    log.close()
