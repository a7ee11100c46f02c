"""How deltabus writes its Delta tables: the numbers every writer shares, each set once.

The broker's appender and the log cleaner's retention, merge and compaction commit to partition
tables through deltabus's own commit writer (delta_commit.py); the offset store, the metadata
log, vacuum, truncation and schema changes commit with delta-rs. What they must agree on lives
here: the row-group size range reads rely on, how often a commit retries a conflict, and how a
removed file is stamped so that `vacuum` deletes it after `file.delete.delay.ms`.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Transaction,
    WriterProperties,
)

from deltabus import errors
from deltabus.log_tables.delta_commit import (
    ROW_GROUP_RECORDS_MAX,
    CommitConflict,
    DataFile,
    DeltaCommitWriter,
    FencedWriter,
    writer_for,
)
from deltabus.records import LOG_SCHEMA, TYPED_COLUMNS
from deltabus.storage import Storage

# Conflicts a commit retries before it fails. Background writers (the cleaner, the offset store,
# the metadata log) simply run again after a failure. 20 as before issue 38: the cleaner's
# commits no longer go through delta-rs, whose retries (a listing and a replay each, many ms)
# lost every race to appends landing every 1-2 ms, 1000 retries or 20; through the commit
# writer a lost try costs a read of each commit made since and one put, and the next try loses
# only to a commit landing in between. delta-rs's remaining commits to partition tables
# (truncation, schema changes) are made by the one appender, between its own appends.
COMMIT_RETRIES = 20
# A broker's appends race the cleaner's commits on the same table, and a failed append fails
# produce requests: they retry longer.
APPEND_COMMIT_RETRIES = 50
# delta-rs vacuums by whole hours of retention. The cleaner stamps its removals this long ago
# minus `file.delete.delay.ms` (`removal_stamp`) and vacuums with this retention: its files go
# after the delay, files other writers removed (a truncation, a compaction of the offsets table)
# after an hour.
VACUUM_RETENTION_HOURS = 1


def log_table_schema(table: DeltaTable, extra: Iterable[pa.Field] = ()) -> pa.Schema:
    """The schema a commit to a partition table states: the log's columns (LOG_SCHEMA, in its
    types) and the typed columns the table gained (a typed topic's `value_fields`, as its schema
    evolved), with `extra` fields merged in. A commit stating LOG_SCHEMA alone would drop a
    typed table's columns from its schema: every writer of a partition table states this."""
    current = pa.schema(table.schema().to_arrow())
    fields = {f.name: f for f in current if f.name not in LOG_SCHEMA.names}
    for field in extra:
        if field.name not in LOG_SCHEMA.names:
            held = fields.get(field.name)
            fields[field.name] = field if held is None else pa.unify_schemas(
                [pa.schema([held]), pa.schema([field])],
                promote_options="permissive").field(0)
    return pa.schema(list(LOG_SCHEMA) + list(fields.values())) if fields else LOG_SCHEMA


def typed_column_types(table: DeltaTable) -> dict[str, pa.DataType]:
    """The types of a typed topic's table's typed columns (records.TYPED_COLUMNS) it has."""
    schema = pa.schema(table.schema().to_arrow())
    return {name: schema.field(name).type for name in TYPED_COLUMNS if name in schema.names}


# A typed table's decoded columns are written at the head without Parquet dictionaries and
# with row-group statistics only (no page index); the log's own columns as delta-rs's defaults
# write them. delta-rs names top-level columns only, so the typed columns' nested leaves (and
# the headers') take the default settings and the log's columns are named.
_TYPED_LEAVES = ColumnProperties(dictionary_enabled=False, statistics_enabled="CHUNK")
_LOG_COLUMNS = ColumnProperties(dictionary_enabled=True, statistics_enabled="PAGE")


@functools.cache  # the same two settings for every commit: built once
def writer_properties(typed: bool = False) -> WriterProperties:
    """delta-rs writer settings for every data file deltabus writes through `write_deltalake`;
    `typed` for a file with typed columns.

    Why a typed table's head files differ: building a dictionary of every decoded field and a
    page index of its statistics cost about 0.1 CPU-s per million records, a third of what the
    typed columns add to an append (docs/schema-registry.md, "Typed topics"). Head files
    are short-lived: the log cleaner's merge rewrites small files older than a minute, on its
    next run, with pyarrow's defaults (dictionaries, statistics, Snappy). Row-group statistics
    stay, so Spark's Parquet reader still skips row groups by the typed columns."""
    if not typed:
        return WriterProperties(max_row_group_size=ROW_GROUP_RECORDS_MAX)
    return WriterProperties(max_row_group_size=ROW_GROUP_RECORDS_MAX,
                            default_column_properties=_TYPED_LEAVES,
                            column_properties={name: _LOG_COLUMNS for name in LOG_SCHEMA.names})


def commit_properties(metadata: dict[str, Any], *, retries: int = COMMIT_RETRIES,
                      app_transactions: list[Transaction] | None = None) -> CommitProperties:
    """A commit's properties: the commitInfo saying what it was (Delta history shows it), its
    app transactions, and how many conflicts it retries."""
    return CommitProperties(custom_metadata=metadata, app_transactions=app_transactions,
                            max_commit_retries=retries)


def removal_stamp(now_ms: int, delete_delay_ms: int) -> int:
    """The deletion timestamp of a file removed now that `vacuum` (with
    VACUUM_RETENTION_HOURS) must delete only after `delete_delay_ms`."""
    return now_ms - VACUUM_RETENTION_HOURS * 3_600_000 + delete_delay_ms


def cleaner_writer(table: DeltaTable, storage: Storage) -> DeltaCommitWriter:
    """The commit writer of a log cleaner's job on `table`, from the version delta-rs loaded
    (what the job's actions were prepared from): see `commit_rewrite`."""
    return writer_for(table, storage, retries=COMMIT_RETRIES)


def commit_rewrite(writer: DeltaCommitWriter, *, adds: Sequence[DataFile] = (),
                   removes: Sequence[dict[str, Any]] = (), txns: Mapping[str, int] | None = None,
                   info: Mapping[str, str]) -> int:
    """Commit a log cleaner's actions through deltabus's commit writer (delta_commit.py): the
    version they got, after every commit made since the writer's version was found
    compatible. Why not delta-rs: the cleaner commits beside a broker appending every 1-2 ms,
    possibly from another process, and delta-rs's retries each cost many ms: they never caught
    up (an S3 merge ran over 800 s). A conflicting commit (one removed a file this one removes,
    set an app transaction it sets, or changed the schema) raises CommitConflict: nothing is
    committed, the files it wrote are deleted, and the cleaner's next round tries again from
    the table as it is then. `info` is the commitInfo's provenance (deltabus.operation and the
    job's details)."""
    try:
        return writer.commit(adds=adds, removes=removes, txns=txns, info=info)
    except (CommitConflict, FencedWriter):
        for f in adds:  # no commit names them (vacuum would delete them an hour from now)
            try:
                writer.storage.delete(posixpath.join(writer.table_uri, f.path))
            except errors.KafkaStorageError:
                pass
        raise
