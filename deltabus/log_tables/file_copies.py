"""A follower's copies of its leader's data files, before the appender commits them.

A follower far behind copies whole committed files instead of records (no decoding, no
encoding): each file is copied byte for byte into its table's directory, then read back, and
only a copy whose size, record count and offsets are what the leader stated is queued for a
commit (appender.py commits it, with the leader's statistics). A copy cut short or torn midway
raises CorruptMessageError, every copy of the call is deleted (vacuum removes any it misses: no
commit names them), and the follower's fetcher tries again.

Separate from the appender because a copy runs on the follower's request thread before
anything is queued, and touches only the table's directory in its storage: none of the queue,
the commit writer or the log's lock. Runs on executors; thread-safe (it holds no state that
changes).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus import errors
from deltabus.log_tables.append_pool import process_pool
from deltabus.log_tables.partition_reader import LogFile
from deltabus.records import LOG_SCHEMA
from deltabus.storage import Storage

FILE_COPY_THREADS = 8  # files a follower copies at once (object stores: requests in flight)
READ_BACK_WHOLE_BYTES_MAX = 4 * 1024 * 1024  # a copy this small is read back in one request
# What the epoch list and producer state (with its producers' last timestamps, which
# DescribeProducers shows) need of records copied as files.
_STATE_COLUMNS = ["offset", "timestamp", "leader_epoch", "producer_id", "producer_epoch",
                  "sequence"]


class FileCopier:
    """Copies a leader's data files into one table's directory and reads them back."""

    def __init__(self, path: str, storage: Storage, name: str) -> None:
        """`path`: the table's root in `storage`; `name`: the partition's, for messages."""
        self.path = path
        self._storage = storage
        self._name = name

    def copy_in(self, files: list[LogFile]
                ) -> tuple[list[tuple[str, LogFile]], pa.Table, tuple[pa.Field, ...]]:
        """Copy a leader's data files, byte for byte, into this table's directory (not yet
        part of the table), and read each copy back: (name here, the leader's file) for each,
        the copies' offset, epoch and producer columns, and the columns they hold beyond the
        log's (a typed topic's values).

        A copy that is not what the leader stated (its size, its record count, its first and
        last offsets: a file cut short, a copy torn midway) raises CorruptMessageError, and
        every copy of the call is deleted: nothing unread is committed, and the follower's
        fetcher tries again."""
        copied = [(posixpath.basename(f.uri), f) for f in files]
        read_back = []
        extra: dict[str, pa.Field] = {}
        # In parallel: a table of many small files (one per group commit) copied one by one
        # from an object store costs a round trip per request, and a follower far behind a
        # busy leader would copy more slowly than the leader commits.
        copies = [_file_copies().submit(self._copy_one, name, leader_file)
                  for name, leader_file in copied]
        try:
            for copy in copies:
                records, schema = copy.result()
                read_back.append(records)
                extra.update((f.name, f) for f in schema if f.name not in LOG_SCHEMA.names)
        except Exception as e:
            for copy in copies:  # none may land after the copies are deleted
                copy.cancel()
                with contextlib.suppress(Exception):
                    copy.exception()
            self._delete_copies([name for name, _ in copied])
            if isinstance(e, errors.DeltaBusError):
                raise
            raise errors.CorruptMessageError(
                f"a file copied into {self._name} cannot be read back: {type(e).__name__}: "
                f"{e}") from e
        return copied, pa.concat_tables(read_back), tuple(extra.values())

    def _copy_one(self, name: str, leader_file: LogFile) -> tuple[pa.Table, pa.Schema]:
        self._storage.copy(leader_file.uri, posixpath.join(self.path, name))
        return self._read_back(name, leader_file)

    def _read_back(self, name: str, leader_file: LogFile) -> tuple[pa.Table, pa.Schema]:
        """The copy's offset, epoch and producer columns, once its size, footer and records
        match what the leader stated (a compacted file's records lie within its stated
        offsets, not at both ends); else CorruptMessageError."""
        location = posixpath.join(self.path, name)
        if leader_file.size_bytes <= READ_BACK_WHOLE_BYTES_MAX:
            # One GET, where a size, a footer and the columns would each take a request
            # (object stores): the size is the length read.
            whole = self._storage.read_bytes(location)
            size, source = len(whole), pa.BufferReader(whole)
        else:
            size, source = self._storage.size(location), self._storage.open_input(location)
        with source:
            reader = pq.ParquetFile(source)
            records, schema = reader.read(columns=_STATE_COLUMNS), reader.schema_arrow
        offsets = records.column("offset")
        first, last = pc.min(offsets).as_py(), pc.max(offsets).as_py()
        stated = json.loads(leader_file.stats).get("numRecords")
        within = records.num_rows == 0 or (leader_file.base_offset <= first
                                           and last <= leader_file.last_offset)
        if size != leader_file.size_bytes or records.num_rows != stated or not within:
            raise errors.CorruptMessageError(
                f"the copy of {leader_file.uri} into {self._name} holds {size} bytes, "
                f"{records.num_rows} records, offsets {first}..{last}; the leader stated "
                f"{leader_file.size_bytes} bytes, {stated} records, offsets "
                f"{leader_file.base_offset}..{leader_file.last_offset}")
        return records, schema

    def _delete_copies(self, names: list[str]) -> None:
        for name in names:
            try:
                self._storage.delete(posixpath.join(self.path, name))
            except errors.KafkaStorageError:
                pass  # vacuum removes any file no commit names


def _file_copies() -> ThreadPoolExecutor:
    """The process's threads for followers' file copies (FileCopier.copy_in)."""
    return process_pool("deltabus-file-copy", FILE_COPY_THREADS)
