"""Retention (cleanup.policy=delete): whole committed files past `retention.ms`, or beyond
`retention.bytes`, leave a partition's replica tables, oldest first, and the log start offset
moves up. The log cleaner's Spark job calls these on the executors (see cluster/log_cleaner.py).

As Kafka deletes whole segments: never the newest file (it holds the log end offset), never a file
with records at or above the high watermark. The leader's table decides the new log start offset;
every replica then drops its files wholly below it (a follower's file boundaries may differ: it
copied records, not files, at times).

DeleteRecords moves the log start offset without removing anything (it records it in the leader's
table, see appender.py): the cleaner's next run removes the files wholly below it the same way
(`recorded_cut`); a file straddling it stays, and reads skip its records below it.

The removal is a Delta commit of remove actions marked dataChange=false (deltabus's own,
delta_writes.commit_rewrite: it wins its version beside appends landing every millisecond or
two; a concurrent removal of the same files conflicts, and the next run tries again). The
records stay readable at older versions, so running readers do not break; a broker appending to
the table at the same time is not disturbed; and a delta-spark stream over the table does not
see a delete, as a Kafka consumer does not. The files themselves go after
`file.delete.delay.ms` (`vacuum`).
"""

from __future__ import annotations

import math
import posixpath
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from deltabus.log_tables.delta_commit import remove_action
from deltabus.log_tables.delta_writes import (
    VACUUM_RETENTION_HOURS,
    cleaner_writer,
    commit_rewrite,
    removal_stamp,
)
from deltabus.log_tables.log_reader import LOG_START_TXN_APP_ID, data_files
from deltabus.storage import Storage

_COLUMNS = ["path", "size_bytes", "num_records", "min.offset", "max.offset", "max.timestamp"]


@dataclass(frozen=True)
class Removed:
    """What retention took from one replica table."""

    files: int
    records: int
    bytes: int
    log_start_offset: int  # the table's first offset afterwards


def table_files(table: DeltaTable) -> pa.Table:
    """A table's data files by first offset, with the statistics retention needs (the newest
    record timestamp as milliseconds)."""
    files = data_files(table, _COLUMNS)
    newest = pc.cast(pc.cast(files.column("max.timestamp"), pa.timestamp("ms")), pa.int64())
    return files.set_column(files.schema.get_field_index("max.timestamp"), "max.timestamp",
                            newest)


def log_end_offset(table: DeltaTable) -> int:
    files = data_files(table, ["min.offset", "max.offset"])
    if files.num_rows == 0:
        return -1
    return int(pc.max(files.column("max.offset")).as_py()) + 1


def retention_cut(files: pa.Table, *, now_ms: int, retention_ms: int, retention_bytes: int,
                  high_watermark: int) -> int:
    """The new log start offset for a table whose data files are `files` (`table_files`), or
    -1 when nothing is due. Oldest first, a file goes while it is not the newest, ends below
    the high watermark, and either its newest record is older than `retention.ms` or the
    partition is over `retention.bytes` even without it (Kafka's two rules; -1 turns one off)."""
    if files.num_rows < 2:
        return -1
    sizes = files.column("size_bytes").to_pylist()
    last_offsets = files.column("max.offset").to_pylist()
    newest = files.column("max.timestamp").to_pylist()
    over = sum(sizes) - retention_bytes if retention_bytes >= 0 else -math.inf
    cut = 0
    for i in range(files.num_rows - 1):
        if last_offsets[i] >= high_watermark:
            break
        expired = retention_ms >= 0 and newest[i] is not None and newest[i] < now_ms - retention_ms
        too_big = over - sizes[i] >= 0
        if not (expired or too_big):
            break
        over -= sizes[i]
        cut = i + 1
    return files.column("min.offset")[cut].as_py() if cut else -1


def recorded_cut(table: DeltaTable) -> int:
    """The log start offset DeleteRecords recorded in the (leader's) table, or -1: the files
    wholly below it are due for removal."""
    return table.transaction_version(LOG_START_TXN_APP_ID) or -1


def remove_below(table: DeltaTable, cut: int, *, delete_delay_ms: int,
                 now_ms: int | None = None, storage: Storage | None = None) -> Removed:
    """Commit the removal of `table`'s files that lie wholly below offset `cut` (never its
    newest file). `storage` reaches the table (by default its store, with no options)."""
    files = table_files(table)
    if files.num_rows == 0:
        return Removed(0, 0, 0, -1)
    older = files.slice(0, files.num_rows - 1)  # the newest file always stays
    doomed = older.filter(pc.less(older.column("max.offset"), cut))
    if doomed.num_rows == 0:
        return Removed(0, 0, 0, files.column("min.offset")[0].as_py())
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    stamp = removal_stamp(now_ms, delete_delay_ms)
    removes = [remove_action(path, size, stamp, data_change=False) for path, size in zip(
        doomed.column("path").to_pylist(), doomed.column("size_bytes").to_pylist(), strict=True)]
    start = files.column("min.offset")[doomed.num_rows].as_py()
    commit_rewrite(cleaner_writer(table, storage or Storage(table.table_uri)), removes=removes,
                   info={"deltabus.operation": "retention", "deltabus.logStartOffset": str(start)})
    return Removed(doomed.num_rows, int(pc.sum(doomed.column("num_records")).as_py()),
                   int(pc.sum(doomed.column("size_bytes")).as_py()), start)


def vacuum(table: DeltaTable, storage: Storage | None = None) -> int:
    """Delete the data files the cleaner removed more than `file.delete.delay.ms` ago (and
    those other writers removed over an hour ago), and the files no commit names that are over
    an hour old: a writer killed between its data file and its commit leaves one (a full
    vacuum; the hour spares the files of commits still being made), and, on a local disk,
    the temporary commit files over an hour old of writers killed while committing. Returns
    how many went.

    delta-rs decides which files go (a dry run); `storage` (by default the table's store, with
    no options) deletes them. delta-rs's own vacuum would also commit VACUUM START and END, and
    those commits lose every version race to a leader appending every millisecond or two: the
    protocol asks for no commit, so none is made."""
    doomed = table.vacuum(retention_hours=VACUUM_RETENTION_HOURS, dry_run=True,
                          enforce_retention_duration=False, full=True)
    storage = storage or Storage(table.table_uri)
    for path in doomed:
        storage.delete(posixpath.join(table.table_uri, path))
    # a writer killed inside a commit's put-if-absent leaves a temporary commit file
    return len(doomed) + storage.delete_stale_temporaries(
        posixpath.join(table.table_uri, "_delta_log"), VACUUM_RETENTION_HOURS * 3600)


def delete_expired_log(table_uri: str, storage: Storage, *, older_than_ms: int,
                       now_ms: int | None = None) -> int:
    """Delete the table's Delta log files (commits and checkpoints) that no reader needs any
    more, by the Delta protocol's metadata cleanup: those of versions below the newest
    checkpoint at or below the newest commit written over `older_than_ms` ago. Returns how
    many went.

    Why: a partition table commits many times a second and checkpoints every 25 versions, and
    Delta keeps its log for 30 days (delta.logRetentionDuration) unless something deletes it:
    the log, not the records, then filled the disk (issue 40's soak, at 1 GB in 10 minutes).
    The log cleaner passes `file.delete.delay.ms`: a version older than that names data files
    vacuum may have deleted already, so it could not be read anyway. A reader whose table is
    older (a paused process) loads from the kept checkpoint; time travel reaches as far back."""
    log_uri = posixpath.join(table_uri, "_delta_log")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff_s = (now_ms - older_than_ms) / 1000
    files = [(name, _log_version(name), modified)
             for name, modified in storage.list_modified(log_uri)]
    expired_commits = [v for name, v, modified in files
                       if v is not None and name == f"{v:020d}.json" and modified <= cutoff_s]
    if not expired_commits:
        return 0
    cut_commit = max(expired_commits)
    checkpoints = [v for name, v, _ in files
                   if v is not None and ".checkpoint." in name and v <= cut_commit]
    if not checkpoints:
        return 0
    keep_from = max(checkpoints)
    doomed = [name for name, v, _ in files if v is not None and v < keep_from]
    storage.delete_all(log_uri, doomed)
    return len(doomed)


def _log_version(name: str) -> int | None:
    """The version a `_delta_log` file belongs to (a log compaction file's last one), or None
    for the others (`_last_checkpoint`, temporaries, folders' entries)."""
    parts = name.split(".")
    if not parts[0].isdigit() or len(parts[0]) != 20:
        return None
    if len(parts) > 2 and parts[1].isdigit() and len(parts[1]) == 20:  # <v1>.<v2>.compacted.json
        return int(parts[1])
    return int(parts[0])
