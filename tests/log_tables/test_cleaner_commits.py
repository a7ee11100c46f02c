"""The log cleaner's commits (retention, merge, compaction) through deltabus's commit writer:
they win a version beside a broker appending as fast as it can from another process, keep their
actions' dataChange=false, statistics and provenance, and a commit that conflicts with one made
since its table was read (the same files removed, the same app transaction set, the schema
changed) commits nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltabus.log_tables.appender import LOG_TXN_APP_ID
from deltabus.log_tables.compaction import CLEANED_TXN_APP_ID, compact
from deltabus.log_tables.delta_commit import CommitConflict, DeltaCommitWriter, commit_file
from deltabus.log_tables.delta_reads import open_table
from deltabus.log_tables.merge import merge_small_files
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.log_tables.retention import remove_below, vacuum
from deltabus.records import normalize_produce, produce_batch
from deltabus.storage import Storage

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000


def _log_of(path: Path, commits: int) -> PartitionLog:
    log = PartitionLog(str(path), topic="t", partition=0)
    for c in range(commits):
        batch = normalize_produce(produce_batch([f"v{c}-{i}".encode() for i in range(5)],
                                                keys=[f"k{i}".encode() for i in range(5)]))
        log.append(batch, leader_epoch=0).result(30)
    return log


def _merged_files(path: Path) -> list[str]:
    return [n for n in os.listdir(path) if ".merged." in n]


def test_the_cleaner_wins_its_versions_beside_another_process_appending(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log_of(path, 30).close()
    before = PartitionLog(str(path), topic="t", partition=0)
    written = before.read(0, 1 << 30)
    before.close()
    appender = subprocess.Popen(
        [sys.executable, "-m", "tests.log_tables.appending_process", str(path)], cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert appender.stdout is not None and appender.stdin is not None
        assert appender.stdout.readline().strip() == "appending"
        started = time.monotonic()
        # each prepared from the version it read, appends behind by the time it commits
        # (loaded as the cleaner loads them: a listing may miss a commit landing meanwhile)
        removed = remove_below(open_table(str(path)), 20, delete_delay_ms=0)
        compacted = compact(open_table(str(path)), high_watermark=150, min_lag_ms=0,
                            delete_retention_ms=HOUR_MS, delete_delay_ms=0)
        merged = merge_small_files(open_table(str(path)), target_bytes=1 << 20, min_age_ms=0,
                                   high_watermark=150, delete_delay_ms=0)
        # the files all three removed (delay 0) go while the appends go on: no commit to win
        vacuumed = vacuum(open_table(str(path)))
        elapsed = time.monotonic() - started
        appender.stdin.close()
        acknowledged = int(appender.stdout.readline())
        assert appender.wait(60) == 0
    finally:
        if appender.poll() is None:
            appender.kill()
    assert removed.files == 4 and compacted.files_rewritten > 0 and merged.merged_files > 1
    assert vacuumed >= removed.files + compacted.files_rewritten + merged.merged_files
    live = pa.table(open_table(str(path)).get_add_actions()).column("path").to_pylist()
    assert all((path / f).exists() for f in live)  # none of the live files went
    print(f"\nretention, compaction and merge beside {acknowledged} appends from another "
          f"process: {elapsed:.2f} s")
    assert elapsed < 60, f"the cleaner's three commits took {elapsed:.0f} s"
    log = PartitionLog(str(path), topic="t", partition=0)
    try:
        records = log.read(20, 1 << 30)
        # what compaction left of the first 150 (the latest of each key, at its offset), then
        # every acknowledged append once, in order
        offsets = records.column("offset").to_pylist()
        assert offsets == sorted(offsets)
        kept = records.filter(pa.compute.less(records.column("offset"), 150))
        assert kept.column("offset").to_pylist() == list(range(145, 150))
        assert kept.equals(written.slice(145, 5).cast(kept.schema))
        assert log.log_end_offset == 150 + acknowledged
        appended = records.filter(pa.compute.greater_equal(records.column("offset"), 150))
        assert appended.column("value").to_pylist() == [f"p-{i}".encode()
                                                      for i in range(acknowledged)]
    finally:
        log.close()


def test_rewrites_keep_data_change_false_statistics_and_provenance(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log_of(path, 10).close()
    merged = merge_small_files(DeltaTable(str(path)), target_bytes=1 << 20, min_age_ms=0,
                               high_watermark=50, delete_delay_ms=0)
    assert merged.merged_files == 9
    table = DeltaTable(str(path))
    entry = table.history(1)[0]
    assert entry["deltabus.operation"] == "merge" and entry["deltabus.mergedFiles"] == "9"
    assert entry["operationMetrics"]["num_removed_files"] == 9
    assert entry["operationMetrics"]["num_added_rows"] == 45
    adds = pa.table(table.get_add_actions(flatten=True)).sort_by("min.offset").to_pylist()
    assert (adds[0]["min.offset"], adds[0]["max.offset"], adds[0]["num_records"]) == (0, 44, 45)
    actions = [json.loads(line) for line in Path(commit_file(
        str(path), table.version())).read_text().splitlines()]
    assert [a["add"]["dataChange"] for a in actions if "add" in a] == [False]
    removes = [a["remove"] for a in actions if "remove" in a]
    assert len(removes) == 9
    assert all(r["dataChange"] is False and r["size"] > 0 and r["deletionTimestamp"] > 0
               for r in removes)


def test_a_merge_of_files_another_merge_removed_commits_nothing(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log_of(path, 10).close()
    first, second = DeltaTable(str(path)), DeltaTable(str(path))  # both read the same version
    merge_small_files(first, target_bytes=1 << 20, min_age_ms=0, high_watermark=50,
                      delete_delay_ms=0)
    version = DeltaTable(str(path)).version()
    with pytest.raises(CommitConflict, match="removed"):
        merge_small_files(second, target_bytes=1 << 20, min_age_ms=0, high_watermark=50,
                          delete_delay_ms=0)
    assert DeltaTable(str(path)).version() == version
    assert len(_merged_files(path)) == 1  # the loser's file is gone, not left for vacuum
    log = PartitionLog(str(path), topic="t", partition=0)
    assert log.read(0, 1 << 30).column("offset").to_pylist() == list(range(50))
    log.close()


def test_compactions_conflict_on_the_cleaned_end_and_schema_changes_stop_rewrites(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log_of(path, 3).close()
    storage = Storage(str(path))
    first = DeltaCommitWriter(storage, str(path), 3)
    second = DeltaCommitWriter(storage, str(path), 3)
    third = DeltaCommitWriter(storage, str(path), 3)
    assert first.commit(txns={CLEANED_TXN_APP_ID: 10}) == 4
    with pytest.raises(CommitConflict, match=CLEANED_TXN_APP_ID):
        second.commit(txns={CLEANED_TXN_APP_ID: 12})
    assert third.commit(txns={"another.app": 1}) == 5  # compatible: after the one it lost to
    assert DeltaTable(str(path)).transaction_version(CLEANED_TXN_APP_ID) == 10

    table = DeltaTable(str(path))
    evolved = pa.table(table.to_pyarrow_table()).slice(0, 1).append_column(
        "extra", pa.array([1], pa.int64()))
    cleaner = DeltaCommitWriter(storage, str(path), table.version())
    write_deltalake(table, evolved, mode="append", schema_mode="merge")
    with pytest.raises(CommitConflict, match="schema"):
        cleaner.commit(txns={CLEANED_TXN_APP_ID: 11})


def test_an_append_is_fenced_by_another_writer_of_the_log(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log_of(path, 2).close()
    storage = Storage(str(path))
    other = DeltaCommitWriter(storage, str(path), 2)
    other.commit(txns={LOG_TXN_APP_ID: 20})
    writer = DeltaCommitWriter(storage, str(path), 2, fence_app_id=LOG_TXN_APP_ID)
    with pytest.raises(Exception, match="another writer of this log"):
        writer.commit(txns={LOG_TXN_APP_ID: 15})
