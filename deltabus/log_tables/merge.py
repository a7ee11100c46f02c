"""Small-file compaction: a partition table grows a data file per group commit, and a table of
thousands of small files opens and reads slowly. The log cleaner's Spark job merges runs of
adjacent small files, once they are old enough, into files of up to `segment.bytes`, on every
replica table (see cluster/log_cleaner.py).

What must stay true: the same records at the same offsets, in offset order inside each merged
file, with row groups of bounded size and per-file offset statistics, so range reads stay pruned
and followers can still copy whole files. The rewrite is one Delta commit (deltabus's own,
delta_writes.commit_rewrite) that adds the merged file and removes its inputs, marked
dataChange=false (the data did not change: readers at any version see the same records, and an
appending broker is not disturbed). Nothing at or above the high
watermark and never the newest file is touched. The inputs go from disk after
`file.delete.delay.ms` (retention.vacuum).
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from deltabus.log_tables.delta_commit import DataFile, remove_action, write_data_file
from deltabus.log_tables.delta_writes import (
    cleaner_writer,
    commit_rewrite,
    log_table_schema,
    removal_stamp,
)
from deltabus.log_tables.log_reader import STATE_STATS, data_files, stats_json
from deltabus.storage import Storage

_COLUMNS = ["path", "size_bytes", "num_records", "min.offset", "max.offset", "modification_time",
            "min.timestamp", "max.timestamp", "min.timestamp_type", "max.timestamp_type",
            *STATE_STATS]


@dataclass(frozen=True)
class Merged:
    """What merging did to one replica table."""

    files_before: int
    files_after: int
    merged_files: int  # inputs rewritten
    records: int  # records rewritten


def merge_runs(files: pa.Table, *, target_bytes: int, min_age_ms: int, now_ms: int,
               high_watermark: int) -> list[list[int]]:
    """Indexes (into `files`, sorted by first offset) of the runs to merge, each into one file:
    adjacent files each smaller than half of `target_bytes`, older than `min_age_ms`, below the
    high watermark and not the newest file, packed in order up to `target_bytes`."""
    sizes = files.column("size_bytes").to_pylist()
    firsts = files.column("min.offset").to_pylist()
    lasts = files.column("max.offset").to_pylist()
    modified = files.column("modification_time").to_pylist()
    runs: list[list[int]] = []
    run: list[int] = []
    run_bytes = 0
    for i in range(files.num_rows - 1):
        eligible = (sizes[i] < target_bytes // 2 and lasts[i] < high_watermark
                    and _ms(modified[i]) <= now_ms - min_age_ms)
        adjacent = bool(run) and firsts[i] > lasts[run[-1]]
        if not eligible or (run and (not adjacent or run_bytes + sizes[i] > target_bytes)):
            if len(run) > 1:
                runs.append(run)
            run, run_bytes = [], 0
        if eligible:
            run.append(i)
            run_bytes += sizes[i]
    if len(run) > 1:
        runs.append(run)
    return runs


def _stats_row(inputs: pa.Table, records: int) -> dict[str, Any]:
    """What `stats_json` reads from an add action, for a merged file: its inputs' bounds (a
    compacted input's offsets bound the range it covers, not only the records left in it, see
    compaction.py), with the records it holds."""
    row: dict[str, Any] = {"num_records": records}
    for column in ("offset", "timestamp", "timestamp_type"):
        row[f"min.{column}"] = pc.min(inputs.column(f"min.{column}")).as_py()
        row[f"max.{column}"] = pc.max(inputs.column(f"max.{column}")).as_py()
        row[f"null_count.{column}"] = 0
    for column in ("producer_id", "leader_epoch"):  # bounds only where every input has them
        if inputs.column(f"min.{column}").null_count == 0:
            row[f"min.{column}"] = pc.min(inputs.column(f"min.{column}")).as_py()
            row[f"max.{column}"] = pc.max(inputs.column(f"max.{column}")).as_py()
    return row


def _ms(value: Any) -> int:
    """A modification time from the add actions (a timestamp or epoch milliseconds)."""
    if isinstance(value, int):
        return value
    return int(value.timestamp() * 1000)


def merge_small_files(table: DeltaTable, *, target_bytes: int, min_age_ms: int,
                      high_watermark: int, delete_delay_ms: int,
                      now_ms: int | None = None, storage: Storage | None = None) -> Merged:
    """Merge `table`'s runs of small files (`merge_runs`), one commit per merged file.
    `storage` reaches its files (by default the table's store, with no options)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    files = data_files(table, _COLUMNS)
    runs = merge_runs(files, target_bytes=target_bytes, min_age_ms=min_age_ms, now_ms=now_ms,
                      high_watermark=high_watermark)
    storage = storage or Storage(table.table_uri)
    base = table.table_uri
    merged = records = 0
    schema = log_table_schema(table)  # a typed table's columns are merged too
    writer = cleaner_writer(table, storage)
    for run in runs:
        inputs = files.take(run)
        paths = inputs.column("path").to_pylist()
        data = pa.concat_tables(
            storage.read_parquet(posixpath.join(base, p), schema)
            for p in paths).sort_by("offset")
        name, size = write_data_file(storage, base, data, "merged")
        # the inputs are vacuumed file.delete.delay.ms from now, as retention's removals
        stamp = removal_stamp(now_ms, delete_delay_ms)
        commit_rewrite(
            writer,
            adds=[DataFile(name, size, stats_json(_stats_row(inputs, data.num_rows)),
                           data_change=False)],
            removes=[remove_action(p, s, stamp, data_change=False) for p, s in zip(
                paths, inputs.column("size_bytes").to_pylist(), strict=True)],
            info={"deltabus.operation": "merge",
                  "deltabus.baseOffset": str(inputs.column("min.offset")[0]),
                  "deltabus.mergedFiles": str(len(paths))})
        merged += len(paths)
        records += data.num_rows
    return Merged(files.num_rows, files.num_rows - merged + len(runs), merged, records)
