"""The Delta commits of appends and of the log cleaner's rewrites, written by deltabus itself: a
Parquet data file, then the next version's commit file, put only if no other writer made that
version first.

Why not delta-rs: its write path costs 7-40 ms of CPU a commit whatever the batch size (it
replays the log, plans, and runs its conflict checker), where a data file and a few lines of
JSON cost about a millisecond (`python -m bench.commit_paths`). And a delta-rs commit beside
appends landing every 1-2 ms loses every version race: its retries cost as much again, so the
cleaner's retention, merge and compaction commit here too (delta_writes.commit_rewrite), with
the actions they prepare. delta-rs still creates the tables, reads them, checkpoints, vacuums,
truncates and changes schemas, and every table this module writes stays a plain Delta table.

The rules of the Delta protocol (PROTOCOL.md, delta-io/delta) this writer follows:
- **Mutual exclusion.** Version n is the file `_delta_log/<n, 20 digits>.json`, written whole
  and only if absent (Storage.put_if_absent: a hard link on local disks, a conditional put on
  S3, Azure and GCS), so exactly one writer makes each version.
- **Actions**, one JSON object a line: `commitInfo` (its provenance; delta-rs's `history()` and
  delta-spark's DESCRIBE HISTORY show it), then `txn` (application transactions: appId,
  version, lastUpdated), then `add` and `remove`.
- **add**: the path relative to the table and URL-encoded, empty `partitionValues` (the tables
  are unpartitioned), size, modificationTime, dataChange, and `stats`, a JSON string with
  numRecords and the minValues, maxValues and nullCount of the columns
  `delta.dataSkippingStatsColumns` names, or else of the first
  `delta.dataSkippingNumIndexedCols` leaf columns (32 unless the table says): file pruning by
  offset and timestamp reads them, and a log opening reads its leader epochs from them.
  Strings keep a 32-character prefix as their minimum and no maximum when longer; binary,
  boolean, list and map columns carry null counts only; timestamps are written to the
  millisecond, the maximum rounded up.
- **remove**: path, deletionTimestamp, dataChange, size (vacuum deletes the file later).
- **dataChange=false** on the actions of a rewrite that leaves the records as they were (the
  cleaner's merge, compaction and retention): streaming readers skip those versions.
- **Conflicts.** A version lost to another writer is tried again after the newest one, once
  every commit made since the writer's version has been read and found compatible (the
  protocol's optimistic concurrency: the checks of delta-spark's and delta-rs's conflict
  checkers for blind appends and dataChange=false rewrites). A winner invalidates the commit
  when it changes the `metaData` or `protocol` (the schema or the table's rules changed), when
  it removes a file this commit removes (a concurrent rewrite of the same files: the cleaner's
  merge, compaction or retention against each other or a restart), or when it sets an app
  transaction this commit sets (e.g. the compaction's cleaned end): CommitConflict, nothing
  committed, reload and try again. An app transaction named by `fence_app_id` is another writer
  of the same log: FencedWriter, and the batch is never acknowledged. An append reads nothing
  and removes nothing, so only the first and the last of these can stop it.
- **Protocol versions** stay as the tables were created (reader 1, writer 2): this writer uses
  no table feature, and no deltabus table sets appendOnly or column invariants.
"""

from __future__ import annotations

import datetime
import json
import posixpath
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus import errors
from deltabus.storage import Storage

if TYPE_CHECKING:
    from deltalake import DeltaTable

ENGINE = "deltabus"
DEFAULT_INDEXED_COLUMNS = 32  # the protocol's default delta.dataSkippingNumIndexedCols
STRING_STATS_PREFIX = 32  # characters of a string kept as its minimum (delta-spark's)
# Columns of at most this many values get their bounds from a Python list: a compute kernel
# call costs about 12 us whatever its length, and a small commit's stats made seven of them
# (a third of a bare commit's CPU with three records).
LIST_BOUNDS_VALUES = 64
# Row groups of a bounded size carry offset statistics, so a range read inside a large
# group-committed (or merged) file skips the row groups it does not need.
ROW_GROUP_RECORDS_MAX = 65_536


class CommitConflict(Exception):
    """The version an append was to take went to a commit that changed the table's schema or
    protocol, or every retry lost: nothing was committed; reload the table and try again."""


class FencedWriter(Exception):
    """Another writer of the same log committed (its app transaction `fence_app_id`): this
    writer is no longer the log's only one, and what it was committing is not acknowledged."""


@dataclass(frozen=True)
class DataFile:
    """A data file written into the table's folder, not yet part of the table."""

    path: str  # relative to the table, as the add action names it (not URL-encoded)
    size: int
    stats: str  # the add action's stats (JSON)
    # False for a rewrite of records already in the table (merge, compaction)
    data_change: bool = True

    def add_action(self, now_ms: int) -> dict[str, Any]:
        return {"add": {"path": quote(self.path), "partitionValues": {}, "size": self.size,
                        "modificationTime": now_ms, "dataChange": self.data_change,
                        "stats": self.stats}}

    @property
    def records(self) -> int:
        """The records in the file, as its stats say."""
        return int(json.loads(self.stats).get("numRecords", 0))


def write_data_file(storage: Storage, table_uri: str, data: pa.Table,
                    kind: str) -> tuple[str, int]:
    """Write `data` as a new Parquet data file of the table at `table_uri` (Snappy, bounded
    row groups), not yet part of it; returns its name (relative to the table) and size, for
    the add action. `kind` ends the name, saying which job wrote it."""
    name = f"part-00000-{uuid.uuid4()}-c000.{kind}.snappy.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, row_group_size=ROW_GROUP_RECORDS_MAX, compression="snappy")
    return name, storage.write(posixpath.join(table_uri, name), sink.getvalue())


def commit_file(table_uri: str, version: int) -> str:
    """The location of version `version`'s commit file."""
    return posixpath.join(table_uri, "_delta_log", f"{version:020d}.json")


def remove_action(path: str, size: int, deletion_ms: int, *,
                  data_change: bool = True) -> dict[str, Any]:
    """A remove action for the data file at `path` (relative, not URL-encoded).
    `deletion_ms` decides when vacuum may delete the file (delta_writes.removal_stamp);
    `data_change`=False for a rewrite that keeps the file's records in the table."""
    return {"remove": {"path": quote(path), "deletionTimestamp": deletion_ms,
                       "dataChange": data_change, "extendedFileMetadata": True,
                       "partitionValues": {}, "size": size}}


class DeltaCommitWriter:
    """Writes data files and commits to one Delta table from a known version on. Not
    thread-safe: one writer thread per table (the log's commit round, a cleaner's task)."""

    def __init__(self, storage: Storage, table_uri: str, version: int, *,
                 indexed_columns: int = DEFAULT_INDEXED_COLUMNS,
                 stats_columns: tuple[str, ...] | None = None,
                 fence_app_id: str | None = None, retries: int = 50,
                 epoch_app_id: str | None = None, epoch: int = -1) -> None:
        """`version`: the table's latest version as the caller loaded it. `fence_app_id`: an
        app transaction only this table's one log writer sets (a lost version that sets it
        means another writer: FencedWriter). `retries`: tries lost to other writers'
        compatible commits before CommitConflict (after each, every commit made since is read,
        so the next try loses only to a commit landing in between).

        `epoch_app_id`, `epoch`: a log whose writers take turns (a diskless partition's
        leaders) stamps each commit with its writer's leader epoch in that app transaction. A
        lost version of an older epoch is the previous leader's last commit, landed before
        this writer's first: CommitConflict (reload: it is part of the log), not FencedWriter."""
        self.storage = storage
        self.table_uri = table_uri
        self.version = version
        self.indexed_columns = indexed_columns
        self.stats_columns = stats_columns  # the table's delta.dataSkippingStatsColumns
        self.fence_app_id = fence_app_id
        self.retries = retries
        self.epoch_app_id = epoch_app_id
        self.epoch = epoch
        # In every commitInfo: tells this writer's own commits from others' (`landed`).
        self.writer_id = uuid.uuid4().hex

    def write_file(self, data: pa.Table, kind: str = "append") -> DataFile:
        """Write `data` as a new Parquet data file of the table (Snappy, bounded row groups);
        `kind` ends its name, saying which job wrote it."""
        name, size = write_data_file(self.storage, self.table_uri, data, kind)
        return DataFile(name, size, file_stats(data, self.indexed_columns, self.stats_columns))

    def commit(self, *, adds: Sequence[DataFile] = (), removes: Sequence[dict[str, Any]] = (),
               txns: Mapping[str, int] | None = None, info: Mapping[str, Any] | None = None,
               operation: str = "WRITE") -> int:
        """Commit the actions as the next version the table lets this writer have; returns it.
        `removes` are `remove_action`s; `info` goes into the commitInfo (history() shows it).
        Raises FencedWriter or CommitConflict (nothing committed) or KafkaStorageError (the
        storage failed and the version holds no commit of this call that could be read back:
        the outcome is unknown, as a put may still land)."""
        now_ms = int(time.time() * 1000)
        commit_info: dict[str, Any] = {
            "timestamp": now_ms, "operation": operation,
            "operationParameters": {"mode": "Append"}, "isBlindAppend": not removes,
            "engineInfo": ENGINE, "clientVersion": ENGINE, "deltabus.writerId": self.writer_id,
            # what delta-rs's own writes report (its history() readers look here)
            "operationMetrics": {"num_added_files": len(adds),
                                 "num_removed_files": len(removes), "num_partitions": 0,
                                 "num_added_rows": sum(f.records for f in adds)},
            **(info or {})}
        lines = [{"commitInfo": commit_info}]
        lines += [{"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}}
                  for app_id, version in (txns or {}).items()]
        lines += [f.add_action(now_ms) for f in adds]
        lines += list(removes)
        payload = ("\n".join(json.dumps(line, separators=(",", ":")) for line in lines)
                   + "\n").encode()
        mine = _Touches(removed={unquote(r["remove"]["path"]) for r in removes},
                        txns=set(txns or ()))
        version = self.version + 1
        for _ in range(self.retries + 1):
            winner: bytes | None = self._put(version, payload)
            if winner == payload:
                self.version = version
                return version
            # Lost: read every commit made since (a cleaner reading an old version may be
            # many behind), then try after the newest.
            while winner is not None:
                self._check_winner(version, winner, mine)
                self.version = version
                version += 1
                winner = self.storage.read_if_present(commit_file(self.table_uri, version))
        raise CommitConflict(
            f"{self.table_uri}: {self.retries + 1} tries in a row lost their version to other "
            "writers")

    def _put(self, version: int, payload: bytes) -> bytes:
        """Put `payload` as `version`'s commit file if none is there; returns the file the
        version holds: `payload` when this commit took it, another writer's commit when not.

        Why not put_if_absent's answer alone: a put whose answer is lost (the connection
        dropped after the store acted on it) lands all the same. object_store retries it, and
        the retry is refused (412, AlreadyExists) by the first try's own file, so "absent: no"
        can mean this commit; and when the retry times out instead, the put fails though the
        commit is in the table. Either way the file is read back: a payload holds this
        writer's id and the time, so the same bytes are this very commit, which is then done
        (never reported as a conflict or a failure). A failed put that did not land, or
        whose file cannot be read, raises KafkaStorageError: the outcome is unknown, and
        nothing is acknowledged."""
        uri = commit_file(self.table_uri, version)
        try:
            if self.storage.put_if_absent(uri, payload):
                return payload
        except errors.KafkaStorageError:
            if self.storage.read_if_present(uri) != payload:
                raise
            return payload
        return self.storage.read_bytes(uri)

    def landed(self) -> bool:
        """After `commit` raised KafkaStorageError (the outcome unknown: the put may have landed
        and only its answer been lost): whether this writer's commit is the next version, in
        which case the writer moves past it. Raises KafkaStorageError if the store still
        fails."""
        text = self.storage.read_if_present(commit_file(self.table_uri, self.version + 1))
        if text is None:
            return False
        first = text.decode().split("\n", 1)[0]
        if json.loads(first).get("commitInfo", {}).get("deltabus.writerId") != self.writer_id:
            return False
        self.version += 1
        return True

    def catch_up(self, version: int) -> None:
        """The table reached `version` through another writer of this process (delta-rs)."""
        self.version = max(self.version, version)

    def _check_winner(self, version: int, text: bytes, mine: _Touches) -> None:
        """The commit that took `version`: raise if it invalidates this writer's commit."""
        actions = [json.loads(line) for line in text.decode().splitlines() if line.strip()]
        txns = {a["txn"].get("appId"): a["txn"].get("version", -1) for a in actions if "txn" in a}
        if self.fence_app_id and self.fence_app_id in txns and self.epoch_app_id and \
                txns.get(self.epoch_app_id, -1) < self.epoch:
            raise CommitConflict(
                f"{self.table_uri}: version {version} is a commit of leader epoch "
                f"{txns.get(self.epoch_app_id, -1)}, older than this writer's {self.epoch}")
        for action in actions:
            if action.get("commitInfo", {}).get("deltabus.writerId") == self.writer_id:
                raise CommitConflict(
                    f"{self.table_uri}: version {version} is a commit of this writer that was "
                    "reported failed (its outcome was unknown and `landed` was not asked)")
            if "metaData" in action or "protocol" in action:
                raise CommitConflict(
                    f"{self.table_uri}: version {version} changed the table's schema or "
                    "protocol while a commit was being made")
            txn = action.get("txn")
            if txn is not None:
                app_id = txn.get("appId")
                if self.fence_app_id and app_id == self.fence_app_id:
                    raise FencedWriter(
                        f"{self.table_uri}: another writer of this log committed version "
                        f"{version}")
                if app_id in mine.txns:
                    raise CommitConflict(
                        f"{self.table_uri}: version {version} set the app transaction "
                        f"{app_id} this commit sets")
            remove = action.get("remove")
            if remove is not None and unquote(remove.get("path", "")) in mine.removed:
                raise CommitConflict(
                    f"{self.table_uri}: version {version} removed {remove.get('path')}, "
                    "which this commit removes too")


@dataclass(frozen=True)
class _Touches:
    """What a commit removes and which app transactions it sets: a winner touching either
    invalidates it."""

    removed: set[str]
    txns: set[str]


def writer_for(table: DeltaTable, storage: Storage, *, retries: int) -> DeltaCommitWriter:
    """A writer continuing `table` from the version delta-rs loaded, for a commit of actions
    prepared from that version (the log cleaner's): every commit made since is checked
    against it before it lands."""
    return DeltaCommitWriter(storage, table.table_uri, table.version(),
                             indexed_columns=indexed_columns(table.metadata().configuration),
                             stats_columns=stats_columns(table.metadata().configuration),
                             retries=retries)


def file_stats(data: pa.Table, indexed_columns: int = DEFAULT_INDEXED_COLUMNS,
               stats_columns: tuple[str, ...] | None = None) -> str:
    """The add action's stats of a file holding `data`: numRecords, and the minimum, maximum
    and null count of the first `indexed_columns` leaf columns (the protocol's order: nested
    fields count one by one), or of the top-level `stats_columns` where the table names them
    (delta.dataSkippingStatsColumns, which then rules)."""
    budget = [indexed_columns if stats_columns is None else 1 << 30]
    mins: dict[str, Any] = {}
    maxes: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    for field, column in zip(data.schema, data.columns, strict=True):
        if budget[0] <= 0:
            break
        if stats_columns is None or field.name in stats_columns:
            _column_stats(field, column, budget, mins, maxes, nulls)
    return json.dumps({"numRecords": data.num_rows, "minValues": mins, "maxValues": maxes,
                       "nullCount": nulls}, separators=(",", ":"))


def _column_stats(field: pa.Field, column: pa.ChunkedArray | pa.Array, budget: list[int],
                  mins: dict[str, Any], maxes: dict[str, Any], nulls: dict[str, Any]) -> None:
    kind = field.type
    if pa.types.is_struct(kind):
        inner_min: dict[str, Any] = {}
        inner_max: dict[str, Any] = {}
        inner_nulls: dict[str, Any] = {}
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        for i in range(kind.num_fields):
            if budget[0] <= 0:
                break
            child = kind.field(i)
            _column_stats(child, pc.struct_field(array, [i]), budget, inner_min, inner_max,
                          inner_nulls)
        for target, inner in ((mins, inner_min), (maxes, inner_max), (nulls, inner_nulls)):
            if inner:
                target[field.name] = inner
        return
    budget[0] -= 1
    nulls[field.name] = column.null_count
    if column.null_count == len(column) or not _has_min_max(kind):
        return
    low, high = _bounds(column, kind)
    if pa.types.is_timestamp(kind):
        mins[field.name] = _timestamp(low, up=False)
        maxes[field.name] = _timestamp(high, up=True)
    elif pa.types.is_date(kind):
        mins[field.name], maxes[field.name] = low.isoformat(), high.isoformat()
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        mins[field.name] = low[:STRING_STATS_PREFIX]
        if len(high) <= STRING_STATS_PREFIX:
            maxes[field.name] = high
    elif pa.types.is_decimal(kind):
        mins[field.name], maxes[field.name] = float(low), float(high)
    else:
        mins[field.name], maxes[field.name] = low, high


def _bounds(column: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> tuple[Any, Any]:
    """The least and greatest non-null values of `column` (which has some), as Python values.
    Floats always go to the kernel, whose NaN handling Python's min and max do not share."""
    if len(column) <= LIST_BOUNDS_VALUES and not pa.types.is_floating(kind):
        values = [value for value in column.to_pylist() if value is not None]
        return min(values), max(values)
    bounds = pc.min_max(column)
    return bounds["min"].as_py(), bounds["max"].as_py()


def _has_min_max(kind: pa.DataType) -> bool:
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_timestamp(kind) or pa.types.is_date(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_decimal(kind))


def _timestamp(value: datetime.datetime, *, up: bool) -> str:
    """A timestamp statistic to the millisecond (the protocol's precision), UTC; a maximum
    with microseconds beyond it is rounded up, so it still bounds the file."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    value = value.astimezone(datetime.UTC)
    if up and value.microsecond % 1000:
        value += datetime.timedelta(microseconds=1000 - value.microsecond % 1000)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def stats_columns(configuration: Mapping[str, str | None]) -> tuple[str, ...] | None:
    """The columns a table's files carry statistics for, where its configuration names them
    (delta.dataSkippingStatsColumns); None: the first `indexed_columns` leaf columns."""
    value = configuration.get("delta.dataSkippingStatsColumns")
    return None if not value else tuple(name.strip() for name in value.split(","))


def indexed_columns(configuration: Mapping[str, str | None]) -> int:
    """How many leaf columns a table's files carry statistics for (its configuration)."""
    value = configuration.get("delta.dataSkippingNumIndexedCols")
    if value is None:
        return DEFAULT_INDEXED_COLUMNS
    return 1 << 30 if int(value) < 0 else int(value)  # -1: every column
