"""A Delta table kept as Kafka keeps a compacted topic (`__consumer_offsets`,
`__share_group_state`): rows appended with a growing sequence, the newest row of a key is its
value, a tombstone deletes it, and compaction drops what newer rows replaced.

Runs in the Spark driver beside the coordinators. Thread-safe: any number of gRPC threads write
and read at once; one writer thread is the only writer of the table, and the only thread that
changes the in-memory state. Subclasses say what a row is (`_rows_of`, `_key`, `_is_tombstone`)
and keep their own views of the live rows (`_on_apply`, under the lock). Invariants:
- `sequence` grows strictly over everything the store ever wrote, so replaying rows in sequence
  order is exact. Compaction keeps every live row unchanged (same sequence), and also the newest
  row of the table when it is a tombstone, so a restarted store never reuses a sequence number.
- Memory changes only after the Delta commit holding a row succeeded, and a write's future
  resolves only then: a restarted store replays exactly the acknowledged writes. A failed write
  fails every future of its batch and changes nothing in memory.
- A failed append whose outcome stays unknown (its commit may have landed though the store's
  answer was lost, and the store could not be read to tell) is settled before anything else is
  written: the writer thread asks the table whether it landed and applies its rows if so
  (`_reload`), so memory equals the table again, and what is written next (tombstones worked out
  from memory, a compaction's live rows) is decided on it.
- Writes queued together share one Delta append (group commit): a thousand consumers committing
  every second must not mean a thousand Delta commits a second. One write is never split across
  Delta commits, so the rows of one request land together.
- Compaction runs on the writer thread between appends, so no append races its overwrite.

Appends are the Delta commit writer's (delta_commit.py: about a millisecond, where delta-rs's
write path costs 7-15), each stamped with the table's app transaction = the next sequence, so a
second coordinator writing the same table fences the other instead of interleaving sequences.
delta-rs does the rest: the compaction's overwrite, vacuum, and a checkpoint every
CHECKPOINT_COMMITS appends (opening replays at most that many commits).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from deltabus import errors
from deltabus.log_tables.delta_commit import CommitConflict, DeltaCommitWriter, FencedWriter
from deltabus.log_tables.delta_reads import open_table, update
from deltabus.log_tables.delta_writes import VACUUM_RETENTION_HOURS, commit_properties
from deltabus.storage import Storage

log = logging.getLogger(__name__)

# Set when a store creates its table. Compaction destroys history anyway, so a short log keeps
# `_delta_log` small (opening lists it); removed files stay in checkpoints a day, long enough for
# the vacuum of a later compaction to see them, short enough that checkpoints stay small.
TABLE_CONFIGURATION: dict[str, str | None] = {
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.deletedFileRetentionDuration": "interval 1 days",
}
CHECKPOINT_COMMITS = 100  # delta-rs's default checkpoint interval

Key = tuple[Any, ...]


@dataclass
class _Request:
    payload: Any  # the subclass's: `_rows_of` makes the rows of it
    rows: int  # how many rows it will likely take (for commit_batch_max)
    future: Future[None]
    queued_at: float


class CompactedTable:
    """Keyed rows, the newest of a key wins: in memory for reads, durably in Delta."""

    SCHEMA: ClassVar[pa.Schema]  # its first column is the int64 `sequence`
    TABLE_NAME: ClassVar[str]  # as Delta's metadata names it, and the errors
    DESCRIPTION: ClassVar[str]
    TXN_APP_ID: ClassVar[str]  # the app transaction of every append: the next sequence
    COMMIT: ClassVar[str]  # commitInfo's deltabus.operation of an append
    COMPACTION: ClassVar[str]  # and of the compaction's overwrite and vacuum
    TIMESTAMP_COLUMNS: ClassVar[tuple[str, ...]] = ()  # written and kept as epoch ms

    def __init__(self, path: str, *, commit_linger_ms: int = 5, commit_batch_max: int = 10_000,
                 compact_min_rows: int = 10_000,
                 storage_options: dict[str, str] | None = None) -> None:
        if commit_linger_ms < 0 or commit_batch_max < 1 or compact_min_rows < 0:
            raise errors.InvalidConfigError(
                f"{self.TABLE_NAME}: commit_linger_ms {commit_linger_ms} must be >= 0, "
                f"commit_batch_max {commit_batch_max} >= 1, compact_min_rows "
                f"{compact_min_rows} >= 0")
        self.path = path
        self._linger_s = commit_linger_ms / 1000
        self._batch_max = commit_batch_max
        self._compact_min_rows = compact_min_rows
        self._table = self._open(path, storage_options)
        # The appends' writer; delta-rs's table object serves the replay, compaction, vacuum
        # and checkpoints, brought up to date before each (the appends go around it).
        self._appends = DeltaCommitWriter(Storage(path, storage_options), path,
                                          self._table.version(), fence_app_id=self.TXN_APP_ID)
        # State below: changed by the writer thread only, under the lock; read under the lock.
        self._lock = threading.Condition()
        self._live: dict[Key, dict[str, Any]] = {}  # key -> its live row
        self._newest: dict[str, Any] | None = None  # the row with the highest sequence
        self._next_sequence = 0
        self._rows = 0  # rows in the table
        self._replay()
        # Writer thread only.
        self._compact_after_rows = 0  # after a failed automatic compaction: wait for more rows
        self._unknown: list[dict[str, Any]] | None = None  # the rows of an unknown append
        # Queue, under the lock.
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._compactions: list[Future[int]] = []
        self._closed = False
        self._writer = threading.Thread(target=self._run, daemon=True,
                                        name=f"deltabus-{self.TABLE_NAME.strip('_')}")
        self._writer.start()

    # ---- what a subclass says ------------------------------------------------------------------

    def _key(self, row: dict[str, Any]) -> Key:
        raise NotImplementedError

    def _is_tombstone(self, row: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _rows_of(self, payload: Any, pending: dict[Key, dict[str, Any] | None], now_ms: int
              ) -> list[dict[str, Any]]:
        """The rows (without `sequence`) a queued write makes, on the writer thread, in queue
        order. `pending`: key -> its newest row in this batch so far (None: a tombstone), what
        memory will say once the batch lands, for writes that look memory up (a group's
        tombstones). A DeltaBusError refuses this write alone: its future fails with it, the
        others go on."""
        raise NotImplementedError

    def _on_apply(self, row: dict[str, Any], tombstone: bool) -> None:
        """Keep the subclass's views: one row applied, in sequence order, under the lock."""
        raise NotImplementedError

    # ---- writing -------------------------------------------------------------------------------

    def compact(self) -> int:
        """Rewrite the table to its live rows in one overwrite commit, then vacuum, checkpoint and
        clean the log; returns the rows removed. Runs on the writer thread, between appends."""
        future: Future[int] = Future()
        with self._lock:
            if self._closed:
                raise errors.CoordinatorNotAvailableError(f"{self.TABLE_NAME} is closed")
            self._compactions.append(future)
            self._lock.notify_all()
        return future.result()

    def close(self) -> None:
        """Write what is queued (without lingering), then stop the writer thread."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if threading.current_thread() is not self._writer:
            self._writer.join()

    def _enqueue(self, payload: Any, rows: int) -> Future[None]:
        """Queue a write for the next Delta append: its future resolves once its rows are
        durable and applied, or fails with KafkaStorageError (then none of them is)."""
        request = _Request(payload, max(1, rows), Future(), time.monotonic())
        with self._lock:
            if self._closed:
                raise errors.CoordinatorNotAvailableError(f"{self.TABLE_NAME} is closed")
            self._queue.append(request)
            self._queued_rows += request.rows
            self._lock.notify_all()
        return request.future

    # ---- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._compactions and not self._closed:
                    self._lock.wait()
                if self._queue:  # linger: let more writes join this Delta commit
                    deadline = self._queue[0].queued_at + self._linger_s
                    while not self._closed and self._queued_rows < self._batch_max:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._lock.wait(remaining)
                batch = self._take_batch()
                compactions, self._compactions = self._compactions, []
                if not batch and not compactions and self._closed and not self._queue:
                    return
            try:
                if batch:
                    self._write(batch)
                if compactions or self._compaction_due():
                    self._compact(compactions)
            except BaseException as e:  # a bug: keep the writer alive, or every caller hangs
                log.exception("the %s writer failed", self.TABLE_NAME)
                for future in [r.future for r in batch] + compactions:
                    if not future.done():
                        future.set_exception(errors.KafkaStorageError(
                            f"{self.TABLE_NAME}: {e!r}"))

    def _take_batch(self) -> list[_Request]:
        """Queued requests, oldest first, up to commit_batch_max rows (at least one request).
        Called under the lock."""
        batch: list[_Request] = []
        rows = 0
        while self._queue and (not rows or rows + self._queue[0].rows <= self._batch_max):
            request = self._queue.popleft()
            self._queued_rows -= request.rows
            rows += request.rows
            if request.future.set_running_or_notify_cancel():  # False: cancelled, not written
                batch.append(request)
        return batch

    def _write(self, batch: list[_Request]) -> None:
        """One Delta append for the whole batch, then memory, then the futures."""
        try:
            self._reload()
        except errors.KafkaStorageError as e:
            for request in batch:
                request.future.set_exception(e)
            return
        first = self._next_sequence
        now_ms = int(time.time() * 1000)
        rows: list[dict[str, Any]] = []
        pending: dict[Key, dict[str, Any] | None] = {}
        written: list[_Request] = []
        for request in batch:
            try:
                made = self._rows_of(request.payload, pending, now_ms)
            except errors.DeltaBusError as e:  # this write is refused alone (say, fenced)
                request.future.set_exception(e)
                continue
            written.append(request)
            for row in made:
                row = {"sequence": first + len(rows), **row}
                rows.append(row)
                pending[self._key(row)] = None if self._is_tombstone(row) else row
        batch = written
        # Used even if the append fails: an append whose outcome is unknown may have landed.
        self._next_sequence = first + len(rows)
        if rows:
            try:
                self._append(rows, first)
            except (errors.KafkaStorageError, CommitConflict, FencedWriter) as e:
                log.warning("cannot write %d rows to %s: %s", len(rows), self.path, e)
                for request in batch:
                    request.future.set_exception(errors.KafkaStorageError(
                        f"cannot write {self.TABLE_NAME} rows to {self.path}: {e}"))
                return
        self._apply_all(rows)
        for request in batch:
            request.future.set_result(None)

    def _append(self, rows: list[dict[str, Any]], first: int) -> None:
        """One Delta commit of `rows`, or an exception with nothing committed. An append whose
        outcome was unknown (the store failed, perhaps after the commit landed) that did land
        counts as committed, so memory keeps matching the table."""
        data = pa.Table.from_pylist(rows, schema=self.SCHEMA)
        try:
            self._appends.commit(adds=[self._appends.write_file(data)],
                                 txns={self.TXN_APP_ID: first + len(rows)},
                                 info={"deltabus.operation": self.COMMIT,
                                       "deltabus.first_sequence": first})
        except errors.KafkaStorageError:
            if not self._landed(rows):
                raise
        if self._appends.version % CHECKPOINT_COMMITS == 0:
            self._checkpoint()

    def _apply_all(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            for row in rows:
                self._apply(row)
            self._rows += len(rows)

    def _checkpoint(self) -> None:
        """Checkpoint the latest version and delete the log files past the table's log
        retention: after the acknowledgement, and a failure only leaves it to the next one."""
        try:
            update(self._table)
            self._table.create_checkpoint()
            self._table.cleanup_metadata()
        except Exception as e:
            log.warning("cannot checkpoint %s: %s", self.path, e)

    def _landed(self, rows: list[dict[str, Any]]) -> bool:
        """Whether the append of `rows` that raised was committed anyway (say, the answer to its
        put was lost). While the storage still fails the outcome stays unknown, until
        `_reload`: raises."""
        try:
            return self._appends.landed()
        except errors.KafkaStorageError:
            self._unknown = rows
            raise

    def _reload(self) -> None:
        """Writer thread, before a write or a compaction. After an append whose outcome was
        unknown: apply its rows if the table holds them; the outcome is known from then on.
        Raises KafkaStorageError while the store still cannot tell (nothing changes).

        Why: the appends' writer stays at the version before that commit, so the next append
        would find it there and fail (CommitConflict) every time; and memory, short of rows a
        restart would replay, would have a group's deletion miss them and a compaction drop
        them. Only this writer's own commit can be there (another store's would fence this one
        at its next append), and only the one append: none is made while it is unknown."""
        if self._unknown is None:
            return
        try:
            landed = self._appends.landed()
        except errors.KafkaStorageError as e:
            raise errors.KafkaStorageError(
                f"cannot reload {self.path} after an append whose outcome was unknown: "
                f"{e}") from e
        rows, self._unknown = self._unknown, None
        if not landed:
            log.warning("%s: the append whose outcome was unknown did not land", self.path)
            return
        log.warning("%s: the append whose outcome was unknown landed: %d rows applied",
                    self.path, len(rows))
        self._apply_all(rows)

    def _compaction_due(self) -> bool:
        return (self._rows > self._compact_min_rows and self._rows > 2 * len(self._live)
                and self._rows > self._compact_after_rows)

    def _compact(self, requests: list[Future[int]]) -> None:
        """Overwrite the table with the live rows (memory is the acknowledged state), unchanged.
        Memory stays as it is: compaction changes the table's rows, never its replayed state."""
        try:
            self._reload()
        except errors.KafkaStorageError as e:
            for future in requests:
                future.set_exception(e)
            return
        before = self._rows
        live = list(self._live.values())
        if self._newest is not None and self._is_tombstone(self._newest):
            live.append(self._newest)  # keeps the highest sequence for a restart
        live.sort(key=lambda row: row["sequence"])
        if len(live) >= before:
            for future in requests:
                future.set_result(0)
            return
        try:
            update(self._table)
            write_deltalake(self._table, pa.Table.from_pylist(live, schema=self.SCHEMA),
                            mode="overwrite", commit_properties=self._properties())
            self._appends.catch_up(self._table.version())
        except Exception as e:
            # Had the overwrite landed anyway, the table holds the same live rows: no harm.
            self._compact_after_rows = before + self._compact_min_rows
            log.warning("cannot compact %s (it stays as it was): %s", self.path, e)
            for future in requests:
                future.set_exception(errors.KafkaStorageError(f"cannot compact {self.path}: {e}"))
            return
        with self._lock:
            self._rows = len(live)
        self._compact_after_rows = 0
        log.info("compacted %s: %d rows to %d", self.path, before, len(live))
        self._maintain()
        for future in requests:
            future.set_result(before - len(live))

    def _maintain(self) -> None:
        """After a compaction: vacuum before the checkpoint (a checkpoint drops expired tombstones,
        and a vacuum only deletes files it still sees removed), then checkpoint so opening reads
        one file, then delete expired log files. A failure only delays this to the next one."""
        try:
            self._table.vacuum(retention_hours=VACUUM_RETENTION_HOURS, dry_run=False,
                               enforce_retention_duration=False,
                               commit_properties=self._properties())
            update(self._table)
            self._appends.catch_up(self._table.version())
            self._table.create_checkpoint()
            self._table.cleanup_metadata()
        except Exception as e:
            log.warning("cannot checkpoint or vacuum %s after compacting it: %s", self.path, e)

    def _properties(self) -> CommitProperties:
        """commitInfo of delta-rs's commits (the compaction, vacuum) saying what they were:
        Delta history shows it."""
        return commit_properties({"deltabus.operation": self.COMPACTION})

    # ---- replay --------------------------------------------------------------------------------

    def _replay(self) -> None:
        """Load the table into memory: rows in sequence order, the latest of a key wins."""
        try:
            table = self._table.to_pyarrow_table()
        except Exception as e:
            raise errors.KafkaStorageError(f"cannot read {self.path}: {e}") from e
        missing = set(self.SCHEMA.names) - set(table.column_names)
        if missing:
            raise errors.KafkaStorageError(
                f"{self.path} is not a {self.TABLE_NAME} table: no {sorted(missing)} columns")
        table = table.sort_by("sequence")
        columns = [self._replayed(table, name) for name in self.SCHEMA.names]
        with self._lock:
            for values in zip(*columns, strict=True):
                self._apply(dict(zip(self.SCHEMA.names, values, strict=True)))
            self._rows = table.num_rows
            if self._newest is not None:
                self._next_sequence = self._newest["sequence"] + 1

    def _replayed(self, table: pa.Table, name: str) -> list[Any]:
        if name not in self.TIMESTAMP_COLUMNS:
            return table[name].to_pylist()
        # Delta stores microseconds; the store writes and keeps milliseconds.
        stamps = pc.cast(table[name], pa.timestamp("ms", tz="UTC"), safe=False)
        return stamps.cast(pa.int64()).to_pylist()

    def _apply(self, row: dict[str, Any]) -> None:
        """One row into memory, in sequence order. Called under the lock."""
        key, tombstone = self._key(row), self._is_tombstone(row)
        if tombstone:
            self._live.pop(key, None)
        else:
            self._live[key] = row
        self._on_apply(row, tombstone)
        self._newest = row

    @classmethod
    def _open(cls, path: str, storage_options: dict[str, str] | None) -> DeltaTable:
        try:
            try:
                return open_table(path, storage_options=storage_options)
            except TableNotFoundError:
                return DeltaTable.create(
                    path, cls.SCHEMA, mode="ignore", name=cls.TABLE_NAME,
                    description=cls.DESCRIPTION, configuration=TABLE_CONFIGURATION,
                    storage_options=storage_options)
        except Exception as e:
            raise errors.KafkaStorageError(f"cannot open {path}: {e}") from e
