"""The one writer of a partition table: group commit, offset assignment, checkpoints.

Produce batches, a follower's copies (records or whole files) and truncations queue here, under
the log's lock. The log's commit round (on the append pool) takes them in groups when
`ready_at` says they may go (`take`): produce batches queued while the commit before ran (and
within `group_commit_linger_ms` of the first, when set), up to `group_commit_bytes_max`, become
one Delta commit (`commit`), which gives them their offsets from the log end as it is written, so a
failed commit leaves no gap. Every commit sets the Delta app transaction `deltabus.log` to the
log end offset it leaves, so two processes writing one table conflict and one fails, and
delta-rs writes a checkpoint every `checkpoint_interval` versions (`renew`).

What a commit changed comes back as `Committed`; the log's commit round applies it to its
offsets, cache, epochs and producers (commit_round.py). A follower's whole files are copied into
the table's directory and read back before they are queued (file_copies.py).
"""

from __future__ import annotations

import collections
import logging
import posixpath
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction

from deltabus import errors
from deltabus.config import LogConfig
from deltabus.log_tables.append_pool import process_pool
from deltabus.log_tables.delta_commit import (
    CommitConflict,
    DataFile,
    DeltaCommitWriter,
    FencedWriter,
    commit_file,
    indexed_columns,
    remove_action,
    stats_columns,
)
from deltabus.log_tables.delta_reads import open_table, update
from deltabus.log_tables.delta_writes import (
    APPEND_COMMIT_RETRIES,
    commit_properties,
    log_table_schema,
    typed_column_types,
    writer_properties,
)
from deltabus.log_tables.file_copies import FileCopier
from deltabus.log_tables.log_reader import LOG_START_TXN_APP_ID, STATS_COLUMNS, data_files
from deltabus.log_tables.partition_reader import LogFile
from deltabus.records import (
    LOG_SCHEMA,
    TYPED_COLUMNS,
    ProducedBatch,
    ProducerState,
    to_log_group,
)
from deltabus.storage import Storage, storage_error

log = logging.getLogger(__name__)

LOG_TXN_APP_ID = "deltabus.log"  # Delta app transaction every commit of a log sets
# A diskless partition's leaders stamp their leader epoch on every commit (`LogAppender.claim`)
LEADER_EPOCH_TXN_APP_ID = "deltabus.leaderEpoch"
CLAIM_TRIES = 50  # a new leader's claims lost to the previous leader's last commits
# The appender checkpoints itself (`renew`), at the broker's interval, not the table's.
_NO_CHECKPOINT_HOOK = PostCommitHookProperties(create_checkpoint=False)
NEVER_FLUSH = 2**63 - 1  # flush.messages's default, as Kafka's: fsync is left to the system


@dataclass(frozen=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int


@dataclass
class PendingAppend:
    batch: pa.Table  # normalised produce batch; a log batch with its offsets when `copied`
    nbytes: int
    leader_epoch: int
    timestamp_type: int
    producer: ProducerState
    future: Future[AppendResult]
    copied: bool = False  # a follower's copy of the leader's records
    fetch_offset: int = -1  # a copy: the offset the leader read it from (-1: its first)
    queued_ns: int = 0  # when it was queued, for the latency trace (deltabus.trace)
    # a typed topic's decoded keys or values, by typed column (records.TYPED_COLUMNS)
    typed: Mapping[str, pa.Array] = field(default_factory=dict)


@dataclass
class PendingFiles:
    """Files copied from the leader into this table's directory and read back, to be
    committed."""

    files: list[tuple[str, LogFile]]  # (name in this table, the leader's file)
    records: pa.Table  # the copies' offset, epoch and producer columns, as read back
    future: Future[AppendResult]
    nbytes: int = 0
    queued_ns: int = 0  # when the copies were begun, for the latency trace (deltabus.trace)
    # columns the copies hold beyond the log's (a typed topic's): the table's schema gains them
    extra_fields: tuple[pa.Field, ...] = ()


@dataclass
class PendingTruncate:
    offset: int  # the new log end offset
    future: Future[AppendResult]
    nbytes: int = 0
    # Kafka's truncateFullyAndStartAt: drop every record and continue at `offset`, which may be
    # above the log end (a follower behind its leader's log start offset).
    restart: bool = False


@dataclass
class PendingLogStart:
    """DeleteRecords: record `offset` as the log start offset (a commit with no data)."""

    offset: int
    future: Future[AppendResult]
    nbytes: int = 0


Pending = PendingAppend | PendingFiles | PendingTruncate | PendingLogStart
Work = list[PendingAppend] | PendingFiles | PendingTruncate | PendingLogStart


@dataclass(frozen=True)
class Committed:
    """What one commit did, for the log to apply before it resolves the futures."""

    kind: str  # "append", "copy", "files", "truncate", "restart" or "log_start"
    version: int  # the table version it made (the last one, if it made none)
    end_offset: int  # the log end offset it leaves
    # append and copy: the records written; files: their offset, epoch and producer columns
    records: pa.Table | None
    results: list[tuple[Future[AppendResult], int, int]]  # (future, first offset, last offset)
    now_ms: int
    log_start_offset: int = -1  # log_start: the log start offset it recorded
    # append: (producer id, first offset) of each transactional batch it holds
    txn_begins: tuple[tuple[int, int], ...] = ()
    built_ns: int = 0  # append and copy: its log batch built, before delta-rs writes it
    committed_ns: int = 0  # append and copy: its Delta commit written
    # append, copy and files: (data files, bytes) the commit added; None where not known
    added: tuple[int, int] | None = None


class CommitFailed(Exception):
    """A commit failed, or could not be tried: nothing of it was written. The work's futures
    fail with `error`, everything queued behind it with `pending_error` (order is kept), and
    after a failed Delta commit (`reload`) the log trusts only what the table holds."""

    def __init__(self, error: errors.DeltaBusError, pending_error: errors.DeltaBusError,
                 reload: bool, fenced: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.pending_error = pending_error
        self.reload = reload
        self.fenced = fenced  # another writer of this log committed (FencedWriter)


def log_offsets(table: DeltaTable) -> tuple[int, int]:
    """(log start offset, log end offset) from the table alone: per-file offset statistics,
    and the log start offset DeleteRecords recorded (`recorded_log_start`), whichever is larger:
    a file straddling it stays, its records below it are no longer in the log.

    Open time does not grow with the number of commits: delta-rs loads the last checkpoint and
    the commits after it, and the statistics and app transactions are in what it already holds.
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
    end = int(hi) + 1
    return min(max(int(lo), recorded_log_start(table)), end), end


def recorded_log_start(table: DeltaTable) -> int:
    """The log start offset DeleteRecords recorded in `table` (0 when none was)."""
    return table.transaction_version(LOG_START_TXN_APP_ID) or 0


def create_log_table(path: str, *, topic: str, partition: int, checkpoint_interval: int,
                     storage_options: dict[str, str] | None = None) -> DeltaTable:
    """Create the empty Delta table of a partition log at `path` (an existing one is kept as
    it is). Raises KafkaStorageError when the storage refuses.

    A create that fails is checked against the store: on an object store, delta-rs's put of
    version 0 can land with its answer lost, be refused on retry by its own file, and be
    tried again at version 1; when that answer is lost too, delta-rs reports a conflict
    ("protocol changed") though the table is there. A table that opens is the table asked
    for (mode "ignore" keeps an existing one in any case)."""
    try:
        return DeltaTable.create(
            path,
            LOG_SCHEMA,
            mode="ignore",
            name=f"{topic}-{partition}",
            description=f"deltabus log of topic {topic} partition {partition}",
            configuration={
                "delta.checkpointInterval": str(checkpoint_interval),
                "delta.dataSkippingNumIndexedCols": "3",  # for readers without the next
                "delta.dataSkippingStatsColumns": ",".join(STATS_COLUMNS),
            },
            storage_options=storage_options,
        )
    except DeltaError as e:
        try:
            return open_table(path, storage_options=storage_options)
        except Exception:
            raise storage_error(e, f"cannot create {path}") from e


class LogAppender:
    """The queue of a log's pending writes and the Delta commits that take them."""

    def __init__(self, path: str, *, topic: str, partition: int, config: LogConfig,
                 storage: Storage, lock: threading.Condition,
                 create: bool = True, leader_epoch: int | None = None) -> None:
        """Open the table at `path`, creating it if it is missing and `create` says so (else
        a missing table raises KafkaStorageError). `lock` is the log's: it guards the queue.
        `leader_epoch`: a diskless partition's leader at that epoch, which claims the table
        before anything is read from it (`claim`)."""
        self.path = path
        self._topic, self._partition = topic, partition
        self._name = f"{topic}-{partition}"  # in messages
        self.config = config  # a diskless log's pacing changes with its topic's configs
        self._storage = storage
        self._lock = lock
        # delta-rs's view of the table: opened, reloaded, checkpointed and used for what
        # changes its schema or rewrites files; behind the writer's version in between.
        self.table = self._open(create)
        self._table_base = self.table.version()  # loaded afresh at this version
        # (log start, log end offset) as opened: app transactions cost delta-rs a log replay
        self.offsets = log_offsets(self.table)
        # The appends' own commits (delta_commit.py), from the version the table was opened at
        self._writer = DeltaCommitWriter(
            storage, path, self.table.version(),
            indexed_columns=indexed_columns(self.table.metadata().configuration),
            stats_columns=stats_columns(self.table.metadata().configuration),
            fence_app_id=LOG_TXN_APP_ID, retries=APPEND_COMMIT_RETRIES,
            epoch_app_id=LEADER_EPOCH_TXN_APP_ID if leader_epoch is not None else None,
            epoch=leader_epoch if leader_epoch is not None else -1)
        if leader_epoch is not None:
            self.claim()
        self._schema = pa.schema(self.table.schema().to_arrow())  # as committed
        # A typed topic's typed columns' types, as committed: produce checks read them
        self.typed_types = typed_column_types(self.table)
        # A checkpoint being written and the table loaded afresh from it (`renew`)
        self._renewing: Future[tuple[int, DeltaTable]] | None = None
        self._pending: collections.deque[Pending] = collections.deque()
        self.pending_bytes = 0
        self.committing = False  # a group is taken off the queue but not yet committed
        # flush.messages (the broker sets it from the topic's config): the records appended
        # and the files committed since the last fsync
        self.flush_messages = NEVER_FLUSH
        self._unflushed: list[str] = []
        self._unflushed_records = 0
        self._head_since = 0.0  # when the queue's head became its head: its linger starts
        self._commit_began_s = 0.0  # when the last group of appends was taken to commit
        self._copier = FileCopier(path, storage, self._name)  # a follower's file copies

    def claim(self) -> None:
        """A diskless partition's new leader stamps its epoch on the table (a commit of app
        transactions only) before it reads the table's end: a previous leader still running
        loses its next commit to this one and stops (FencedWriter), and what it committed first
        is in the log this leader goes on from; only the claim's commit is read in after it. No
        byte is copied. NOT_LEADER_OR_FOLLOWER when a newer leader already stamped it."""
        epoch = self._writer.epoch
        for _ in range(CLAIM_TRIES):
            stamped = self.table.transaction_version(LEADER_EPOCH_TXN_APP_ID)
            if stamped is not None and stamped > epoch:
                raise errors.NotLeaderOrFollowerError(f"{self._name} was claimed at leader "
                                                      f"epoch {stamped}, newer than {epoch}")
            if stamped == epoch:  # this leadership's claim, from an earlier open
                return
            try:
                claimed = self._writer.commit(txns=self._txns(self.offsets[1]),
                                              info=self._info("claim", leaderEpoch=str(epoch)))
            except CommitConflict:  # the previous leader's last commit landed first
                self.reload()
                continue
            except FencedWriter as e:  # a newer leader claimed it meanwhile
                raise errors.NotLeaderOrFollowerError(f"claiming {self._name}: {e}") from e
            update(self.table)  # the claim's commit, and any a newer leader made since
            if self.table.version() > claimed:
                self.offsets = log_offsets(self.table)
            self._writer.catch_up(self.table.version())
            return
        raise errors.NotLeaderOrFollowerError(
            f"{self._name}: {CLAIM_TRIES} claims in a row lost to another writer's commits")

    def superseded(self) -> bool:
        """A diskless partition's table, as last loaded, claimed by a leader of a newer epoch
        than this writer's: this leader commits nothing more (after its reload the writer
        would otherwise commit on top of the claim)."""
        if self._writer.epoch_app_id is None:
            return False
        stamped = self.table.transaction_version(LEADER_EPOCH_TXN_APP_ID)
        return stamped is not None and stamped > self._writer.epoch

    @property
    def version(self) -> int:
        """The table's latest version as this appender committed or loaded it."""
        return self._writer.version

    def _delta_rs(self) -> DeltaTable:
        """delta-rs's view of the table brought up to the writer's commits, before delta-rs
        commits to it (a commit from an older view would conflict)."""
        update(self.table)
        return self.table

    def _delta_rs_committed(self) -> int:
        """After delta-rs committed: the writer and the schema follow. The version."""
        self._writer.catch_up(self.table.version())
        self._schema = pa.schema(self.table.schema().to_arrow())
        return self._writer.version

    def _open(self, create: bool) -> DeltaTable:
        try:
            return open_table(self.path, storage_options=self._storage.delta_options)
        except TableNotFoundError:
            if not create:
                raise errors.KafkaStorageError(
                    f"the table of {self._name} at {self.path} is missing: this replica's "
                    "records are lost, and it is not recreated empty") from None
        return create_log_table(self.path, topic=self._topic, partition=self._partition,
                                checkpoint_interval=self.config.checkpoint_interval,
                                storage_options=self._storage.delta_options)

    # ---- the queue (the log's lock held) -------------------------------------------------------

    def enqueue(self, item: Pending) -> None:
        if not self._pending:
            self._head_since = time.monotonic()
        self._pending.append(item)
        self.pending_bytes += item.nbytes
        self._lock.notify_all()

    def busy(self) -> bool:
        return bool(self._pending) or self.committing

    def queued(self) -> list[Pending]:
        return list(self._pending)

    def drain(self) -> list[Pending]:
        """Take everything queued off the queue (to fail it)."""
        items = list(self._pending)
        self._pending.clear()
        self.pending_bytes = 0
        self._lock.notify_all()
        return items

    def ready_at(self, closed: bool) -> float | None:
        """When the queued work may be committed (time.monotonic): a produce append lingers
        `group_commit_linger_ms` from when it became the queue's head, so later ones join its
        commit, and no sooner than `commit_interval_ms` after the previous commit began,
        unless the log is closing or enough bytes are queued; everything else goes at once.
        None when nothing is queued or a commit is under way (it asks again when done)."""
        if not self._pending or self.committing:
            return None
        head = self._pending[0]
        if (not isinstance(head, PendingAppend) or head.copied or closed
                or self.pending_bytes >= self.config.group_commit_bytes_max):
            return 0.0
        at = 0.0
        if self.config.group_commit_linger_ms > 0:
            at = self._head_since + self.config.group_commit_linger_ms / 1000
        if self.config.commit_interval_ms > 0:
            at = max(at, self._commit_began_s + self.config.commit_interval_ms / 1000)
        return at

    def take(self) -> Work:
        """Take a group of appends of one kind (produced or copied) up to the byte limit, or
        one file copy or truncation, once `ready_at` says its time has come."""
        with self._lock:
            head = self._pending[0]
            if not isinstance(head, PendingAppend):
                self._pending.popleft()
                self.committing = True
                return head
            self._commit_began_s = time.monotonic()
            group: list[PendingAppend] = []
            size = 0
            while self._pending:
                item = self._pending[0]
                if (not isinstance(item, PendingAppend) or item.copied != head.copied
                        or (group and size + item.nbytes > self.config.group_commit_bytes_max)):
                    break
                self._pending.popleft()
                size += item.nbytes
                group.append(item)
            self.pending_bytes -= size
            self.committing = True
            self._lock.notify_all()
            return group

    def done(self) -> None:
        """The work `take` gave out is committed or failed. What queued meanwhile lingers
        from now for more to join it."""
        with self._lock:
            self.committing = False
            self._head_since = time.monotonic()
            self._lock.notify_all()

    # ---- copying files (a follower's request thread) --------------------------------------------

    def copy_in(self, files: list[LogFile]
                ) -> tuple[list[tuple[str, LogFile]], pa.Table, tuple[pa.Field, ...]]:
        """Copy a leader's data files, byte for byte, into this table's directory (not yet
        part of the table), and read each copy back (file_copies.py): (name here, the leader's
        file) for each, the copies' offset, epoch and producer columns, and the columns they
        hold beyond the log's. CorruptMessageError, and every copy of the call deleted, when a
        copy is not what the leader stated."""
        return self._copier.copy_in(files)

    # ---- committing (the log's commit round) -------------------------------------------------

    def commit(self, work: Work, log_end_offset: int) -> Committed:
        """Make `work` one Delta commit continuing the log at `log_end_offset`. Raises
        CommitFailed when nothing was written."""
        if isinstance(work, PendingTruncate):
            done = (self._commit_restart(work) if work.restart
                    else self._commit_truncate(work, log_end_offset))
        elif isinstance(work, PendingLogStart):
            done = self._commit_log_start(work, log_end_offset)
        elif isinstance(work, PendingFiles):
            done = self._commit_files(work, log_end_offset)
            if work.extra_fields:
                self.typed_types = typed_column_types(self.table)
        else:
            done = self._commit_group(work, log_end_offset)
            if done.records is not None and done.records.num_columns > len(LOG_SCHEMA):
                self.typed_types = typed_column_types(self.table)
        return done

    def reload(self) -> tuple[int, int]:
        """After a failed commit, trust only the table: reload it. (version, log end offset)."""
        self.table = open_table(self.path, storage_options=self._storage.delta_options)
        self._table_base = self._writer.version = self.table.version()
        self._schema = pa.schema(self.table.schema().to_arrow())
        self.typed_types = typed_column_types(self.table)
        self.offsets = log_offsets(self.table)
        return self.table.version(), self.offsets[1]

    def _failure(self, e: Exception, what: str) -> errors.DeltaBusError:
        """A failed commit as the error its produce requests get: a writer fenced by another
        writer of the log no longer leads it (NOT_LEADER_OR_FOLLOWER, so clients look the
        leader up again); anything else is the storage's failure."""
        if isinstance(e, FencedWriter):
            return errors.NotLeaderOrFollowerError(f"{what}: {e}")
        return storage_error(e, what)

    def _info(self, operation: str, **details: str) -> dict[str, str]:
        """A commit's commitInfo keys (history() shows them)."""
        return {"deltabus.operation": operation, **details}

    def _conformed(self, data: pa.Table) -> pa.Table | None:
        """`data` in the table's schema as committed (a typed column it lacks, as nulls), or
        None when committing it changes the schema (a typed topic's value schema evolved):
        that append goes through delta-rs, which writes the new metaData action."""
        if data.schema.equals(self._schema):
            return data
        if any(name not in self._schema.names for name in data.schema.names):
            return None  # it holds a column the table has not: the schema grows
        columns = []
        for column in self._schema:
            index = data.schema.get_field_index(column.name)
            if index < 0 and column.name in TYPED_COLUMNS:  # a tombstone's batch
                columns.append(pa.nulls(data.num_rows, column.type))
            elif index < 0 or not data.schema.field(index).type.equals(column.type):
                return None
            else:
                columns.append(data.column(index))
        return pa.Table.from_arrays(columns, schema=self._schema)

    def _properties(self, end_offset: int, metadata: dict[str, str]) -> CommitProperties:
        return commit_properties(metadata, retries=APPEND_COMMIT_RETRIES, app_transactions=[
            Transaction(app_id, version) for app_id, version in self._txns(end_offset).items()])

    def _txns(self, end_offset: int) -> dict[str, int]:
        """The app transactions every commit of the log sets: its log end offset, and a
        diskless leader's epoch (`claim`)."""
        txns = {LOG_TXN_APP_ID: end_offset}
        if self._writer.epoch_app_id is not None:
            txns[LEADER_EPOCH_TXN_APP_ID] = self._writer.epoch
        return txns

    def _build_group(self, group: list[PendingAppend], base: int,
                     now_ms: int) -> tuple[pa.Table, list[tuple[int, int]]]:
        """The log batch a group commits, and each item's offsets. Produced batches get offsets
        from the log end; copied ones continue it, in increasing offsets (gaps are records a
        compacted topic's cleaner removed on the leader)."""
        if not group[0].copied:  # `take` never mixes the kinds
            results, next_offset = [], base
            for item in group:
                results.append((next_offset, next_offset + item.batch.num_rows - 1))
                next_offset += item.batch.num_rows
            return to_log_group([ProducedBatch(item.batch, item.leader_epoch,
                                               item.timestamp_type, item.producer,
                                               item.typed)
                                 for item in group], base_offset=base, now_ms=now_ms), results
        next_offset = base
        parts = []
        results = []
        for item in group:
            first = item.batch.column("offset")[0].as_py()
            gap = first > next_offset and item.fetch_offset != next_offset
            if first < next_offset or gap or not _increasing(item.batch):
                raise errors.InvalidRecordError(
                    f"copied records start at offset {first} but {self._name} continues "
                    f"at {next_offset} (or are out of order)")
            parts.append(item.batch)
            last = item.batch.column("offset")[-1].as_py()
            results.append((first, last))
            next_offset = last + 1
        # One chunk: delta-rs may write the chunks of a table in any order. Copies of a typed
        # topic may hold its values in the struct types of several versions: unified.
        table = (pa.concat_tables(parts, promote_options="permissive").combine_chunks()
                 if len(parts) > 1 else parts[0])
        return table, results

    def _commit_group(self, group: list[PendingAppend], base: int) -> Committed:
        now_ms = int(time.time() * 1000)
        copied = group[0].copied
        try:
            table, results = self._build_group(group, base, now_ms)
            next_offset = results[-1][1] + 1
            built_ns = time.time_ns()
            info = self._info("copy" if copied else "append", **{
                "deltabus.baseOffset": str(base), "deltabus.lastOffset": str(next_offset - 1),
                "deltabus.batches": str(len(group))})
            data = self._conformed(table)
            added = None
            if data is not None:
                written = self._writer.write_file(data, "append")
                self._writer.commit(adds=[written], txns=self._txns(next_offset),
                                    info=info)
                self._flush([written.path], table.num_rows)
                added = (1, written.size)
            else:  # a typed topic's values evolve the table's schema (new nullable fields)
                write_deltalake(
                    self._delta_rs(), table, mode="append", schema_mode="merge",
                    commit_properties=self._properties(next_offset, info),
                    post_commithook_properties=_NO_CHECKPOINT_HOOK,
                    writer_properties=writer_properties(True))
                self._delta_rs_committed()
        except Exception as e:  # delta-rs, IO, a bad copy: no offset was given out
            error = (e if isinstance(e, errors.DeltaBusError)
                     else self._failure(e, f"append to {self._name} failed"))
            raise CommitFailed(error, error, reload=True,
                               fenced=isinstance(e, FencedWriter)) from e
        begins = tuple((item.producer.producer_id, first) for item, (first, _)
                       in zip(group, results, strict=True) if item.producer.transactional)
        return Committed("copy" if copied else "append", self.version, next_offset,
                         table, [(item.future, first, last) for item, (first, last)
                                 in zip(group, results, strict=True)], now_ms,
                         txn_begins=begins, built_ns=built_ns, committed_ns=time.time_ns(),
                         added=added)

    def _commit_files(self, item: PendingFiles, base: int) -> Committed:
        expected = base
        for _, leader_file in item.files:
            if leader_file.base_offset != expected:
                raise CommitFailed(
                    errors.InvalidRecordError(
                        f"copied file starts at offset {leader_file.base_offset} but "
                        f"{self._name} continues at {expected}"),
                    errors.InvalidRecordError("an earlier copy did not continue the log"),
                    reload=False)
            expected = leader_file.last_offset + 1
        now_ms = int(time.time() * 1000)
        built_ns = time.time_ns()  # the files were copied before they were queued
        info = self._info("copy", **{
            "deltabus.baseOffset": str(base), "deltabus.lastOffset": str(expected - 1),
            "deltabus.batches": str(len(item.files))})
        try:
            schema = log_table_schema(self.table, item.extra_fields)
            if schema.equals(self._schema):
                self._writer.commit(
                    adds=[DataFile(name, f.size_bytes, f.stats) for name, f in item.files],
                    txns=self._txns(expected), info=info)
                self._flush([name for name, _ in item.files], expected - base)
            else:  # the copies hold typed columns the table has not yet: its schema grows
                self._delta_rs().create_write_transaction(
                    [AddAction(name, f.size_bytes, {}, now_ms, True, f.stats)
                     for name, f in item.files],
                    mode="append", schema=schema,
                    commit_properties=self._properties(expected, info),
                    post_commithook_properties=_NO_CHECKPOINT_HOOK)
                update(self.table)  # unlike write_deltalake, it leaves the snapshot
                self._delta_rs_committed()
        except Exception as e:
            raise CommitFailed(self._failure(e, f"copying files into {self._name} failed"),
                               self._failure(e, f"append to {self._name} failed"),
                               reload=True) from e
        return Committed("files", self.version, expected,
                         item.records.sort_by("offset"), [(item.future, base, expected - 1)],
                         now_ms, built_ns=built_ns, committed_ns=time.time_ns(),
                         added=(len(item.files), sum(f.size_bytes for _, f in item.files)))

    def _flush(self, files: list[str], records: int) -> None:
        """flush.messages, after the commit of `records` in the data `files`, before it is
        acknowledged: once as many records were appended since the last fsync, fsync every
        data file and commit file since (Storage.sync: local disks only). Without it (Kafka's
        default) a commit on a local disk is durable against a killed process, not a power
        cut: acks=all's replicas are what survives that."""
        if self.flush_messages == NEVER_FLUSH:
            return
        self._unflushed += [posixpath.join(self.path, f) for f in files]
        self._unflushed.append(commit_file(self.path, self.version))
        self._unflushed_records += records
        if self._unflushed_records >= self.flush_messages:
            self._storage.sync(self._unflushed)
            self._unflushed, self._unflushed_records = [], 0

    def _commit_truncate(self, item: PendingTruncate, log_end_offset: int) -> Committed:
        offset = item.offset
        if offset < log_end_offset:
            try:
                self._delta_rs().delete(
                    f'"offset" >= {offset}',
                    # a typed topic's table holds columns beyond the log's
                    writer_properties=writer_properties(len(self._schema) > len(LOG_SCHEMA)),
                    commit_properties=self._properties(offset, {
                        "deltabus.operation": "truncate", "deltabus.truncatedTo": str(offset)}),
                    post_commithook_properties=_NO_CHECKPOINT_HOOK,
                )
                self._delta_rs_committed()
            except Exception as e:
                raise CommitFailed(self._failure(e, f"truncating {self._name} failed"),
                                   self._failure(e, f"append to {self._name} failed"),
                                   reload=True) from e
        return Committed("truncate", self.version, min(offset, log_end_offset), None,
                         [(item.future, offset, offset - 1)], int(time.time() * 1000))

    def _commit_restart(self, item: PendingTruncate) -> Committed:
        """Remove every data file and record `item.offset` as the log end in the same commit
        (the log app transaction), so a reopened empty table starts there too."""
        offset = item.offset
        now_ms = int(time.time() * 1000)
        try:
            files = data_files(self._delta_rs(), ["path", "size_bytes", "min.offset"])
            self._writer.commit(
                removes=[remove_action(path, size, now_ms) for path, size in zip(
                    files.column("path").to_pylist(), files.column("size_bytes").to_pylist(),
                    strict=True)],
                txns=self._txns(offset),
                info=self._info("restart", **{"deltabus.restartedAt": str(offset)}))
        except Exception as e:
            raise CommitFailed(self._failure(e, f"restarting {self._name} failed"),
                               self._failure(e, f"append to {self._name} failed"),
                               reload=True) from e
        return Committed("restart", self.version, offset, None,
                         [(item.future, offset, offset - 1)], now_ms)

    def _commit_log_start(self, item: PendingLogStart, log_end_offset: int) -> Committed:
        """Record `item.offset` as the log start offset: a commit of no data that sets the
        log start app transaction (and the log's, unchanged, so a zombie writer still
        conflicts). The files wholly below it leave with the cleaner's next run."""
        offset = item.offset
        try:
            self._writer.commit(
                txns={**self._txns(log_end_offset), LOG_START_TXN_APP_ID: offset},
                info=self._info("deleteRecords", **{"deltabus.logStartOffset": str(offset)}))
        except Exception as e:
            raise CommitFailed(self._failure(e, f"moving the log start of {self._name} failed"),
                               self._failure(e, f"append to {self._name} failed"),
                               reload=True) from e
        return Committed("log_start", self.version, log_end_offset, None,
                         [(item.future, offset, offset - 1)], int(time.time() * 1000),
                         log_start_offset=offset)

    def renew(self) -> None:
        """After a commit, once the log applied it. delta-rs replays, on every commit, each
        commit made since the table object was loaded (measured: 7 ms more a commit every 100
        commits, 400 ms a commit after 5,000), so every checkpoint_interval versions a
        checkpoint is written and the object loaded afresh from it: commit time stays flat
        however long the broker runs. Both happen on the process's renewal thread
        (`_checkpoint_and_load`), the fresh object taken in here at a later commit: a commit
        round never waits for them (they held the commit after them 30-60 ms).

        The interval is the broker's (25 by default), not the table's
        delta.checkpointInterval, so tables made with an older one follow it too. Measured
        (commits of 4 records, 300 in a row, `write_deltalake` as here, checkpoints in line):
        every 25 versions, a commit took p50 7-9 ms and p99 32-37 ms and 10-11 ms of CPU; every
        100, p50 10-11 ms, p99 47-60 ms, 13-14 ms of CPU."""
        renewing = self._renewing
        if renewing is not None and renewing.done():
            self._renewing = None
            try:
                base, fresh = renewing.result()
                if fresh.version() < self.version:  # commits made meanwhile
                    update(fresh)
            except Exception as e:  # the next interval tries again; the table is as committed
                log.warning("%s", storage_error(e, f"checkpoint of {self._name}"))
            else:
                self.table, self._table_base = fresh, base
        version = self.version
        interval = self.config.checkpoint_interval
        if self._renewing is None and version - self._table_base >= interval:
            self._renewing = _renewals().submit(_checkpoint_and_load, self.path, version,
                                                self._storage.delta_options)

    def await_renewal(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for a checkpoint being written: a log closing leaves its
        table quick to open."""
        renewing = self._renewing
        if renewing is not None:
            try:
                renewing.result(timeout_s)
            except Exception:  # renew() says why, when it runs again; a close does not
                pass


def _renewals() -> ThreadPoolExecutor:
    """The process's one thread for the logs' checkpoints and reloads (LogAppender.renew)."""
    return process_pool("deltabus-log-renewal", 1)


def _checkpoint_and_load(path: str, version: int, storage_options: dict[str, str] | None
                         ) -> tuple[int, DeltaTable]:
    """Write the checkpoint of `version` and load the table afresh from it: (the version it
    was loaded from, the table at the latest version)."""
    open_table(path, version=version, storage_options=storage_options).create_checkpoint()
    return version, open_table(path, storage_options=storage_options)


def _increasing(table: pa.Table) -> bool:
    offsets = table.column("offset").to_numpy()
    return bool((np.diff(offsets) > 0).all())
