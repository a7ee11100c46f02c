"""One replica of one topic-partition, kept as a Delta table and written with delta-rs.

Runs on a broker (a Spark executor). Thread-safe: many gRPC threads append and read at once; one
commit round at a time, on the process's pool of append threads (append_pool.py), is the only
writer of its table. As Kafka's log, it is made of parts:
the appender (appender.py: the queue, group commit, offset assignment, checkpoints), the reader
(partition_reader.py: range reads, pruning, the tail cache), the producer state
(producer_state.py), the leader epochs (leader_epochs.py), the transaction state
(transactions.py), and the offsets with the waiters on the high watermark (log_offsets.py); the
commit round (commit_round.py) applies what each commit changed to all of them under one lock.
This module checks what is appended, queues it, and answers reads from the parts.

Invariants:
- Offsets are contiguous from the log start offset to the log end offset, but for the records a
  compacted topic's cleaner removed (log_tables/compaction.py); only the commit round assigns
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

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from deltabus import errors, trace
from deltabus.config import LogConfig
from deltabus.log_tables.append_pool import process_pool, shared_pool
from deltabus.log_tables.appender import (
    AppendResult,
    LogAppender,
    PendingAppend,
    PendingFiles,
    PendingLogStart,
    PendingTruncate,
    create_log_table,
)
from deltabus.log_tables.commit_round import CommitRound
from deltabus.log_tables.control_records import marker_batch
from deltabus.log_tables.delta_reads import history
from deltabus.log_tables.leader_epochs import LeaderEpochCache
from deltabus.log_tables.log_offsets import LogOffsets
from deltabus.log_tables.log_validator import Validation, checked_batch
from deltabus.log_tables.partition_reader import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    LogFile,
    PartitionReader,
)
from deltabus.log_tables.producer_state import (
    NO_PRODUCER,
    ActiveProducer,
    ProducerStateManager,
)
from deltabus.log_tables.tail_cache import TailCache, shared_budget
from deltabus.log_tables.transactions import AbortedTxn, LogTransactions
from deltabus.metrics import LogMeters
from deltabus.records import (
    CREATE_TIME,
    LOG_SCHEMA,
    ProducerState,
)
from deltabus.storage import Storage

DEFAULT_LOG_CONFIG = LogConfig()
READER_OPEN_THREADS = 8  # as many as a broker opens logs at once (LOG_OPEN_THREADS)

__all__ = ["EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_TIMESTAMP", "NO_PRODUCER",
           "ActiveProducer", "AppendResult", "CommitRange", "LogConfig", "LogFile",
           "PartitionLog", "commit_ranges", "create_log_table"]


class PartitionLog:
    """A topic-partition replica: append with group commit, read offset ranges, long-poll."""

    def __init__(
        self,
        path: str,
        *,
        topic: str,
        partition: int,
        config: LogConfig = DEFAULT_LOG_CONFIG,
        storage: Storage | None = None,
        on_append: Callable[[], None] | None = None,
        replicated: bool = False,
        create: bool = True,
        meters: LogMeters | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        """Open the table at `path`; a missing one is created empty only when `create` says so
        (a log of its own: tests, benchmarks), else it raises KafkaStorageError.

        A replica's table is never created here (brokers and catch-up jobs pass False): the
        controller creates it with its partition or replica assignment, so a table that is
        missing later was lost, and recreating it empty would make its replica a leader or
        in-sync follower holding nothing, whose followers truncate to it.

        `storage` reaches the table's root (by default `path`'s store, with no options).

        `on_append` runs after every change of the log end offset or high watermark. A
        `replicated` log leaves the high watermark to its owner (the broker's Partition, which
        knows the ISR) through `advance_high_watermark`; otherwise it follows the log end offset.

        `leader_epoch`: a diskless partition's log, opened by its leader at that epoch, which
        claims the table first (LogAppender.claim): what an earlier leader committed is read
        after its last commit, and that leader can commit nothing more.
        """
        self.path = path
        self.topic = topic
        self.partition = partition
        self._name = f"{topic}-{partition}"
        self._config = config
        self.claimed_epoch = leader_epoch  # a diskless leader's claim; None for a replica
        self._traced = trace.traced(topic)  # stamps for the latency trace (deltabus.trace)
        self._lock = threading.Condition()
        storage = storage or Storage(path)

        def open_reader() -> PartitionReader:  # it catches up to the log before it answers
            return PartitionReader(
                path, storage=storage, checkpoint_interval=config.checkpoint_interval,
                committed_version=lambda: self._offsets.version,
                on_log_start=lambda offset: self._offsets.raise_log_start(offset))

        # A table that exists is loaded by the reader beside the appender's load and a
        # diskless leader's claim (a commit to the store), not after them: a new leader's
        # open is what a failover waits for (issue 44).
        started = time.monotonic()
        reader = None if create else process_pool(
            "deltabus-reader-open", READER_OPEN_THREADS).submit(open_reader)
        self._appender = LogAppender(path, topic=topic, partition=partition, config=config,
                                     storage=storage, lock=self._lock, create=create,
                                     leader_epoch=leader_epoch)
        log_start_offset, log_end_offset = self._appender.offsets
        # A replicated log does not know which of its records the ISR holds until its owner says.
        self._offsets = LogOffsets(
            self._lock, topic=topic, partition=partition,
            version=self._appender.table.version(), log_start_offset=log_start_offset,
            log_end_offset=log_end_offset,
            high_watermark=log_start_offset if replicated else log_end_offset,
            on_append=on_append, traced=self._traced)
        loaded = time.monotonic()
        self._reader = reader.result() if reader is not None else open_reader()
        read = time.monotonic()
        self._producers = ProducerStateManager(
            self._name, self._lock, self._reader.producer_files, self._reader.producer_id_max,
            config.sequence_wait_ms)
        self._epochs = LeaderEpochCache(self._name, self._reader.leader_epochs())
        self.open_phases = (f"table {loaded - started:.1f} s, reader {read - loaded:.1f} s more, "
                            f"leader epochs {time.monotonic() - read:.1f} s")  # the broker logs it
        self._tail = TailCache(config.log_cache_bytes_max,
                               shared_budget(config.log_cache_total_bytes_max))
        self._txns = LogTransactions(self._reader.parquet_files)  # transactions.py
        self._closed = False
        self._commits = CommitRound(  # commits this log's queue on the process's append pool
            self, path=path, topic=topic, partition=partition, lock=self._lock,
            pool=shared_pool(config.append_threads), appender=self._appender,
            offsets=self._offsets, reader=self._reader, tail=self._tail, epochs=self._epochs,
            producers=self._producers, txns=self._txns, replicated=replicated,
            traced=self._traced, closed=lambda: self._closed, meters=meters)
        self._meters = meters

    @property
    def log_start_offset(self) -> int:
        """The first offset in the log (DeleteRecords, retention and compaction move it up)."""
        return self._offsets.log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next record appended gets: one past the last one committed."""
        return self._offsets.log_end_offset

    @property
    def high_watermark(self) -> int:
        """Consumers read below it: what the in-sync replicas all hold (a log that is not
        replicated: its log end offset)."""
        return self._offsets.high_watermark

    # ---- leader epochs -----------------------------------------------------------------------

    @property
    def last_epoch(self) -> int:
        """The leader epoch of the last record (-1 for an empty log): a follower's
        `last_fetched_epoch`."""
        with self._lock:
            return self._epochs.latest

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch: (the largest epoch at most `epoch`, the first offset
        after it) — where a follower that last fetched `epoch` must truncate to. (-1, -1) when the
        log has no records; (`epoch`, start of the first epoch) when `epoch` is older than all."""
        with self._lock:
            return self._epochs.end_offset_for(epoch, self.log_end_offset)

    # ---- appending -------------------------------------------------------------------------

    def append(
        self,
        batch: pa.Table,
        *,
        leader_epoch: int,
        timestamp_type: int = CREATE_TIME,
        producer: ProducerState = NO_PRODUCER,
        max_message_bytes: int | None = None,
        batch_bytes: int | None = None,
        compacted: bool = False,
        timeout_ms: int | None = None,
        in_order: bool = False,
        validate: Validation | None = None,
    ) -> Future[AppendResult]:
        """Queue a produce batch (PRODUCE_SCHEMA's columns, or a subset `normalize_produce`
        completes) for the next group commit; the future resolves once the Delta commit holding
        it succeeded.

        A batch of an idempotent producer is queued in its sequence order: one that arrives
        before its predecessor waits for it (pipelined requests may be served out of order),
        and a retried one gets the future of its first append (no duplicate). An early batch
        waits at most the config's sequence wait and `timeout_ms` (what is left of its produce
        request's timeout; None: no request bounds it), and not at all `in_order` (the Kafka
        door serves a connection's requests one by one: a predecessor sent behind it cannot
        come, and clients retry the answer while it is unacknowledged), then fails with
        OUT_OF_ORDER_SEQUENCE_NUMBER. Back-pressure (more than pending_bytes_max waiting for
        its commit) holds it no longer than `timeout_ms` either, then REQUEST_TIMED_OUT with
        nothing queued. Checks run before anything is queued, so a bad batch changes nothing
        (it only uses up its sequence numbers, so the producer's later batches are not held up).

        `max_message_bytes` limits each record batch, as Kafka does: its size as the client sent
        it (`batch_bytes`, a Kafka client's record batch, compressed or not) or else the size of
        each Arrow record batch of `batch` as an uncompressed record batch of its records
        (`records.largest_batch_bytes`: a bulk produce entry holds many). `validate` checks the
        records further (a topic's schema validation): it raises INVALID_RECORD, a refusal like
        the others, and returns a typed topic's decoded keys and values by typed column
        (records.TYPED_COLUMNS), which the commit writes beside the records.
        """
        # Outside the lock; a refusal is raised once the sequence numbers are taken.
        batch, refusal, typed = checked_batch(batch, self._name, self._appender.typed_types,
                                              max_message_bytes, batch_bytes, compacted, validate)
        future: Future[AppendResult] = Future()
        item = PendingAppend(batch, batch.nbytes, leader_epoch, timestamp_type, producer, future,
                             queued_ns=trace.now_ns() if self._traced else 0,
                             typed=typed)
        deadline = None if timeout_ms is None else time.monotonic() + max(0, timeout_ms) / 1000
        with self._lock:
            self._check_open()
            self._await_room(deadline)
            entry = None
            if producer.producer_id >= 0:
                entry, duplicate = self._producers.await_turn(
                    producer, batch.num_rows, lambda: self._closed,
                    0 if in_order else None if deadline is None else _left_ms(deadline))
                if duplicate is not None:
                    return duplicate
                entry.next_sequence = producer.base_sequence + batch.num_rows
                self._lock.notify_all()
            self._check_open()
            if refusal is not None:
                raise refusal
            self._appender.enqueue(item)
            self._commits.schedule()
            if entry is not None:
                entry.remember(producer.base_sequence, batch.num_rows, future)
        return future

    def _await_room(self, deadline: float | None) -> None:
        """Lock held. Back-pressure: wait while more than pending_bytes_max waits for its
        commit, until `deadline` (time.monotonic(); None: as long as it takes), then
        REQUEST_TIMED_OUT with nothing queued."""
        while self._appender.pending_bytes > self._config.pending_bytes_max and not self._closed:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise errors.RequestTimedOutError(
                    f"{self._name} has more than pending_bytes_max="
                    f"{self._config.pending_bytes_max} bytes waiting for their commit; the "
                    "produce request's timeout passed first")
            self._lock.wait(left)

    def check_producer_epoch(self, producer: ProducerState) -> None:
        """INVALID_PRODUCER_EPOCH when this log knows `producer`'s id at a newer epoch: it was
        fenced (`ProducerStateManager.check_epoch`). Nothing is taken or queued."""
        with self._lock:
            self._check_open()
            self._producers.check_epoch(producer)

    def _check_open(self) -> None:
        if self._closed:
            raise errors.NotLeaderOrFollowerError(f"{self._name} is closed on this broker")

    def append_marker(self, producer_id: int, producer_epoch: int, *, committed: bool,
                      coordinator_epoch: int, leader_epoch: int) -> Future[AppendResult]:
        """Queue a transaction marker (control_records.py) of `producer_id` for the next group
        commit, naming where its transaction began here (-1: it wrote nothing here since its
        last marker; the marker is appended all the same, as Kafka appends it). The marker's
        epoch becomes the producer's epoch here: a later batch of an older epoch is fenced.
        Raises InvalidProducerEpochError, with nothing queued, when `producer_epoch` is older
        than the producer's epoch here."""
        with self._lock:
            self._check_open()
            self._producers.take_marker_epoch(producer_id, producer_epoch)
            first = self._txns.state().first_offset(producer_id)
            batch = marker_batch(committed, coordinator_epoch, first)
            future: Future[AppendResult] = Future()
            self._appender.enqueue(PendingAppend(
                batch, batch.nbytes, leader_epoch, CREATE_TIME,
                ProducerState(producer_id, producer_epoch, -1), future))
            self._commits.schedule()
        return future

    # ---- transactions ----------------------------------------------------------------------

    def reset_transactions(self, open_producers: frozenset[int]) -> None:
        """This replica became the leader: forget the transaction state (a follower does not
        keep it) and rebuild it when first needed, with `open_producers` (the metadata's
        producers with a transaction open here)."""
        with self._lock:
            self._txns.reset(open_producers)

    @property
    def stable_offset_hint(self) -> int:
        """The last stable offset as last computed, read without the lock (a waiting fetch's
        wake-up test): at or above the LSO when the state is not known yet."""
        first = self._txns.first_open
        hw = self.high_watermark
        return hw if first is None else min(hw, first)

    def last_stable_offset(self) -> int:
        """Kafka's LSO: the high watermark, or the first offset of the oldest open
        transaction below it."""
        with self._lock:
            return self._txns.state().last_stable_offset(self.high_watermark)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions with records in [start, end)."""
        with self._lock:
            return self._txns.state().aborted_between(start, end)

    def append_copy(self, records: pa.Table, fetch_offset: int = -1) -> Future[AppendResult]:
        """Queue records copied from the leader, with their offsets, epochs and producer fields,
        for the next group commit. They must start at the log end offset (after whatever is
        queued before them); otherwise the future fails and nothing is written. A copy that
        is the leader's answer to a read from `fetch_offset` may start above it, if that is the
        log end: a compacted topic's leader has no records in between."""
        if records.num_rows == 0:
            raise errors.InvalidRecordError("a copied batch must hold at least one record")
        if not records.schema.equals(LOG_SCHEMA):  # a typed topic's values come along
            extra = [n for n in records.column_names if n not in LOG_SCHEMA.names]
            log = records.select(LOG_SCHEMA.names).cast(LOG_SCHEMA)
            records = pa.Table.from_arrays(
                log.columns + [records.column(n) for n in extra],
                schema=pa.schema(list(LOG_SCHEMA) + [records.schema.field(n) for n in extra]))
        future: Future[AppendResult] = Future()
        self._enqueue(PendingAppend(records, records.nbytes, -1, CREATE_TIME, NO_PRODUCER, future,
                                    copied=True, fetch_offset=fetch_offset,
                                    queued_ns=trace.now_ns() if self._traced else 0))
        return future

    def append_files(self, files: list[LogFile]) -> Future[AppendResult]:
        """Copy a leader's committed data files, byte for byte, into this table's directory and
        queue one commit adding them with their statistics: a follower's copy without decoding
        or encoding a record. They must continue the log end offset when committed. Each copy
        is read back first: one that does not match the leader's statistics raises
        CorruptMessageError (retriable) and nothing is queued."""
        if not files:
            raise errors.InvalidRecordError("no files to copy")
        future: Future[AppendResult] = Future()
        received_ns = trace.now_ns() if self._traced else 0
        copied, records, extra = self._appender.copy_in(files)
        self._enqueue(PendingFiles(copied, records, future, queued_ns=received_ns,
                                   extra_fields=extra))
        return future

    def truncate_to(self, offset: int) -> Future[AppendResult]:
        """Queue the removal of every record at or after `offset` (a follower dropping what it
        holds beyond its new leader's log). The future holds (offset, offset - 1)."""
        if offset < self.log_start_offset:
            raise errors.OffsetOutOfRangeError(
                f"cannot truncate {self._name} to {offset}, below its log start offset "
                f"{self.log_start_offset}")
        future: Future[AppendResult] = Future()
        self._enqueue(PendingTruncate(offset, future))
        return future

    def restart_at(self, offset: int) -> Future[AppendResult]:
        """Queue Kafka's truncateFullyAndStartAt: remove every record and continue the log at
        `offset` (a follower whose log ends below its leader's log start offset, which retention
        moved past it). The future holds (offset, offset - 1)."""
        future: Future[AppendResult] = Future()
        self._enqueue(PendingTruncate(offset, future, restart=True))
        return future

    def advance_log_start(self, offset: int) -> Future[AppendResult]:
        """Queue the move of the log start offset up to `offset` (DeleteRecords on a leader, a
        follower taking its leader's), recorded in the table so it survives a restart. Reads
        below it fail OFFSET_OUT_OF_RANGE once it is committed. The future holds (offset,
        offset - 1) and the new log start offset. An offset past the log end offset is
        OFFSET_OUT_OF_RANGE; one at or below the log start offset commits nothing."""
        future: Future[AppendResult] = Future()
        with self._lock:
            if offset > self.log_end_offset or offset < 0:
                raise errors.OffsetOutOfRangeError(
                    f"cannot move the log start offset of {self._name} to {offset}: its log "
                    f"ends at {self.log_end_offset}")
            if offset <= self.log_start_offset:
                future.set_result(AppendResult(offset, offset - 1, int(time.time() * 1000),
                                               self.log_start_offset))
                return future
        self._enqueue(PendingLogStart(offset, future))
        return future

    def refresh(self) -> None:
        """Take in commits another process made to the table (the log cleaner's, which remove
        or rewrite old files): the data files to read and the log start offset. The cache of
        recent records is dropped, as compaction may have removed some of them."""
        with self._lock:
            self._tail.clear()
            self._commits.file_stats = None
        self._reader.refresh()

    def _enqueue(self, item: PendingAppend | PendingFiles | PendingTruncate | PendingLogStart
                 ) -> None:
        with self._lock:
            self._check_open()
            self._appender.enqueue(item)
            self._commits.schedule()

    # ---- the high watermark ------------------------------------------------------------------

    def advance_high_watermark(self, offset: int) -> None:
        """Move the high watermark up to `offset` (never past the log end offset, never back)."""
        with self._lock:
            ready = self._offsets.set_high_watermark(offset)
        self._offsets.after_change(ready)

    def await_high_watermark(self, offset: int) -> Future[int]:
        """A future resolved (with the high watermark) once the high watermark passes `offset`:
        acks=all waits on it. It fails when the log closes or `fail_waiters` is called."""
        return self._offsets.await_high_watermark(offset)

    def fail_waiters(self, error: errors.DeltaBusError) -> None:
        """Fail every high-watermark waiter (the broker lost leadership: acks=all cannot be
        promised any more)."""
        self._offsets.fail_waiters(error)

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
        if offset < start or offset > leo:
            raise errors.OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self._name}: "
                f"log start offset {start}, log end offset {leo}")
        if offset >= end:
            return LOG_SCHEMA.empty_table()
        table = self._tail.read(offset, end, max_bytes)
        if self._meters is not None:
            self._meters.read(from_cache=table is not None)
        if table is None:
            table = self._reader.read(offset, end, max_bytes, typed=to_log_end)
        elif table.num_columns > len(LOG_SCHEMA) and not to_log_end:
            table = table.select(LOG_SCHEMA.names)  # a typed topic's values: its followers'
        return _trim_to_bytes(table, max_bytes)

    def cached_tail_under(self, offset: int, max_bytes: int) -> bool:
        """Whether the tail cache serves the log from `offset` to its end, in fewer than
        `max_bytes` (about: whole cached commits). Looks at the newest commits only, back to
        `offset` or to `max_bytes`: a follower's every fetch asks."""
        return self._tail.holds_from(offset, max_bytes)

    def files_from(self, offset: int, max_bytes: int) -> list[LogFile]:
        """The committed data files holding the log from exactly `offset` on, whole and in
        order, about `max_bytes` of them (at least one): what a follower copies as files. Empty
        when no file starts at `offset` (the follower then copies records)."""
        return self._reader.files_from(offset, max_bytes)

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until the high watermark passes `offset`, the log closes, or the time is up."""
        return self._offsets.wait_for_data(offset, timeout_s, lambda: self._closed)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp ms) as ListOffsets answers: -1 latest, -2 earliest, -3 the record
        with the largest timestamp, else the first offset with a timestamp at or after it
        ((-1, -1) when there is none)."""
        with self._lock:
            hw, start = self.high_watermark, self.log_start_offset
        return self._reader.offset_for_timestamp(timestamp_ms, start, hw)

    # ---- describing ------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """The bytes of the table's live data files (Kafka's partition size in DescribeLogDirs),
        from the add actions the reader holds for the committed version: no listing."""
        sizes = self._reader.files().column("size_bytes")
        return int(pc.sum(sizes).as_py() or 0) if len(sizes) else 0

    def file_stats(self) -> tuple[int, int]:
        """(data files, bytes) of the table, for the broker's metrics: as its commits left
        them, counted from the reader's add actions only when unknown (a truncation, the
        cleaner's rewrite), so a scrape reads no table of a log that only appends."""
        with self._lock:
            known = self._commits.file_stats
        if known is None:
            sizes = self._reader.files().column("size_bytes")
            known = (len(sizes), int(pc.sum(sizes).as_py() or 0) if len(sizes) else 0)
            with self._lock:
                self._commits.file_stats = known
        return known

    def active_producers(self) -> list[ActiveProducer]:
        """The idempotent producers the log knows (`ProducerStateManager.active`)."""
        with self._lock:
            return self._producers.active()

    # ---- closing ---------------------------------------------------------------------------

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued append is committed (or failed)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._appender.busy() and time.monotonic() < deadline:
                self._lock.wait(0.05)
            pending = self._appender.queued()
        for item in pending:
            item.future.result(max(0.0, deadline - time.monotonic()))

    @property
    def flush_messages(self) -> int:
        """flush.messages: fsync the log's files on a local disk once this many records were
        appended since the last fsync (the topic's config; never by default)."""
        return self._appender.flush_messages

    @flush_messages.setter
    def flush_messages(self, records: int) -> None:
        self._appender.flush_messages = records

    def pace_commits(self, commit_interval_ms: int, group_commit_bytes_max: int) -> None:
        """Take a diskless topic's altered diskless.append.commit.interval.ms and
        diskless.append.buffer.max.bytes from the next commit on: as Kafka applies a topic's
        altered configs to its open logs, a user tuning the cost against the latency sees the
        change without a leader change."""
        with self._lock:
            config = self._appender.config
            if (config.commit_interval_ms, config.group_commit_bytes_max) == (
                    commit_interval_ms, group_commit_bytes_max):
                return  # every metadata version asks; most change nothing
            self._appender.config = dataclasses.replace(
                config, commit_interval_ms=commit_interval_ms,
                group_commit_bytes_max=group_commit_bytes_max)
            self._commits.schedule()  # what waited for a longer interval may go now

    def close(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, then stop the appender. Later appends are refused."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            self._commits.schedule()  # what lingers goes now
            self._lock.wait_for(lambda: not self._appender.busy(), timeout_s)
        self._appender.await_renewal(max(0.0, deadline - time.monotonic()))
        self.fail_waiters(errors.NotLeaderOrFollowerError(
            f"{self._name} was closed on this broker"))


@dataclass(frozen=True)
class CommitRange:
    """The offsets one Delta commit of a partition table appended."""

    version: int
    base_offset: int
    last_offset: int


def commit_ranges(table: DeltaTable, limit: int | None = None) -> list[CommitRange]:
    """Delta version -> offset range of the log's appends, newest first (at most `limit`
    commits), read from the commitInfo every append writes. Replication and streaming map
    versions to offsets and back with it; commits that appended nothing are left out (a
    merge names the base offset of the files it rewrote, and no last offset)."""
    out = []
    for commit in history(table, limit):
        if "deltabus.baseOffset" in commit and "deltabus.lastOffset" in commit:
            out.append(CommitRange(int(commit["version"]), int(commit["deltabus.baseOffset"]),
                                   int(commit["deltabus.lastOffset"])))
    return out


def _trim_to_bytes(table: pa.Table, max_bytes: int) -> pa.Table:
    """Cut a read to about max_bytes, keeping at least one record."""
    if table.num_rows <= 1 or table.nbytes <= max_bytes:
        return table
    per_record = table.nbytes / table.num_rows
    return table.slice(0, max(1, int(max_bytes / per_record)))


def _left_ms(deadline: float) -> int:
    """What is left until `deadline` (time.monotonic()), in whole ms, never below 0."""
    return max(0, int((deadline - time.monotonic()) * 1000))
