"""Reading offset ranges of a partition table straight from its Delta files.

Two readers need this: a broker serving fetches of older ranges (`PartitionLog`), and Spark's
executors reading a topic with no broker in the data path (`deltabus.spark`). Both find the data
files of a committed version from delta-rs's add actions and their offset statistics, then read
only the Parquet row groups whose own statistics overlap the range. The tables use no deletion
vectors or column mapping, so the data files are the table.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from deltabus.log_tables.control_records import cannot_hold_markers
from deltabus.log_tables.delta_reads import open_table
from deltabus.records import LOG_SCHEMA
from deltabus.storage import Storage

# The Delta app transaction holding the log start offset DeleteRecords recorded (Kafka's
# persisted logStartOffset): checkpoints keep it, so it survives restarts and is cheap to read.
LOG_START_TXN_APP_ID = "deltabus.logStart"
# Columns of delta-rs's flattened add actions a reader needs (offsets first).
FILE_COLUMNS = ["path", "min.offset", "max.offset", "size_bytes", "num_records"]
# The columns a log's files carry statistics for (`delta.dataSkippingStatsColumns`): offsets
# and timestamps for readers' pruning; producer ids and leader epochs so that a log opens from
# the add actions alone (leader epochs, the producer id bound) instead of reading the footer
# of each of its files, a round trip each on an object store. Files of tables created before
# them carry the first three only, and their footers are read.
STATS_COLUMNS = ("offset", "timestamp", "timestamp_type", "producer_id", "leader_epoch")
# The add actions' statistics of the producer ids and leader epochs (null where a file has none)
STATE_STATS = ["min.producer_id", "max.producer_id", "min.leader_epoch", "max.leader_epoch"]
# The columns that tell a transaction marker from a record (control_records.control_mask).
TRANSACTION_COLUMNS = ("producer_id", "sequence")


def data_files(table: DeltaTable, columns: list[str] | None = None) -> pa.Table:
    """The committed data files of `table`'s loaded version, by first offset. A statistic
    the table keeps for none of its files (STATE_STATS of an older table) is all nulls."""
    actions = pa.table(table.get_add_actions(flatten=True))
    for name in columns or ():
        if name not in actions.column_names:
            actions = actions.append_column(name, pa.nulls(actions.num_rows, pa.int64()))
    return actions.select(columns or FILE_COLUMNS).sort_by("min.offset")


def files_overlapping(files: pa.Table, start: int, end: int) -> pa.Table:
    """The rows of `data_files` that may hold offsets in [start, end)."""
    mask = pc.and_(pc.greater_equal(files.column("max.offset"), start),
                   pc.less(files.column("min.offset"), end))
    return files.filter(mask)


def overlapping_row_groups(metadata: pq.FileMetaData, start: int, end: int
                           ) -> list[tuple[int, int]]:
    """(first offset, index) of the row groups of one data file whose offset statistics
    overlap [start, end), by first offset. delta-rs may interleave a file's rows across its
    row groups (a later group holding earlier offsets), so file order is not offset order; in
    this order, once the groups before one are read, so is every offset below its first."""
    groups = []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(0).statistics  # offset
        if stats is None or not stats.has_min_max:
            groups.append((start, group))  # its range is unknown: read it among the first
        elif stats.max >= start and stats.min < end:
            groups.append((stats.min, group))
    return sorted(groups)


def read_row_group(reader: pq.ParquetFile, group: int,
                   columns: list[str] | None = None, typed: bool = False) -> pa.Table:
    """One row group, whole, as LOG_SCHEMA's types (files a truncation rewrote may differ).
    `typed`: with the typed columns a typed topic's file holds after them (records.VALUE_FIELDS,
    what a follower copies), as they were written."""
    schema = LOG_SCHEMA if columns is None else pa.schema([LOG_SCHEMA.field(c) for c in columns])
    extra = ([n for n in reader.schema_arrow.names if n not in LOG_SCHEMA.names]
             if typed else [])
    part = reader.read_row_group(group, columns=[*schema.names, *extra])
    log = part.select(schema.names) if extra else part
    if not log.schema.equals(schema):
        log = log.cast(schema)
    if not extra:
        return log
    return pa.Table.from_arrays(
        log.columns + [part.column(n) for n in extra],
        schema=pa.schema(list(schema) + [part.schema.field(n) for n in extra]))


def disjoint_row_groups(metadata: pq.FileMetaData, groups: list[tuple[int, int]]) -> bool:
    """Whether `groups` (overlapping_row_groups' list) hold disjoint offset ranges, each
    above the one before, by their statistics: then each group can be read and sliced alone."""
    last = None
    for _, group in groups:
        stats = metadata.row_group(group).column(0).statistics  # offset
        if stats is None or not stats.has_min_max or (last is not None and stats.min <= last):
            return False
        last = stats.max
    return True


def leaf_columns(reader: pq.ParquetFile) -> dict[str, int]:
    """Parquet leaf column index by top-level name (for the flat columns whose statistics we
    use; nested ones such as headers have several leaves)."""
    meta = reader.metadata.row_group(0) if reader.metadata.num_row_groups else None
    if meta is None:
        return {}
    return {meta.column(i).path_in_schema: i for i in range(meta.num_columns)}


def offset_slice(parts: list[pa.Table], start: int, end: int) -> pa.Table:
    """Records [start, end) of `parts`, in offset order (delta-rs may write the rows of a file
    in any order, so they are sorted when they are not already)."""
    if not parts:
        return LOG_SCHEMA.empty_table()
    same = all(p.schema.equals(parts[0].schema) for p in parts[1:])
    # A typed topic's files: a file written before an evolution lacks the newer fields.
    table = pa.concat_tables(parts, promote_options="none" if same else "permissive")
    offsets = table.column("offset").to_numpy()
    if offsets.size > 1 and not (np.diff(offsets) > 0).all():
        table = table.sort_by("offset")
        offsets = table.column("offset").to_numpy()
    lo, hi = np.searchsorted(offsets, [start, end])
    return table.slice(int(lo), int(hi - lo))


class LogReader:
    """A read-only view of one partition replica's table, at its newest committed version."""

    def __init__(self, path: str, storage: Storage | None = None) -> None:
        """`storage` reaches the table's root (by default `path`'s store, with no options)."""
        self.path = path
        self._storage = storage or Storage(path)
        self._table = open_table(path, storage_options=self._storage.delta_options)
        self._files = data_files(self._table)
        # The log start offset DeleteRecords recorded (the appender's LOG_START_TXN_APP_ID).
        self._recorded_start = self._table.transaction_version(LOG_START_TXN_APP_ID) or 0

    @property
    def version(self) -> int:
        return self._table.version()

    @property
    def log_start_offset(self) -> int | None:
        """The first offset the log holds (None when the table has no files): retention and
        DeleteRecords move it up, compaction does not (it leaves gaps inside the range)."""
        if self._files.num_rows == 0:
            return None
        first = int(self._files.column("min.offset")[0].as_py())
        last = int(self._files.column("max.offset")[-1].as_py())
        return min(max(first, self._recorded_start), last + 1)

    def parquet_files(self, start: int = 0) -> Iterator[pq.ParquetFile]:
        """The data files holding offsets from `start` on, opened one at a time, in order
        (each is closed when the next is asked for)."""
        for path in files_overlapping(self._files, start, 2**63 - 1).column("path").to_pylist():
            with self._storage.open_input(posixpath.join(self.path, unquote(path))) as source:
                yield pq.ParquetFile(source)

    def read(self, start: int, end: int, columns: list[str] | None = None,
             typed: bool = False, skip_marker_free: bool = False) -> Iterator[pa.Table]:
        """Records [start, end) in offset order, none below the log start offset (a file
        straddling it keeps records that are gone). A table per row group where a file's groups
        hold disjoint offset ranges, as the files deltabus writes do, so a reader holds one
        group in memory and hands it on while it is still in the CPU's caches; a table per file
        otherwise. `typed`: with a typed topic's typed columns, where a file holds them.
        `skip_marker_free`: producer_id and sequence (what tells transaction markers) are left
        out of the groups whose statistics show they hold none, the common case, which then
        need no filtering either."""
        start = max(start, self._recorded_start)
        if columns is not None and "offset" not in columns:
            columns = ["offset", *columns]
        for path in files_overlapping(self._files, start, end).column("path").to_pylist():
            with self._storage.open_input(posixpath.join(self.path, unquote(path))) as source:
                reader = pq.ParquetFile(source)
                groups = overlapping_row_groups(reader.metadata, start, end)
                if not disjoint_row_groups(reader.metadata, groups):
                    table = offset_slice([read_row_group(reader, group, columns, typed)
                                          for _, group in groups], start, end)
                    if table.num_rows:
                        yield table
                    continue
                leaves = leaf_columns(reader) if skip_marker_free and columns else {}
                for _, group in groups:
                    wanted = columns
                    if leaves and cannot_hold_markers(reader.metadata.row_group(group), leaves):
                        wanted = [c for c in wanted or () if c not in TRANSACTION_COLUMNS]
                    table = offset_slice([read_row_group(reader, group, wanted, typed)],
                                         start, end)
                    if table.num_rows:
                        yield table


def producer_id_max(files: Iterable[pq.ParquetFile]) -> int | None:
    """The largest producer id of the files' records (-1 when they hold none), from their
    row-group statistics alone; None when a row group has no statistics for it."""
    largest = -1
    for reader in files:
        column = leaf_columns(reader).get("producer_id")
        for group in range(reader.metadata.num_row_groups):
            stats = (reader.metadata.row_group(group).column(column).statistics
                     if column is not None else None)
            if stats is None or not stats.has_min_max:
                if reader.metadata.row_group(group).num_rows:
                    return None
                continue
            largest = max(largest, int(stats.max))
    return largest


def stats_json(row: dict[str, Any]) -> str:
    """A data file's Delta statistics, as delta-rs writes them, from its flattened add action
    (or the same keys computed from the data): the producer ids' and leader epochs' where the
    row has them (STATE_STATS)."""
    def ts(value: Any) -> str | None:  # Delta keeps milliseconds in statistics
        return None if value is None else value.strftime("%Y-%m-%dT%H:%M:%S.") + (
            f"{value.microsecond // 1000:03d}Z")
    stats: dict[str, Any] = {
        "numRecords": row["num_records"],
        "minValues": {"offset": row["min.offset"], "timestamp": ts(row["min.timestamp"]),
                      "timestamp_type": row["min.timestamp_type"]},
        "maxValues": {"offset": row["max.offset"], "timestamp": ts(row["max.timestamp"]),
                      "timestamp_type": row["max.timestamp_type"]},
        "nullCount": {"offset": row["null_count.offset"],
                      "timestamp": row["null_count.timestamp"],
                      "timestamp_type": row["null_count.timestamp_type"]},
    }
    for column in ("producer_id", "leader_epoch"):
        low, high = row.get(f"min.{column}"), row.get(f"max.{column}")
        if low is not None and high is not None:
            stats["minValues"][column], stats["maxValues"][column] = low, high
            stats["nullCount"][column] = 0  # the log's columns are never null
    return json.dumps(stats, separators=(",", ":"))
