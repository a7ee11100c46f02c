"""One replica of one topic-partition, kept as a Delta table and written with delta-rs.

Runs on a broker (a Spark executor). Thread-safe: many gRPC threads append and read at once; one
appender thread per log is the only writer of its table.

Invariants:
- Offsets are contiguous from the log start offset to the log end offset, but for the records a
  compacted topic's cleaner removed (log_tables/compaction.py); only the appender thread assigns
  them, at commit time, so a failed commit leaves no gap.
- Each Delta commit appends whole produce batches and records the offset range it holds in its
  commitInfo (`deltabus.baseOffset`, `deltabus.lastOffset`); per-file offset statistics map offsets
  to files, and back to versions.
- The log end offset only moves after the Delta commit that holds the records succeeded: an
  acknowledged record is durable in the table.
- Every commit (append, follower copy, truncation) sets the Delta app transaction
  `deltabus.log` to the log end offset it leaves, so two processes writing one table (a zombie
  broker and its successor, a catch-up job and a follower) conflict and one fails: a retried or
  concurrent copy never duplicates records.
- Leader epochs never decrease along the offsets; `end_offset_for_epoch` answers from them.
- Reads for consumers never return records at or beyond the high watermark; followers read up to
  the log end offset. The high watermark never passes the log end offset.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import logging
import posixpath
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from deltabus import errors
from deltabus.log_tables.log_reader import (
    FILE_COLUMNS,
    data_files,
    files_overlapping,
    leaf_columns,
    offset_slice,
    read_row_groups,
    stats_json,
)
from deltabus.records import (
    CREATE_TIME,
    LOG_SCHEMA,
    ProducerState,
    record_sizes,
    to_log_batch,
)

log = logging.getLogger(__name__)

NO_PRODUCER = ProducerState()
PRODUCER_BATCHES_REMEMBERED = 5  # as Kafka's broker: retries of the last 5 batches are answered
PARQUET_FILES_OPEN_MAX = 256  # footers kept per log; a file handle each
LOG_TXN_APP_ID = "deltabus.log"  # Delta app transaction every commit of a log sets
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """How a partition log commits and caches (taken from the cluster config)."""

    group_commit_bytes_max: int = 32 * 1024 * 1024
    group_commit_linger_ms: int = 1
    log_cache_bytes_max: int = 64 * 1024 * 1024
    checkpoint_interval: int = 100
    max_commit_retries: int = 50
    pending_bytes_max: int = 256 * 1024 * 1024  # produce requests waiting for a commit
    row_group_records_max: int = 65_536
    # How long a producer's batch that arrived ahead of its predecessor waits for it.
    sequence_wait_ms: int = 10_000


@dataclass(frozen=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int


@dataclass
class _ProducerEntry:
    """What the log knows of one idempotent producer: its epoch, the next sequence it must send,
    the futures of its last few batches (to answer retries with their first result), and the
    sequence runs a follower copied (first sequence, last sequence, first offset): a retry sent
    to a new leader is answered with the offsets the old leader gave it."""

    epoch: int
    next_sequence: int
    recent: collections.OrderedDict[int, Future[AppendResult]] = field(
        default_factory=collections.OrderedDict)
    copied: collections.deque[tuple[int, int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=PRODUCER_BATCHES_REMEMBERED))

    def remember(self, base_sequence: int, future: Future[AppendResult]) -> None:
        self.recent[base_sequence] = future
        while len(self.recent) > PRODUCER_BATCHES_REMEMBERED:
            self.recent.popitem(last=False)

    def earlier(self, base_sequence: int, records: int) -> Future[AppendResult] | None:
        """The result of a batch written before (a retry), if it is still remembered."""
        future = self.recent.get(base_sequence)
        if future is not None:
            return future
        for first_seq, last_seq, first_offset in self.copied:
            if first_seq <= base_sequence and base_sequence + records - 1 <= last_seq:
                base = first_offset + base_sequence - first_seq
                future = Future()
                future.set_result(AppendResult(base, base + records - 1, -1, -1))
                return future
        return None


@dataclass
class _PendingAppend:
    batch: pa.Table  # normalised produce batch; a log batch with its offsets when `copied`
    nbytes: int
    leader_epoch: int
    timestamp_type: int
    producer: ProducerState
    future: Future[AppendResult]
    copied: bool = False  # a follower's copy of the leader's records
    fetch_offset: int = -1  # a copy: the offset the leader read it from (-1: its first)


@dataclass(frozen=True)
class LogFile:
    """One committed data file of a log: what a follower copies whole from its leader."""

    uri: str
    size_bytes: int
    stats: str  # the add action's statistics (Delta JSON), copied into the follower's commit
    base_offset: int
    last_offset: int


@dataclass
class _PendingFiles:
    """Files copied from the leader into this table's directory, to be committed."""

    files: list[tuple[str, LogFile]]  # (name in this table, the leader's file)
    future: Future[AppendResult]
    nbytes: int = 0


@dataclass
class _PendingTruncate:
    offset: int  # the new log end offset
    future: Future[AppendResult]
    nbytes: int = 0
    # Kafka's truncateFullyAndStartAt: drop every record and continue at `offset`, which may be
    # above the log end (a follower behind its leader's log start offset).
    restart: bool = False


def _map_delta_error(e: Exception, what: str) -> errors.DeltaBusError:
    """The one place delta-rs failures become deltabus errors."""
    return errors.KafkaStorageError(f"{what}: {type(e).__name__}: {e}")


class PartitionLog:
    """A topic-partition replica: append with group commit, read offset ranges, long-poll."""

    def __init__(
        self,
        path: str,
        *,
        topic: str,
        partition: int,
        config: LogConfig = LogConfig(),
        storage_options: dict[str, str] | None = None,
        on_append: Callable[[], None] | None = None,
        replicated: bool = False,
    ) -> None:
        """Open (or create) the table at `path`.

        `on_append` runs after every change of the log end offset or high watermark. A
        `replicated` log leaves the high watermark to its owner (the broker's Partition, which
        knows the ISR) through `advance_high_watermark`; otherwise it follows the log end offset.
        """
        self.path = path
        self.topic = topic
        self.partition = partition
        self._config = config
        self._storage_options = storage_options
        self._on_append = on_append
        # Row groups of a bounded size carry offset statistics, so a range read inside a large
        # group-committed file skips the row groups it does not need.
        self._writer_properties = WriterProperties(
            max_row_group_size=config.row_group_records_max)
        self._table = self._open_or_create()
        self._reader = DeltaTable(path, storage_options=storage_options)
        # Versions the table objects were loaded at (see _renew_writer)
        self._table_base = self._reader_base = self._table.version()
        self._reader_lock = threading.Lock()
        self._version = self._table.version()  # read by other threads instead of self._table
        self._files_version = -1
        self._files_cache = pa.table({})
        self._fs, self._fs_base = pafs.FileSystem.from_uri(path)
        self._parquet_files: dict[str, pq.ParquetFile] = {}
        self.log_start_offset, self.log_end_offset = self._recover_offsets(self._table)
        self._replicated = replicated
        # A replicated log does not know which of its records the ISR holds until its owner says.
        self.high_watermark = self.log_start_offset if replicated else self.log_end_offset
        self._hw_waiters: list[tuple[int, int, Future[int]]] = []  # heap: (offset, id, future)
        self._epochs: list[tuple[int, int]] = self._recover_epochs()  # (epoch, start offset)
        self._lock = threading.Condition()
        self._pending: collections.deque[_PendingAppend | _PendingFiles | _PendingTruncate] = (
            collections.deque())
        self._pending_bytes = 0
        self._cache: collections.deque[pa.Table] = collections.deque()
        self._cache_bytes = 0
        self._closed = False
        self._committing = False  # a group is taken off _pending but not yet committed
        self._producers: dict[int, _ProducerEntry] = {}
        self._appender = threading.Thread(
            target=self._append_loop, name=f"appender-{topic}-{partition}", daemon=True
        )
        self._appender.start()

    # ---- opening ---------------------------------------------------------------------------

    def _open_or_create(self) -> DeltaTable:
        try:
            return DeltaTable(self.path, storage_options=self._storage_options)
        except TableNotFoundError:
            pass
        try:
            return DeltaTable.create(
                self.path,
                LOG_SCHEMA,
                mode="ignore",
                name=f"{self.topic}-{self.partition}",
                description=f"deltabus log of topic {self.topic} partition {self.partition}",
                configuration={
                    "delta.checkpointInterval": str(self._config.checkpoint_interval),
                    "delta.dataSkippingNumIndexedCols": "3",
                },
                storage_options=self._storage_options,
            )
        except DeltaError as e:
            raise _map_delta_error(e, f"cannot create {self.path}") from e

    @staticmethod
    def _recover_offsets(table: DeltaTable) -> tuple[int, int]:
        """(log start offset, log end offset) from the table alone: per-file offset statistics.

        Open time does not grow with the number of commits: delta-rs loads the last checkpoint and
        the commits after it, and the statistics are in the add actions it already holds.
        """
        actions = pa.table(table.get_add_actions(flatten=True))
        if actions.num_rows == 0:  # empty, or emptied by restart_at: the last commit says where
            end = table.transaction_version(LOG_TXN_APP_ID) or 0
            return end, end
        lo = pc.min(actions.column("min.offset")).as_py()
        hi = pc.max(actions.column("max.offset")).as_py()
        if lo is None or hi is None:  # files without statistics: read the column
            offsets = table.to_pyarrow_dataset().to_table(columns=["offset"]).column("offset")
            lo, hi = pc.min(offsets).as_py(), pc.max(offsets).as_py()
        return int(lo), int(hi) + 1

    def _recover_epochs(self) -> list[tuple[int, int]]:
        """(leader epoch, first offset) of every epoch in the log, from Parquet statistics: a
        row group holding one epoch is not read, so this is cheap however long the log is."""
        starts: dict[int, int] = {}
        for path in self._files().column("path").to_pylist():
            reader = self._parquet_file(path)
            columns = leaf_columns(reader)
            for group in range(reader.metadata.num_row_groups):
                meta = reader.metadata.row_group(group)
                epoch_stats = meta.column(columns["leader_epoch"]).statistics
                offset_stats = meta.column(columns["offset"]).statistics
                if (epoch_stats is not None and epoch_stats.has_min_max
                        and offset_stats is not None and offset_stats.has_min_max
                        and epoch_stats.min == epoch_stats.max):
                    _merge_epoch_start(starts, int(epoch_stats.min), int(offset_stats.min))
                    continue
                part = reader.read_row_group(group, columns=["offset", "leader_epoch"])
                for epoch, start in _epoch_starts(part):
                    _merge_epoch_start(starts, epoch, start)
        return sorted(starts.items())

    # ---- leader epochs -----------------------------------------------------------------------

    @property
    def last_epoch(self) -> int:
        """The leader epoch of the last record (-1 for an empty log): a follower's
        `last_fetched_epoch`."""
        with self._lock:
            return self._epochs[-1][0] if self._epochs else -1

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch: (the largest epoch at most `epoch`, the first offset
        after it) — where a follower that last fetched `epoch` must truncate to. (-1, -1) when the
        log has no records; (`epoch`, start of the first epoch) when `epoch` is older than all."""
        with self._lock:
            epochs, leo = list(self._epochs), self.log_end_offset
        if not epochs:
            return -1, -1
        i = bisect.bisect_right([e for e, _ in epochs], epoch) - 1
        if i < 0:
            return epoch, epochs[0][1]
        end = epochs[i + 1][1] if i + 1 < len(epochs) else leo
        return epochs[i][0], end

    # ---- appending -------------------------------------------------------------------------

    def append(
        self,
        batch: pa.Table,
        *,
        leader_epoch: int,
        timestamp_type: int = CREATE_TIME,
        producer: ProducerState = NO_PRODUCER,
        max_message_bytes: int | None = None,
        compacted: bool = False,
    ) -> Future[AppendResult]:
        """Queue a normalised produce batch for the next group commit; the future resolves once
        the Delta commit holding it succeeded.

        A batch of an idempotent producer is queued in its sequence order: one that arrives
        before its predecessor waits for it (pipelined requests may be served out of order),
        and a retried one gets the future of its first append (no duplicate). Checks run before
        anything is queued, so a bad batch changes nothing (it only uses up its sequence numbers,
        so the producer's later batches are not held up).
        """
        future: Future[AppendResult] = Future()
        item = _PendingAppend(batch, batch.nbytes, leader_epoch, timestamp_type, producer, future)
        with self._lock:
            self._check_open()
            while self._pending_bytes > self._config.pending_bytes_max and not self._closed:
                self._lock.wait(0.1)  # back-pressure: the producer waits for the commits
            entry = None
            if producer.producer_id >= 0:
                entry, duplicate = self._await_sequence(producer, batch.num_rows)
                if duplicate is not None:
                    return duplicate
                entry.next_sequence = producer.base_sequence + batch.num_rows
                self._lock.notify_all()
            self._check_open()
            _check_records(batch, max_message_bytes)
            if compacted and batch.column("key").null_count:
                raise errors.InvalidRecordError(
                    f"Compacted topic cannot accept message without key in topic partition "
                    f"{self.topic}-{self.partition}.")
            self._pending.append(item)
            self._pending_bytes += item.nbytes
            if entry is not None:
                entry.remember(producer.base_sequence, future)
            self._lock.notify_all()
        return future

    def _check_open(self) -> None:
        if self._closed:
            raise errors.NotLeaderOrFollowerError(
                f"{self.topic}-{self.partition} is closed on this broker")

    def _await_sequence(
        self, producer: ProducerState, records: int
    ) -> tuple[_ProducerEntry, Future[AppendResult] | None]:
        """Wait (lock held) until `producer`'s batch is next in its sequence. Returns the entry,
        and the first append's future when the batch is a retry of one already queued."""
        deadline = time.monotonic() + self._config.sequence_wait_ms / 1000
        while True:
            entry = self._producer_entry(producer)
            if producer.producer_epoch < entry.epoch:
                raise errors.InvalidProducerEpochError(
                    f"producer {producer.producer_id} epoch {producer.producer_epoch} is older "
                    f"than {entry.epoch}")
            if producer.base_sequence < entry.next_sequence:
                earlier = entry.earlier(producer.base_sequence, records)
                if earlier is None:
                    log.warning("%s-%d: producer %d sequence %d is below %d and not remembered",
                                self.topic, self.partition, producer.producer_id,
                                producer.base_sequence, entry.next_sequence)
                    raise errors.DuplicateSequenceNumberError(
                        f"sequence {producer.base_sequence} of producer {producer.producer_id} "
                        f"was written long ago (next is {entry.next_sequence})")
                return entry, earlier
            if producer.base_sequence == entry.next_sequence or self._closed:
                return entry, None
            left = deadline - time.monotonic()
            if left <= 0:  # never skip the gap: its batch may still come, and be lost then
                log.warning("%s-%d: producer %d sequence %d waited %d ms for %d (remembered "
                            "%s, copied %s)", self.topic, self.partition, producer.producer_id,
                            producer.base_sequence, self._config.sequence_wait_ms,
                            entry.next_sequence, list(entry.recent), list(entry.copied)[-3:])
                raise errors.OutOfOrderSequenceNumberError(
                    f"producer {producer.producer_id} sent sequence {producer.base_sequence} "
                    f"but {entry.next_sequence} is next on {self.topic}-{self.partition}")
            self._lock.wait(left)

    def _producer_entry(self, producer: ProducerState) -> _ProducerEntry:
        """Lock held. What the log knows of a producer; one it has not seen since it opened is
        looked up in the table (its first batch may be a retry of one written before a restart
        or by an earlier leader)."""
        pid = producer.producer_id
        if pid not in self._producers:
            self._recover_producer(pid)
        entry = self._producers.get(pid)
        if entry is None or producer.producer_epoch > entry.epoch:
            entry = self._producers[pid] = _ProducerEntry(producer.producer_epoch, 0)
        return entry

    def _recover_producer(self, producer_id: int) -> None:
        """Lock held. Rebuild a producer's state from the records it wrote. Only row groups
        whose producer_id statistics may hold it are read: a new producer's id is above every
        id written before, so for it this reads no data at all."""
        parts = []
        for path in self._files().column("path").to_pylist():
            reader = self._parquet_file(path)
            column = leaf_columns(reader).get("producer_id")
            for group in range(reader.metadata.num_row_groups):
                stats = (reader.metadata.row_group(group).column(column).statistics
                         if column is not None else None)
                if stats is not None and stats.has_min_max and not (
                        stats.min <= producer_id <= stats.max):
                    continue
                part = reader.read_row_group(
                    group, columns=["offset", "producer_id", "producer_epoch", "sequence"])
                parts.append(part.filter(pc.equal(part.column("producer_id"), producer_id)))
        if parts:
            self._note_copied_producers(pa.concat_tables(parts).sort_by("offset"))

    def append_copy(self, records: pa.Table, fetch_offset: int = -1) -> Future[AppendResult]:
        """Queue records copied from the leader, with their offsets, epochs and producer fields,
        for the next group commit. They must start at the log end offset (after whatever is
        queued before them); otherwise the future fails and nothing is written. A copy that
        is the leader's answer to a read from `fetch_offset` may start above it, if that is the
        log end: a compacted topic's leader has no records in between."""
        if records.num_rows == 0:
            raise errors.InvalidRecordError("a copied batch must hold at least one record")
        if not records.schema.equals(LOG_SCHEMA):
            records = records.select(LOG_SCHEMA.names).cast(LOG_SCHEMA)
        future: Future[AppendResult] = Future()
        item = _PendingAppend(records, records.nbytes, -1, CREATE_TIME, NO_PRODUCER, future,
                              copied=True, fetch_offset=fetch_offset)
        self._enqueue(item)
        return future

    def append_files(self, files: list[LogFile]) -> Future[AppendResult]:
        """Copy a leader's committed data files, byte for byte, into this table's directory and
        queue one commit adding them with their statistics: a follower's copy without decoding
        or encoding a record. They must continue the log end offset when committed."""
        if not files:
            raise errors.InvalidRecordError("no files to copy")
        copied = []
        for leader_file in files:
            name = posixpath.basename(leader_file.uri)
            source_fs, source = pafs.FileSystem.from_uri(leader_file.uri)
            target = posixpath.join(self._fs_base, name)
            if source_fs.type_name == self._fs.type_name:
                self._fs.copy_file(source, target)
            else:
                pafs.copy_files(source, target, source_filesystem=source_fs,
                                destination_filesystem=self._fs)
            copied.append((name, leader_file))
        future: Future[AppendResult] = Future()
        self._enqueue(_PendingFiles(copied, future))
        return future

    def truncate_to(self, offset: int) -> Future[AppendResult]:
        """Queue the removal of every record at or after `offset` (a follower dropping what it
        holds beyond its new leader's log). The future holds (offset, offset - 1)."""
        if offset < self.log_start_offset:
            raise errors.OffsetOutOfRangeError(
                f"cannot truncate {self.topic}-{self.partition} to {offset}, below its log start "
                f"offset {self.log_start_offset}")
        future: Future[AppendResult] = Future()
        self._enqueue(_PendingTruncate(offset, future))
        return future

    def restart_at(self, offset: int) -> Future[AppendResult]:
        """Queue Kafka's truncateFullyAndStartAt: remove every record and continue the log at
        `offset` (a follower whose log ends below its leader's log start offset, which retention
        moved past it). The future holds (offset, offset - 1)."""
        future: Future[AppendResult] = Future()
        self._enqueue(_PendingTruncate(offset, future, restart=True))
        return future

    def refresh(self) -> None:
        """Take in commits another process made to the table (the log cleaner's, which remove
        or rewrite old files): the data files to read and the log start offset. The cache of
        recent records is dropped, as compaction may have removed some of them."""
        with self._lock:
            self._cache.clear()
            self._cache_bytes = 0
        with self._reader_lock:
            self._update_reader()
        self._files()

    def _enqueue(self, item: _PendingAppend | _PendingFiles | _PendingTruncate) -> None:
        with self._lock:
            self._check_open()
            self._pending.append(item)
            self._pending_bytes += item.nbytes
            self._lock.notify_all()

    # ---- the high watermark ------------------------------------------------------------------

    def advance_high_watermark(self, offset: int) -> None:
        """Move the high watermark up to `offset` (never past the log end offset, never back)."""
        with self._lock:
            ready = self._set_high_watermark(offset)
        self._after_change(ready)

    def await_high_watermark(self, offset: int) -> Future[int]:
        """A future resolved (with the high watermark) once the high watermark passes `offset`:
        acks=all waits on it. It fails when the log closes or `fail_waiters` is called."""
        future: Future[int] = Future()
        with self._lock:
            if self.high_watermark > offset:
                future.set_result(self.high_watermark)
            else:
                heapq.heappush(self._hw_waiters, (offset, id(future), future))
        return future

    def fail_waiters(self, error: errors.DeltaBusError) -> None:
        """Fail every high-watermark waiter (the broker lost leadership: acks=all cannot be
        promised any more)."""
        with self._lock:
            waiters, self._hw_waiters = self._hw_waiters, []
        for _, _, future in waiters:
            future.set_exception(error)

    def _set_high_watermark(self, offset: int) -> list[Future[int]]:
        """Lock held. Returns the waiters now satisfied (resolved outside the lock)."""
        offset = min(offset, self.log_end_offset)
        if offset <= self.high_watermark:
            return []
        self.high_watermark = offset
        self._lock.notify_all()
        ready = []
        while self._hw_waiters and self._hw_waiters[0][0] < offset:
            ready.append(heapq.heappop(self._hw_waiters)[2])
        return ready

    def _after_change(self, ready: list[Future[int]]) -> None:
        if self._on_append is not None:
            self._on_append()
        for future in ready:
            future.set_result(self.high_watermark)

    # ---- committing --------------------------------------------------------------------------

    def _take_group(self) -> list[_PendingAppend] | _PendingFiles | _PendingTruncate | None:
        """Wait for pending work, linger briefly for produce appends, and take a group of
        appends of one kind (produced or copied) up to the byte limit, or one file copy or
        truncation."""
        with self._lock:
            while not self._pending and not self._closed:
                self._lock.wait()
            if not self._pending:
                return None  # closed and drained
            head = self._pending[0]
            if not isinstance(head, _PendingAppend):
                self._pending.popleft()
                self._committing = True
                return head
            linger_s = self._config.group_commit_linger_ms / 1000
            if linger_s > 0 and not self._closed and not head.copied:
                deadline = time.monotonic() + linger_s
                while (self._pending_bytes < self._config.group_commit_bytes_max
                       and not self._closed):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(left)
            group: list[_PendingAppend] = []
            size = 0
            while self._pending:
                item = self._pending[0]
                if (not isinstance(item, _PendingAppend) or item.copied != head.copied
                        or (group and size + item.nbytes > self._config.group_commit_bytes_max)):
                    break
                self._pending.popleft()
                size += item.nbytes
                group.append(item)
            self._pending_bytes -= size
            self._committing = True
            self._lock.notify_all()
            return group

    def _append_loop(self) -> None:
        while True:
            work = self._take_group()
            if work is None:
                return
            try:
                if isinstance(work, _PendingTruncate):
                    self._commit_truncate(work)
                elif isinstance(work, _PendingFiles):
                    self._commit_files(work)
                else:
                    self._commit_group(work)
                self._renew_writer()
            finally:
                with self._lock:
                    self._committing = False
                    self._lock.notify_all()

    def _build_group(self, group: list[_PendingAppend],
                     now_ms: int) -> tuple[pa.Table, list[tuple[int, int]]]:
        """The log batch a group commits, and each item's offsets. Produced batches get offsets
        from the log end; copied ones continue it, in increasing offsets (gaps are records a
        compacted topic's cleaner removed on the leader)."""
        next_offset = self.log_end_offset
        parts = []
        results = []
        for item in group:
            if item.copied:
                first = item.batch.column("offset")[0].as_py()
                gap = first > next_offset and item.fetch_offset != next_offset
                if first < next_offset or gap or not _increasing(item.batch):
                    raise errors.InvalidRecordError(
                        f"copied records start at offset {first} but {self.topic}-"
                        f"{self.partition} continues at {next_offset} (or are out of order)")
                parts.append(item.batch)
                last = item.batch.column("offset")[-1].as_py()
            else:
                parts.append(to_log_batch(
                    item.batch, base_offset=next_offset, now_ms=now_ms,
                    leader_epoch=item.leader_epoch, timestamp_type=item.timestamp_type,
                    producer=item.producer))
                first, last = next_offset, next_offset + item.batch.num_rows - 1
            results.append((first, last))
            next_offset = last + 1
        # One chunk: delta-rs may write the chunks of a table in any order.
        table = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
        return table, results

    def _commit_properties(self, end_offset: int, metadata: dict[str, str]) -> CommitProperties:
        return CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(LOG_TXN_APP_ID, end_offset)],
            max_commit_retries=self._config.max_commit_retries,
        )

    def _commit_group(self, group: list[_PendingAppend]) -> None:
        now_ms = int(time.time() * 1000)
        base = self.log_end_offset
        copied = group[0].copied
        try:
            table, results = self._build_group(group, now_ms)
            next_offset = results[-1][1] + 1
            write_deltalake(
                self._table,
                table,
                mode="append",
                commit_properties=self._commit_properties(next_offset, {
                    "deltabus.operation": "copy" if copied else "append",
                    "deltabus.baseOffset": str(base),
                    "deltabus.lastOffset": str(next_offset - 1),
                    "deltabus.batches": str(len(group)),
                }),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True),
                writer_properties=self._writer_properties,
            )
        except Exception as e:  # delta-rs, IO, a bad copy: no offset was given out
            self._fail_from(group, e)
            return
        with self._lock:
            self._version = self._table.version()
            self.log_end_offset = next_offset
            ready = [] if self._replicated else self._set_high_watermark(next_offset)
            self._cache.append(table)
            self._cache_bytes += table.nbytes
            while self._cache_bytes > self._config.log_cache_bytes_max and len(self._cache) > 1:
                self._cache_bytes -= self._cache.popleft().nbytes
            self._note_epochs(table)
            if copied:
                self._note_copied_producers(table)
            self._lock.notify_all()
        self._after_change(ready)
        for item, (first, last) in zip(group, results, strict=True):
            item.future.set_result(AppendResult(first, last, now_ms, self.log_start_offset))

    def _renew_writer(self) -> None:
        """Appender thread, after a commit. delta-rs replays, on every commit, each commit made
        since the table object was loaded (measured: 7 ms more a commit every 100 commits, 400 ms
        a commit after 5,000): every checkpoint_interval commits the object is loaded afresh from
        the latest checkpoint, so commit time stays flat however long the broker runs."""
        if self._table.version() - self._table_base >= self._config.checkpoint_interval:
            self._table = DeltaTable(self.path, storage_options=self._storage_options)
            self._table_base = self._table.version()

    def _update_reader(self) -> None:
        """Reader lock held: bring the reader to the latest version, loading it afresh from the
        latest checkpoint every checkpoint_interval versions (as _renew_writer)."""
        if self._version - self._reader_base >= self._config.checkpoint_interval:
            self._reader = DeltaTable(self.path, storage_options=self._storage_options)
            self._reader_base = self._reader.version()
        else:
            self._reader.update_incremental()

    def _fail_from(self, group: list[_PendingAppend], e: Exception | None) -> None:
        """A commit failed (or could not be tried): it and everything queued behind it fail
        (order is kept), and the log reloads what the table holds."""
        error = (e if isinstance(e, errors.DeltaBusError)
                 else _map_delta_error(e, f"append to {self.topic}-{self.partition} failed")
                 if e is not None
                 else errors.InvalidRecordError("an earlier copy did not continue the log"))
        log.error("%s", error)
        if e is not None:
            self._reload_after_failure()
        with self._lock:
            failed: list[_PendingAppend | _PendingFiles | _PendingTruncate] = [
                *group, *self._pending]
            self._pending.clear()
            self._pending_bytes = 0
            self._producers.clear()  # rebuilt from the table on their next batch
            self._lock.notify_all()
        for item in failed:
            item.future.set_exception(error)

    def _commit_files(self, item: _PendingFiles) -> None:
        base = self.log_end_offset
        expected = base
        for _, leader_file in item.files:
            if leader_file.base_offset != expected:
                self._fail_from([], None)
                item.future.set_exception(errors.InvalidRecordError(
                    f"copied file starts at offset {leader_file.base_offset} but "
                    f"{self.topic}-{self.partition} continues at {expected}"))
                return
            expected = leader_file.last_offset + 1
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(name, f.size_bytes, {}, now_ms, True, f.stats) for name, f in item.files]
        try:
            self._table.create_write_transaction(
                actions, mode="append", schema=LOG_SCHEMA,
                commit_properties=self._commit_properties(expected, {
                    "deltabus.operation": "copy", "deltabus.baseOffset": str(base),
                    "deltabus.lastOffset": str(expected - 1),
                    "deltabus.batches": str(len(actions))}),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True))
            self._table.update_incremental()  # unlike write_deltalake, it leaves the snapshot
            # What the epoch list and producer state need, from the copies just written.
            columns = ["offset", "leader_epoch", "producer_id", "producer_epoch", "sequence"]
            written = pa.concat_tables(
                pq.read_table(posixpath.join(self._fs_base, name), columns=columns,
                              filesystem=self._fs) for name, _ in item.files)
        except Exception as e:
            self._fail_from([], e)
            item.future.set_exception(_map_delta_error(
                e, f"copying files into {self.topic}-{self.partition} failed"))
            return
        written = written.sort_by("offset")
        with self._lock:
            self._version = self._table.version()
            self.log_end_offset = expected
            self._cache.clear()  # the cache must stay a suffix of the log: these are not in it
            self._cache_bytes = 0
            self._note_epochs(written)
            self._note_copied_producers(written)
            self._lock.notify_all()
        self._after_change([])
        item.future.set_result(AppendResult(base, expected - 1, now_ms, self.log_start_offset))

    def _commit_truncate(self, item: _PendingTruncate) -> None:
        offset = item.offset
        if item.restart:
            self._commit_restart(item)
            return
        if offset < self.log_end_offset:
            try:
                self._table.update_incremental()  # a delete from an older view would conflict
                self._table.delete(
                    f'"offset" >= {offset}',
                    writer_properties=self._writer_properties,
                    commit_properties=self._commit_properties(offset, {
                        "deltabus.operation": "truncate", "deltabus.truncatedTo": str(offset)}),
                    post_commithook_properties=PostCommitHookProperties(create_checkpoint=True),
                )
            except Exception as e:
                self._fail_from([], e)
                item.future.set_exception(
                    _map_delta_error(e, f"truncating {self.topic}-{self.partition} failed"))
                return
            with self._lock:
                self._version = self._table.version()
                self.log_end_offset = offset
                self.high_watermark = min(self.high_watermark, offset)
                self._truncate_cache(offset)
                self._epochs = [(e, start) for e, start in self._epochs if start < offset]
                self._producers.clear()  # rebuilt from the table on their next batch
                self._lock.notify_all()
            log.info("truncated %s-%d to offset %d", self.topic, self.partition, offset)
            self._after_change([])
        item.future.set_result(AppendResult(offset, offset - 1, int(time.time() * 1000),
                                            self.log_start_offset))

    def _commit_restart(self, item: _PendingTruncate) -> None:
        """Remove every data file and record `item.offset` as the log end in the same commit
        (the log app transaction), so a reopened empty table starts there too."""
        offset = item.offset
        now_ms = int(time.time() * 1000)
        try:
            self._table.update_incremental()
            files = data_files(self._table, ["path", "size_bytes", "min.offset"])
            actions: list[AddAction | RemoveAction] = [
                RemoveAction(path, True, now_ms, size) for path, size in zip(
                files.column("path").to_pylist(), files.column("size_bytes").to_pylist(),
                strict=True)]
            self._table.create_write_transaction(
                actions, mode="append", schema=LOG_SCHEMA,
                commit_properties=self._commit_properties(offset, {
                    "deltabus.operation": "restart", "deltabus.restartedAt": str(offset)}),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True))
            self._table.update_incremental()
        except Exception as e:
            self._fail_from([], e)
            item.future.set_exception(
                _map_delta_error(e, f"restarting {self.topic}-{self.partition} failed"))
            return
        with self._lock:
            self._version = self._table.version()
            self.log_start_offset = self.log_end_offset = self.high_watermark = offset
            self._cache.clear()
            self._cache_bytes = 0
            self._epochs = []
            self._producers.clear()
            self._lock.notify_all()
        log.info("%s-%d emptied to start again at offset %d (below its leader's log start)",
                 self.topic, self.partition, offset)
        self._after_change([])
        item.future.set_result(AppendResult(offset, offset - 1, now_ms, offset))

    def _truncate_cache(self, offset: int) -> None:
        """Lock held: drop cached records at or after `offset`."""
        kept: collections.deque[pa.Table] = collections.deque()
        for table in self._cache:
            below = int(np.searchsorted(table.column("offset").to_numpy(), offset))
            if below:
                kept.append(table.slice(0, below))
        self._cache = kept
        self._cache_bytes = sum(t.nbytes for t in kept)

    def _note_epochs(self, table: pa.Table) -> None:
        """Lock held: extend the epoch list with the epochs a commit added."""
        for epoch, start in _epoch_starts(table):
            if not self._epochs or epoch > self._epochs[-1][0]:
                self._epochs.append((epoch, start))
            elif epoch < self._epochs[-1][0]:
                log.error("%s-%d: epoch %d at offset %d is older than epoch %d",
                          self.topic, self.partition, epoch, start, self._epochs[-1][0])

    def _note_copied_producers(self, table: pa.Table) -> None:
        """Lock held: a follower keeps the idempotent producers' state from the records it
        copies, so as a new leader it recognises a producer's retries and next sequence."""
        pids = table.column("producer_id").to_numpy()
        if not (pids >= 0).any():
            return
        seqs = table.column("sequence").to_numpy()
        epochs = table.column("producer_epoch").to_numpy()
        offsets = table.column("offset").to_numpy()
        for pid in np.unique(pids[pids >= 0]):
            rows = np.nonzero(pids == pid)[0]
            breaks = np.nonzero((np.diff(seqs[rows]) != 1) | (np.diff(offsets[rows]) != 1)
                                | (np.diff(epochs[rows]) != 0))[0] + 1
            for run in np.split(rows, breaks):
                first, last = int(run[0]), int(run[-1])
                epoch = int(epochs[last])
                entry = self._producers.get(int(pid))
                if entry is None or epoch > entry.epoch:
                    entry = self._producers[int(pid)] = _ProducerEntry(epoch, 0)
                elif epoch < entry.epoch:
                    continue
                entry.next_sequence = max(entry.next_sequence, int(seqs[last]) + 1)
                entry.copied.append((int(seqs[first]), int(seqs[last]), int(offsets[first])))

    def _reload_after_failure(self) -> None:
        """After a failed commit, trust only the table: reload it and its offsets."""
        try:
            self._table = DeltaTable(self.path, storage_options=self._storage_options)
            self._table_base = self._table.version()
            _, leo = self._recover_offsets(self._table)
        except Exception:  # the storage may still be down; the next commit will fail cleanly too
            log.exception("reloading %s after a failed commit", self.path)
            return
        with self._lock:
            self._version = self._table.version()
            self.log_end_offset = leo
            self.high_watermark = min(self.high_watermark, leo)
            if not self._replicated:
                self.high_watermark = leo
            self._cache.clear()
            self._cache_bytes = 0
        try:
            epochs = self._recover_epochs()
        except Exception:
            log.exception("reloading the epochs of %s after a failed commit", self.path)
            return
        with self._lock:
            self._epochs = epochs

    # ---- reading ---------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, upto: int | None = None,
             to_log_end: bool = False) -> pa.Table:
        """Records from `offset` up to the high watermark (the log end offset for a follower's
        fetch, `to_log_end`), or `upto`; about `max_bytes` of them but always at least one record
        when any is there (as Kafka returns at least one batch).

        Raises OffsetOutOfRangeError only when `offset` is outside [log start offset, log end
        offset]. An offset above the high watermark but within the log is a position the
        consumer may well hold: a new leader's high watermark lags the old leader's until its
        followers fetch again, so it gets no records, never a reset (as in Kafka).
        """
        with self._lock:
            leo = self.log_end_offset
            limit = leo if to_log_end else self.high_watermark
            end = limit if upto is None else min(upto, limit)
            start = self.log_start_offset
            cache = list(self._cache)
        if offset < start or offset > leo:
            raise errors.OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic}-{self.partition}: "
                f"log start offset {start}, log end offset {leo}")
        if offset >= end:
            return LOG_SCHEMA.empty_table()
        if cache and cache[0].column("offset")[0].as_py() <= offset:
            table = self._read_cache(cache, offset, end, max_bytes)
        else:
            table = self._read_table(offset, end, max_bytes)
        return _trim_to_bytes(table, max_bytes)

    @staticmethod
    def _read_cache(cache: list[pa.Table], offset: int, end: int, max_bytes: int) -> pa.Table:
        parts: list[pa.Table] = []
        size = 0
        for table in cache:
            offsets = table.column("offset").to_numpy()
            if offsets[-1] < offset:
                continue
            lo, hi = np.searchsorted(offsets, [offset, end])  # copies may have gaps
            if hi <= lo:
                break
            part = table.slice(int(lo), int(hi - lo))
            parts.append(part)
            size += part.nbytes
            if size >= max_bytes or offsets[-1] + 1 >= end:
                break
        return pa.concat_tables(parts) if parts else LOG_SCHEMA.empty_table()

    def files_from(self, offset: int, max_bytes: int) -> list[LogFile]:
        """The committed data files holding the log from exactly `offset` on, whole and in
        order, about `max_bytes` of them (at least one): what a follower copies as files. Empty
        when no file starts at `offset` (the follower then copies records)."""
        files = self._files()
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

    def _files(self) -> pa.Table:
        """The table's data files (path, offsets, size, statistics), by first offset: delta-rs's
        add actions of the committed version, cached per version."""
        with self._reader_lock:
            if self._reader.version() < self._version:
                self._update_reader()
            if self._files_version != self._reader.version():
                self._files_cache = data_files(self._reader, [*FILE_COLUMNS, *_STATS_COLUMNS])
                self._files_version = self._reader.version()
                if self._files_cache.num_rows:  # the cleaner may have removed the oldest files
                    self._raise_log_start(self._files_cache.column("min.offset")[0].as_py())
            return self._files_cache

    def _raise_log_start(self, offset: int) -> None:
        """Move the log start offset up to `offset` (never down, never past the log end). Called
        with the reader lock held, so it takes no other lock: single int stores."""
        offset = min(offset, self.log_end_offset)
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            if self.high_watermark < offset:
                self.high_watermark = offset

    def _read_table(self, offset: int, end: int, max_bytes: int) -> pa.Table:
        """Read from Parquet, touching only the files, and row groups, that hold the offsets
        (see `log_reader`); stops after about `max_bytes`."""
        parts: list[pa.Table] = []
        size = 0
        for path in files_overlapping(self._files(), offset, end).column("path").to_pylist():
            for part in read_row_groups(self._parquet_file(path), offset, end):
                parts.append(part)
                size += part.nbytes
                if size >= max_bytes:
                    break
            if size >= max_bytes:
                break
        return offset_slice(parts, offset, end)

    def _parquet_file(self, path: str) -> pq.ParquetFile:
        """An open Parquet file of this table (footers cached: files never change)."""
        reader = self._parquet_files.get(path)
        if reader is None:
            location = posixpath.join(self._fs_base, unquote(path))
            reader = pq.ParquetFile(self._fs.open_input_file(location))
            if len(self._parquet_files) >= PARQUET_FILES_OPEN_MAX:
                self._parquet_files.pop(next(iter(self._parquet_files)))
            self._parquet_files[path] = reader
        return reader

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until the high watermark passes `offset`, the log closes, or the time is up."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self.high_watermark <= offset and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return self.high_watermark > offset

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp ms) as ListOffsets answers: -1 latest, -2 earliest, -3 the record
        with the largest timestamp, else the first offset with a timestamp at or after it
        ((-1, -1) when there is none)."""
        with self._lock:
            hw, start = self.high_watermark, self.log_start_offset
        if timestamp_ms == LATEST_TIMESTAMP:
            return hw, -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return start, -1
        with self._reader_lock:
            if self._reader.version() != self._version:
                self._update_reader()
            dataset = self._reader.to_pyarrow_dataset()
        table = dataset.to_table(columns=["offset", "timestamp"],
                                 filter=pc.field("offset") < hw)
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

    # ---- closing ---------------------------------------------------------------------------

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued append is committed (or failed)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while (self._pending or self._committing) and time.monotonic() < deadline:
                self._lock.wait(0.05)
            pending = list(self._pending)
        for item in pending:
            item.future.result(max(0.0, deadline - time.monotonic()))

    def close(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, then stop the appender. Later appends are refused."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._appender.join(timeout_s)
        self.fail_waiters(errors.NotLeaderOrFollowerError(
            f"{self.topic}-{self.partition} was closed on this broker"))


@dataclass(frozen=True)
class CommitRange:
    """The offsets one Delta commit of a partition table appended."""

    version: int
    base_offset: int
    last_offset: int


def commit_ranges(table: DeltaTable, limit: int | None = None) -> list[CommitRange]:
    """Delta version -> offset range of the log's appends, newest first (at most `limit`
    commits), read from the commitInfo every append writes. Replication and streaming map
    versions to offsets and back with it; commits that appended nothing are left out."""
    out = []
    for commit in table.history(limit):
        if "deltabus.baseOffset" in commit:
            out.append(CommitRange(int(commit["version"]), int(commit["deltabus.baseOffset"]),
                                   int(commit["deltabus.lastOffset"])))
    return out


def _check_records(batch: pa.Table, max_message_bytes: int | None) -> None:
    if batch.num_rows == 0:
        raise errors.InvalidRecordError("a produce batch must hold at least one record")
    if max_message_bytes is not None:
        sizes = record_sizes(batch)
        biggest = int(sizes.max())
        if biggest > max_message_bytes:
            raise errors.MessageTooLargeError(
                f"record {int(np.argmax(sizes))} of the batch is {biggest} bytes, more than "
                f"max.message.bytes={max_message_bytes}")


def _increasing(table: pa.Table) -> bool:
    offsets = table.column("offset").to_numpy()
    return bool((np.diff(offsets) > 0).all())


def _trim_to_bytes(table: pa.Table, max_bytes: int) -> pa.Table:
    """Cut a read to about max_bytes, keeping at least one record."""
    if table.num_rows <= 1 or table.nbytes <= max_bytes:
        return table
    per_record = table.nbytes / table.num_rows
    return table.slice(0, max(1, int(max_bytes / per_record)))


def _epoch_starts(table: pa.Table) -> list[tuple[int, int]]:
    """(leader epoch, smallest offset) of each epoch among a table's records."""
    epochs = table.column("leader_epoch").to_numpy()
    offsets = table.column("offset").to_numpy()
    return [(int(e), int(offsets[epochs == e].min())) for e in np.unique(epochs)]


def _merge_epoch_start(starts: dict[int, int], epoch: int, start: int) -> None:
    starts[epoch] = min(start, starts.get(epoch, start))


# Statistics beyond the offsets that a copied file's add action carries (the table indexes its
# first three columns: offset, timestamp, timestamp_type).
_STATS_COLUMNS = ["min.timestamp", "max.timestamp", "min.timestamp_type", "max.timestamp_type",
                  "null_count.offset", "null_count.timestamp", "null_count.timestamp_type"]
