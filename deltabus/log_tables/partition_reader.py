"""What a broker reads from its replica of a partition: offset ranges for fetches, whole files
for followers, the records ListOffsets searches by timestamp.

Recent commits are served from memory (`tail_cache`), so tail fetches never read Parquet; older
ranges from the data files holding them, and in those only the row groups whose offset statistics
overlap (`log_reader`). The reader's table object follows the log's committed version and reloads
from the latest checkpoint every `checkpoint_interval` versions, as the appender's does.
"""

from __future__ import annotations

import collections
import itertools
import posixpath
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus import errors
from deltabus.log_tables.delta_reads import open_table, update
from deltabus.log_tables.leader_epochs import recover_epochs
from deltabus.log_tables.log_reader import (
    FILE_COLUMNS,
    STATE_STATS,
    data_files,
    files_overlapping,
    offset_slice,
    overlapping_row_groups,
    producer_id_max,
    read_row_group,
    stats_json,
)
from deltabus.storage import Storage, is_missing

# ListOffsets's special timestamps (`offset_for_timestamp`)
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
PARQUET_FILES_OPEN_MAX = 256  # footers kept per log; a file handle each
PARQUET_OPENS_PARALLEL = 8  # files `parquet_files` opens at once
# Statistics beyond the offsets that a copied file's add action carries (the table indexes its
# first three columns: offset, timestamp, timestamp_type).
_STATS_COLUMNS = ["min.timestamp", "max.timestamp", "min.timestamp_type", "max.timestamp_type",
                  "null_count.offset", "null_count.timestamp", "null_count.timestamp_type"]


@dataclass(frozen=True)
class LogFile:
    """One committed data file of a log: what a follower copies whole from its leader."""

    uri: str
    size_bytes: int
    stats: str  # the add action's statistics (Delta JSON), copied into the follower's commit
    base_offset: int
    last_offset: int


class PartitionReader:
    """Reads one replica's committed data files. Thread-safe (its own lock)."""

    def __init__(self, path: str, *, storage: Storage,
                 checkpoint_interval: int, committed_version: Callable[[], int],
                 on_log_start: Callable[[int], None]) -> None:
        """`committed_version` says which version the log has committed (the reader catches
        up to it before answering); `on_log_start` hears the first offset of the oldest file,
        which moves up when the cleaner removes files. It is called with this reader's lock
        held, and must take no lock that is held while calling into the reader."""
        self.path = path
        self._storage = storage
        self._checkpoint_interval = checkpoint_interval
        self._committed_version = committed_version
        self._on_log_start = on_log_start
        self._lock = threading.Lock()
        self._table = open_table(path, storage_options=storage.delta_options)
        self._table_base = self._table.version()  # loaded afresh at this version
        self._files_version = -1
        self._files_cache = pa.table({})
        # A listed file was not there: another process's commits removed it (the log cleaner
        # merged or expired it, then vacuum deleted it) and nobody told this reader.
        self._missed = False
        self._parquet_files: dict[str, pq.ParquetFile] = {}
        self._parquet_files_lock = threading.Lock()

    def files(self) -> pa.Table:
        """The table's data files (path, offsets, size, statistics), by first offset: delta-rs's
        add actions of the committed version, cached per version."""
        with self._lock:
            if self._missed or self._table.version() < self._committed_version():
                self._missed = False
                self._update()
            if self._files_version != self._table.version():
                self._files_cache = data_files(self._table, [*FILE_COLUMNS, *_STATS_COLUMNS,
                                                             *STATE_STATS])
                self._files_version = self._table.version()
                if self._files_cache.num_rows:  # the cleaner may have removed the oldest files
                    self._on_log_start(self._files_cache.column("min.offset")[0].as_py())
            return self._files_cache

    def refresh(self) -> None:
        """Take in commits another process made (the log cleaner's)."""
        with self._lock:
            self._update()
        self.files()

    def leader_epochs(self) -> list[tuple[int, int]]:
        """(leader epoch, first offset) of every epoch in the committed files (leader_epochs.py:
        from the add actions, and the footers of the few files they do not tell)."""
        return recover_epochs(self.files(), self.parquet_files)

    def producer_id_max(self) -> int | None:
        """The largest producer id in the committed files (-1: none), from the add actions'
        statistics, and the footers of files whose add actions have none; None when a footer
        has none either."""
        files = self.files()
        bounds = files.column("max.producer_id")
        largest = pc.max(bounds).as_py()
        unknown = files.filter(pc.is_null(bounds)).column("path").to_pylist()
        found = producer_id_max(self.parquet_files(unknown)) if unknown else -1
        return None if found is None else max(found, -1 if largest is None else int(largest))

    def producer_files(self, producer_id: int) -> Iterator[pq.ParquetFile]:
        """The committed files that may hold records of `producer_id`, opened, newest first:
        those whose add actions' producer id bounds take it in, and every file without them."""
        files = self.files()
        low, high = files.column("min.producer_id"), files.column("max.producer_id")
        may = pc.or_kleene(pc.is_null(low), pc.and_(pc.less_equal(low, producer_id),
                                                     pc.greater_equal(high, producer_id)))
        return self.parquet_files(files.filter(may).column("path").to_pylist(),
                                  newest_first=True)

    def parquet_files(self, paths: list[str] | None = None, newest_first: bool = False
                      ) -> Iterator[pq.ParquetFile]:
        """The committed data files (or those at `paths`), opened, in offset order
        (`newest_first`: the reverse): several at a time ahead of the caller. On an object
        store an open is a round trip or two (the size, the footer)."""
        ordered = self.files().column("path").to_pylist() if paths is None else paths
        pending = iter(ordered[::-1] if newest_first else ordered)
        pool = ThreadPoolExecutor(PARQUET_OPENS_PARALLEL, thread_name_prefix="deltabus-open")
        # A bounded window, not pool.map: that opens every file at once and holds each open
        # until the caller reaches it (thousands of file handles for a log of small files).
        ahead = collections.deque(pool.submit(self.parquet_file, path)
                                  for path in itertools.islice(pending, PARQUET_OPENS_PARALLEL))
        try:
            while ahead:
                opened = ahead.popleft().result()
                for path in itertools.islice(pending, 1):
                    ahead.append(pool.submit(self.parquet_file, path))
                yield opened
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def read(self, offset: int, end: int, max_bytes: int, typed: bool = False) -> pa.Table:
        """Records [offset, end) from Parquet, touching only the files, and row groups, that
        hold them; stops after about `max_bytes`. `typed`: with a typed topic's typed columns
        (a follower's copy holds what the leader's does).

        A file listed but not there is read again from the table's newer commits, once: the
        controller tells a replica's broker of each log cleaner run, but a diskless
        partition's leader elected during the run may not hear of it, and the merge's inputs
        leave the store file.delete.delay.ms later. A file still missing after that is lost:
        KAFKA_STORAGE_ERROR."""
        try:
            return self._read(offset, end, max_bytes, typed)
        except errors.KafkaStorageError as e:
            if not is_missing(e):
                raise
            return self._read(offset, end, max_bytes, typed)

    def _read(self, offset: int, end: int, max_bytes: int, typed: bool) -> pa.Table:
        parts: list[pa.Table] = []
        size = 0
        for path in files_overlapping(self.files(), offset, end).column("path").to_pylist():
            reader = self.parquet_file(path)
            for first, group in overlapping_row_groups(reader.metadata, offset, end):
                if size >= max_bytes:
                    # Stop only where every offset below is read: a file's groups may
                    # interleave, and a gap here would be skipped by the consumer for good.
                    table = offset_slice(parts, offset, first)
                    if table.num_rows:
                        return table
                parts.append(self._read_row_group(path, reader, group, typed))
                size += parts[-1].nbytes
            if size >= max_bytes:  # files hold disjoint ranges: a file's end is a safe stop
                break
        return offset_slice(parts, offset, end)

    def files_from(self, offset: int, max_bytes: int) -> list[LogFile]:
        """The committed data files holding the log from exactly `offset` on, whole and in
        order, about `max_bytes` of them (at least one): what a follower copies as files. Empty
        when no file starts at `offset` (the follower then copies records)."""
        files = self.files()
        if files.num_rows == 0:
            return []
        firsts = files.column("min.offset").to_numpy()
        i = int(np.searchsorted(firsts, offset))
        out: list[LogFile] = []
        size = 0
        expected = offset
        while i < files.num_rows and (not out or size < max_bytes):
            row = {name: files.column(name)[i].as_py() for name in files.column_names}
            first, last = row["min.offset"], row["max.offset"]
            if first != expected:  # a compacted file covers its range with fewer records
                break
            out.append(LogFile(posixpath.join(self.path, unquote(row["path"])),
                               row["size_bytes"], stats_json(row), first, last))
            size += row["size_bytes"]
            expected = last + 1
            i += 1
        return out

    def offsets_and_timestamps(self, end: int) -> pa.Table:
        """Offset and timestamp of every record below `end` (ListOffsets by timestamp)."""
        with self._lock:
            if self._table.version() != self._committed_version():
                self._update()
            dataset = self._table.to_pyarrow_dataset()
        return dataset.to_table(columns=["offset", "timestamp"], filter=pc.field("offset") < end)

    def offset_for_timestamp(self, timestamp_ms: int, start: int, hw: int) -> tuple[int, int]:
        """(offset, timestamp ms) as ListOffsets answers, in the log from `start` (its log start
        offset) to `hw` (its high watermark): -1 latest, -2 earliest, -3 the record with the
        largest timestamp, else the first offset with a timestamp at or after it ((-1, -1)
        when there is none)."""
        if timestamp_ms == LATEST_TIMESTAMP:
            return hw, -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return start, -1
        table = self.offsets_and_timestamps(hw)
        table = table.filter(pc.greater_equal(table.column("offset"), start))
        if table.num_rows == 0:
            return -1, -1
        ts = pc.cast(table.column("timestamp"), pa.int64()).to_numpy(zero_copy_only=False) // 1000
        offsets = table.column("offset").to_numpy()
        if timestamp_ms == MAX_TIMESTAMP:  # ties: the earliest offset, as Kafka answers
            top = np.nonzero(ts == ts.max())[0]
            i = int(top[np.argmin(offsets[top])])
            return int(offsets[i]), int(ts[i])
        hits = np.nonzero(ts >= timestamp_ms)[0]
        if hits.size == 0:
            return -1, -1
        i = int(hits[np.argmin(offsets[hits])])
        return int(offsets[i]), int(ts[i])

    def _read_row_group(self, path: str, reader: pq.ParquetFile, group: int,
                        typed: bool) -> pa.Table:
        """One row group of a data file, or KafkaStorageError (the fetch's partition answers
        it, and clients retry) with the open file forgotten, so the next read opens it afresh:
        a handle that read wrong bytes once (an object store's answer gone bad on an S3 soak,
        "realloc of size 140492328572288 failed") must not fail every read after it."""
        try:
            return read_row_group(reader, group, typed=typed)
        except (OSError, pa.ArrowException) as e:
            with self._parquet_files_lock:
                if self._parquet_files.get(path) is reader:
                    del self._parquet_files[path]
            self._missed = self._missed or is_missing(e)
            raise errors.KafkaStorageError(
                f"cannot read row group {group} of {posixpath.join(self.path, path)}: "
                f"{type(e).__name__}: {e}") from e

    def parquet_file(self, path: str) -> pq.ParquetFile:
        """An open Parquet file of this table (footers cached: files never change)."""
        reader = self._parquet_files.get(path)
        if reader is None:
            try:
                reader = self._storage.open_parquet(posixpath.join(self.path, unquote(path)))
            except errors.KafkaStorageError as e:
                self._missed = self._missed or is_missing(e)  # the next `files` updates
                raise
            with self._parquet_files_lock:  # opened in parallel by parquet_files
                if len(self._parquet_files) >= PARQUET_FILES_OPEN_MAX:
                    self._parquet_files.pop(next(iter(self._parquet_files)))
                self._parquet_files[path] = reader
        return reader

    def _update(self) -> None:
        """Lock held: bring the table to the latest version, loading it afresh from the latest
        checkpoint every checkpoint_interval versions (delta-rs replays every commit since the
        object was loaded, so a long-lived object slows down)."""
        if self._committed_version() - self._table_base >= self._checkpoint_interval:
            self._table = open_table(self.path, storage_options=self._storage.delta_options)
            self._table_base = self._table.version()
        else:
            update(self._table)
