"""Key compaction (cleanup.policy=compact): below the cleanable end, a partition keeps only the
latest record of each key, as Kafka's log cleaner does. The log cleaner's Spark job calls this on
every replica table (see cluster/log_cleaner.py).

What a Kafka user relies on, and how it holds here:
- Offsets never change. A record keeps its offset; the removed ones leave gaps, and a read from
  inside a gap returns the next record (log_reader.offset_slice). A rewritten file keeps its
  input's offset statistics (the offsets it covered, not the ones left in it): those are still
  true bounds, so range reads stay pruned, the log start and end offsets do not move, and a
  follower copying whole files continues exactly where the file's range ends.
- The cleanable end: never the newest file, nothing at or above the high watermark, and nothing
  from the first file with a record younger than `min.compaction.lag.ms` on.
- A tombstone (null value) stays while it is the latest for its key and younger than
  `delete.retention.ms` (by its timestamp), so consumers that were behind still see the delete.
- Keyless records cannot be compacted and go, as Kafka's cleaner drops them (producers cannot
  write them to a compacted topic: INVALID_RECORD).
- Each idempotent producer's last record in the cleaned range stays, so a broker that rebuilds a
  producer's sequence from the log after a restart still finds it (Kafka keeps each producer's
  last batch for the same reason).
- Transactions: every marker stays (all markers of a kind share one key; a leader rebuilds its
  aborted transactions from them), and the records of aborted transactions go and never hide an
  earlier record of their key, as Kafka's cleaner discards aborted batches. As Kafka's, it
  cleans only below the last stable offset, so an open transaction's record, which may yet be
  aborted, hides nothing: the cleanable end stops at the first offset of the producers the
  caller says have a transaction open (the controller's metadata, as of `open_as_of_ms`) and
  at the first file committed since then (a transaction opened since may be in it).
- As Kafka's `min.cleanable.dirty.ratio`: a table is compacted once the files written since it
  was last compacted (the cleanable end then is kept in the Delta app transaction
  `deltabus.compact`) are at least that share of the cleanable range's bytes.
- The rewrite is one Delta commit of dataChange=false actions, as retention's and the merge's
  (deltabus's own, delta_writes.commit_rewrite; a concurrent compaction of the table conflicts
  on the `deltabus.compact` app transaction and is tried again at the next run):
  an appending broker is not disturbed, readers at older versions still see the old files, and
  the removed files go after `file.delete.delay.ms` (retention.vacuum).
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from deltabus.log_tables.control_records import control_mask
from deltabus.log_tables.delta_commit import DataFile, remove_action, write_data_file
from deltabus.log_tables.delta_writes import (
    cleaner_writer,
    commit_rewrite,
    log_table_schema,
    removal_stamp,
)
from deltabus.log_tables.log_reader import STATE_STATS, data_files, leaf_columns, stats_json
from deltabus.log_tables.transactions import (
    AbortedTxn,
    TransactionState,
    aborted_mask,
    read_transactions,
)
from deltabus.records import LOG_SCHEMA
from deltabus.storage import Storage

_STATS = ["min.offset", "max.offset", "min.timestamp", "max.timestamp", "min.timestamp_type",
          "max.timestamp_type"]
_COLUMNS = ["path", "size_bytes", "modification_time", "num_records", *_STATS, *STATE_STATS]
_SCAN_COLUMNS = ["offset", "timestamp", "key", "producer_id", "sequence"]
CLEANED_TXN_APP_ID = "deltabus.compact"  # Delta app transaction: where the last run stopped


@dataclass(frozen=True)
class Compacted:
    """What compaction did to one replica table."""

    cleanable_end: int  # the first offset it did not look at
    dirty_ratio: float  # the share of the cleanable bytes new since the last compaction
    records_before: int  # in the files it looked at (0: it did not look)
    removed: int  # records removed, tombstones and keyless ones included
    tombstones_removed: int
    files_rewritten: int


def cleanable_end(files: pa.Table, *, now_ms: int, min_lag_ms: int, high_watermark: int) -> int:
    """The first offset compaction leaves alone: the start of the newest file, of the first file
    reaching the high watermark, or of the first file holding a record younger than
    `min_lag_ms`. `files` are `data_files` with max.timestamp, by first offset."""
    if files.num_rows == 0:
        return 0
    firsts = files.column("min.offset").to_pylist()
    lasts = files.column("max.offset").to_pylist()
    newest = _epoch_ms(files.column("max.timestamp")).to_pylist()
    for i in range(files.num_rows - 1):
        young = newest[i] is None or newest[i] > now_ms - min_lag_ms
        if lasts[i] >= high_watermark or young:
            return int(firsts[i])
    return int(firsts[-1])


def _epoch_ms(timestamps: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Timestamps (any unit, with or without a time zone: UTC) as epoch milliseconds."""
    unit = pa.timestamp("ms", tz=getattr(timestamps.type, "tz", None))
    return pc.cast(pc.cast(timestamps, unit), pa.int64())


def retained(records: pa.Table, tombstone: pa.Array, *, now_ms: int,
             delete_retention_ms: int,
             aborted: Sequence[AbortedTxn] = ()) -> tuple[pa.Array, int]:
    """The offsets to keep of `records` (offset, timestamp, key, producer_id and, to tell
    markers, sequence: the whole cleanable range), and how many tombstones go. `tombstone` says
    which records have a null value; `aborted` the aborted transactions, whose records go."""
    index = pa.array(range(records.num_rows), pa.int64())
    table = records.append_column("row", index).append_column("tombstone", tombstone)
    markers = (control_mask(records).to_numpy(zero_copy_only=False)
               if "sequence" in records.column_names else np.zeros(records.num_rows, bool))
    compactable = pa.array(~(markers | aborted_mask(records, aborted)))
    keyed = table.filter(pc.and_(pc.is_valid(table.column("key")), compactable))
    latest = keyed.group_by("key").aggregate([("offset", "max")])
    latest_rows = keyed.join(latest, "key").filter(
        pc.equal(pc.field("offset"), pc.field("offset_max")))
    horizon = pa.scalar(now_ms - delete_retention_ms, pa.int64())
    expired = pc.and_(latest_rows.column("tombstone"),
                      pc.less(_epoch_ms(latest_rows.column("timestamp")), horizon))
    keep = latest_rows.filter(pc.invert(expired)).column("offset")
    produced = table.filter(pc.greater_equal(table.column("producer_id"), 0))
    last_of_producer = produced.group_by("producer_id").aggregate([("offset", "max")])
    keep = pc.unique(pa.chunked_array([keep, last_of_producer.column("offset_max"),
                                       table.filter(pa.array(markers)).column("offset")],
                                      pa.int64()).combine_chunks())
    return keep, int(pc.sum(expired).as_py() or 0)


def _transactions(table: DeltaTable, storage: Storage,
                  open_producers: Sequence[int]) -> TransactionState:
    """The table's aborted transactions, from its markers (every file: a transaction's marker
    may lie past the cleanable end; row groups without markers are skipped by statistics), and
    where the open transactions of `open_producers` begin."""
    def files() -> Iterator[pq.ParquetFile]:
        for path in data_files(table, ["path", "min.offset"]).column("path").to_pylist():
            with storage.open_input(posixpath.join(table.table_uri, path)) as source:
                yield pq.ParquetFile(source)

    return read_transactions(files, open_producers)


def _stable_end(files: pa.Table, first_open_offset: int | None,
                open_as_of_ms: int | None) -> int:
    """Where the last stable offset may be, at most: the first offset of an open transaction,
    or of the first file committed since the open ones were known (`files` by first offset)."""
    end = first_open_offset if first_open_offset is not None else 2**63 - 1
    if open_as_of_ms is not None:
        since = files.filter(pc.greater_equal(files.column("modification_time"), open_as_of_ms))
        if since.num_rows:
            end = min(end, int(pc.min(since.column("min.offset")).as_py()))
    return end


def _may_hold_nulls(reader: pq.ParquetFile, column: str) -> bool:
    """Whether a column of a Parquet file may hold nulls, from its row groups' statistics."""
    index = leaf_columns(reader).get(column)
    if index is None:
        return reader.metadata.num_rows > 0
    for group in range(reader.metadata.num_row_groups):
        stats = reader.metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_null_count or stats.null_count:
            return True
    return False


def dirty_ratio(files: pa.Table, cleaned_end: int) -> float:
    """The share of the bytes of `files` (the cleanable range) at or above `cleaned_end`."""
    total = pc.sum(files.column("size_bytes")).as_py() or 0
    dirty = files.filter(pc.greater_equal(files.column("min.offset"), cleaned_end))
    return (pc.sum(dirty.column("size_bytes")).as_py() or 0) / total if total else 0.0


def compact(table: DeltaTable, *, high_watermark: int, min_lag_ms: int, delete_retention_ms: int,
            delete_delay_ms: int, min_dirty_ratio: float = 0.0,
            now_ms: int | None = None, storage: Storage | None = None,
            open_producers: Sequence[int] = (), open_as_of_ms: int | None = None) -> Compacted:
    """Compact `table` below its cleanable end, if dirty enough: rewrite each file that holds
    records to drop (one commit for all of them, which also records the new cleaned end).
    `storage` reaches its files (by default the table's store, with no options).
    `open_producers` have a transaction open on the partition as of `open_as_of_ms` (None: the
    caller knows no transaction can open, e.g. a test's table)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    storage = storage or Storage(table.table_uri)
    files = data_files(table, _COLUMNS)
    # The markers are read only for a run that compacts, or where a transaction is open
    transactions = _transactions(table, storage, open_producers) if open_producers else None
    end = min(cleanable_end(files, now_ms=now_ms, min_lag_ms=min_lag_ms,
                            high_watermark=high_watermark),
              _stable_end(files, transactions.first_open_offset if transactions else None,
                          open_as_of_ms))
    files = files.filter(pc.less(files.column("max.offset"), end))
    ratio = dirty_ratio(files, table.transaction_version(CLEANED_TXN_APP_ID) or 0)
    if files.num_rows == 0 or ratio == 0 or ratio < min_dirty_ratio:
        return Compacted(end, ratio, 0, 0, 0, 0)
    base = table.table_uri
    paths = files.column("path").to_pylist()
    scans, tombstones = [], []
    for path in paths:  # keys and offsets; values only where a file has tombstones
        with storage.open_input(posixpath.join(base, path)) as source:
            reader = pq.ParquetFile(source)
            part = reader.read(columns=_SCAN_COLUMNS)
            if _may_hold_nulls(reader, "value"):
                tombstones.append(pc.is_null(reader.read(columns=["value"]).column("value")))
            else:
                tombstones.append(pa.chunked_array([pa.repeat(False, part.num_rows)]))
        scans.append(part.cast(pa.schema([LOG_SCHEMA.field(c) for c in _SCAN_COLUMNS])))
    records = pa.concat_tables(scans)
    keep, tombstones_removed = retained(
        records, pa.chunked_array([c for t in tombstones for c in t.chunks], pa.bool_()),
        now_ms=now_ms, delete_retention_ms=delete_retention_ms,
        aborted=(transactions or _transactions(table, storage, ())).aborted)
    stamp = removal_stamp(now_ms, delete_delay_ms)
    schema = log_table_schema(table)  # a typed table's columns are kept too
    writer = cleaner_writer(table, storage)
    adds: list[DataFile] = []
    removes: list[dict[str, Any]] = []
    for i, path in enumerate(paths):
        if len(keep) == records.num_rows or pc.all(pc.is_in(scans[i].column("offset"),
                                                            keep)).as_py():
            continue
        row = {name: files.column(name)[i].as_py() for name in files.column_names}
        data = storage.read_parquet(posixpath.join(base, path), schema)
        data = data.filter(pc.is_in(data.column("offset"), keep)).sort_by("offset")
        name, size = write_data_file(storage, base, data, "compacted")
        adds.append(DataFile(name, size, kept_range_stats(row, data.num_rows),
                             data_change=False))
        removes.append(remove_action(path, row["size_bytes"], stamp, data_change=False))
    # Also when nothing went: the range is clean, and the next run need not read it again.
    # The cleaned end's app transaction makes a concurrent compaction of the table conflict.
    commit_rewrite(writer, adds=adds, removes=removes, txns={CLEANED_TXN_APP_ID: end},
                   info={"deltabus.operation": "compact", "deltabus.cleanableEnd": str(end),
                         "deltabus.removedRecords": str(records.num_rows - len(keep))})
    return Compacted(end, ratio, records.num_rows, records.num_rows - len(keep),
                     tombstones_removed, len(adds))


def kept_range_stats(row: dict[str, Any], records: int) -> str:
    """Delta statistics for a rewritten file: its input's bounds (offsets, timestamps), which
    still hold, with the records left in it."""
    return stats_json({**row, "num_records": records, "null_count.offset": 0,
                       "null_count.timestamp": 0, "null_count.timestamp_type": 0})
