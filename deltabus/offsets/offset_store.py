"""`__consumer_offsets`: the committed offsets of every consumer group, as one Delta table.

Runs in the Spark driver beside the group coordinator. Thread-safe: any number of gRPC threads
commit and read at once; one writer thread (`deltabus-consumer-offsets`) is the only writer of the
table, and the only thread that changes the in-memory state.

Each row is one offset commit, Kafka's OffsetCommitKey and OffsetCommitValue as plain columns, so
any Delta reader can query a group's progress with SQL. A key is (group, topic, partition); its
committed offset is its row with the highest `sequence`; a null `committed_offset` is a tombstone
(the offset was deleted or expired). Invariants:
- `sequence` grows strictly over everything the store ever wrote, so replaying rows in sequence
  order is exact. Compaction keeps every live row unchanged (same sequence), and also the newest
  row of the table when it is a tombstone, so a restarted store never reuses a sequence number.
- Memory changes only after the Delta commit holding a row succeeded, and a commit's future
  resolves only then: a restarted store replays exactly the acknowledged commits. A failed write
  fails every future of its batch and changes nothing in memory.
- A failed append whose outcome stays unknown (its commit may have landed though the store's
  answer was lost, and the store could not be read to tell) is settled before anything else is
  written: the writer thread asks the table whether it landed and applies its rows if so
  (`_reload`), so memory equals the table again, and what is written next (a group's
  tombstones, a compaction's live rows) is decided on it.
- Commits queued together share one Delta append (group commit): a thousand consumers committing
  every second must not mean a thousand Delta commits a second. One `commit()` call is never split
  across Delta commits, so the partitions of one OffsetCommit request land together.
- Compaction runs on the writer thread between appends, so no append races its overwrite.

Appends are the Delta commit writer's (delta_commit.py: about a millisecond, where delta-rs's
write path costs 7-15), each stamped with the app transaction OFFSETS_TXN_APP_ID = the next
sequence, so a second coordinator writing the same table fences the other instead of
interleaving sequences. delta-rs does the rest: the compaction's overwrite, vacuum, and a
checkpoint every CHECKPOINT_COMMITS appends (opening replays at most that many commits).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from deltabus import config as cfg
from deltabus import errors
from deltabus.log_tables.delta_commit import CommitConflict, DeltaCommitWriter, FencedWriter
from deltabus.log_tables.delta_reads import open_table, update
from deltabus.log_tables.delta_writes import VACUUM_RETENTION_HOURS, commit_properties
from deltabus.storage import Storage

log = logging.getLogger(__name__)

SCHEMA = pa.schema([
    pa.field("sequence", pa.int64(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("committed_offset", pa.int64()),  # null: a tombstone
    pa.field("leader_epoch", pa.int32()),  # -1: unknown
    pa.field("metadata", pa.string()),
    pa.field("commit_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("member_id", pa.string()),
    pa.field("generation_id", pa.int32()),
])
# Set when the store creates the table. Compaction destroys history anyway, so a short log keeps
# `_delta_log` small (opening lists it); removed files stay in checkpoints a day, long enough for
# the vacuum of a later compaction to see them, short enough that checkpoints stay small.
TABLE_CONFIGURATION: dict[str, str | None] = {
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.deletedFileRetentionDuration": "interval 1 days",
}
COMMIT = "offset-commit"
COMPACTION = "offset-compaction"
OFFSETS_TXN_APP_ID = "deltabus.offsets"  # app transaction of every append: the next sequence
CHECKPOINT_COMMITS = 100  # delta-rs's default checkpoint interval

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last one SQL can show


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset: the next record the group reads, as in Kafka."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = 0  # 0 when committing: the store stamps the time it wrote it


@dataclass(frozen=True)
class OffsetCommit:
    """One row to write; `offset` None writes a tombstone (the offset is deleted)."""

    group_id: str
    topic: str
    partition: int
    offset: OffsetAndMetadata | None
    member_id: str = ""
    generation_id: int = -1


@dataclass(frozen=True)
class _Entry:
    """The live row of a key, as written (compaction rewrites it unchanged)."""

    row: dict[str, Any]
    offset: OffsetAndMetadata


@dataclass
class _Request:
    commits: list[OffsetCommit]
    delete_group: str | None  # expanded into tombstones on the writer thread
    future: Future[None]
    queued_at: float

    @property
    def rows(self) -> int:
        return max(1, len(self.commits))


class OffsetStore:
    """The committed offsets of every group: in memory for reads, durably in Delta."""

    def __init__(self, path: str, *, commit_linger_ms: int = 5, commit_batch_max: int = 10_000,
                 compact_min_rows: int = 10_000,
                 metadata_max_bytes: int = cfg.OFFSET_METADATA_MAX_BYTES,
                 storage_options: dict[str, str] | None = None) -> None:
        if commit_linger_ms < 0 or commit_batch_max < 1 or compact_min_rows < 0:
            raise errors.InvalidConfigError(
                f"offset store: commit_linger_ms {commit_linger_ms} must be >= 0, "
                f"commit_batch_max {commit_batch_max} >= 1, compact_min_rows "
                f"{compact_min_rows} >= 0")
        self.path = path
        self.metadata_max_bytes = metadata_max_bytes
        self._linger_s = commit_linger_ms / 1000
        self._batch_max = commit_batch_max
        self._compact_min_rows = compact_min_rows
        self._storage_options = storage_options
        self._table = _open(path, storage_options)
        # The appends' writer; delta-rs's table object serves the replay, compaction, vacuum
        # and checkpoints, brought up to date before each (the appends go around it).
        self._appends = DeltaCommitWriter(Storage(path, storage_options), path,
                                          self._table.version(), fence_app_id=OFFSETS_TXN_APP_ID)
        # State below: changed by the writer thread only, under the lock; read under the lock.
        self._lock = threading.Condition()
        self._groups: dict[str, dict[tuple[str, int], _Entry]] = {}
        self._live = 0  # live keys, over all groups
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
                                        name="deltabus-consumer-offsets")
        self._writer.start()

    # ---- reading -------------------------------------------------------------------------------

    def offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        """The group's committed offsets by (topic, partition): acknowledged commits only."""
        with self._lock:
            return {tp: e.offset for tp, e in self._groups.get(group_id, {}).items()}

    def groups(self) -> list[str]:
        """Groups with at least one committed offset, sorted."""
        with self._lock:
            return sorted(self._groups)

    def has_group(self, group_id: str) -> bool:
        """Whether the group has a committed offset."""
        with self._lock:
            return group_id in self._groups

    def group_count(self) -> int:
        """How many groups have a committed offset."""
        with self._lock:
            return len(self._groups)

    def last_commit_ms(self, group_id: str) -> int:
        """Newest commit timestamp of the group's offsets (0 if none): offsets.retention.minutes
        counts from it."""
        with self._lock:
            return max((e.offset.commit_timestamp_ms
                        for e in self._groups.get(group_id, {}).values()), default=0)

    # ---- writing -------------------------------------------------------------------------------

    def commit(self, commits: list[OffsetCommit]) -> Future[None]:
        """Queue commits for the next Delta append. The future resolves once they are durable and
        visible to `offsets`, or fails with KafkaStorageError (then none of them is applied).

        Everything is checked here, before queueing: a bad commit fails alone instead of failing
        the whole batch it would have shared with other groups' commits."""
        commits = list(commits)
        for c in commits:
            _check(c, self.metadata_max_bytes)
        return self._enqueue(_Request(commits, None, Future(), time.monotonic()))

    def delete_group(self, group_id: str) -> Future[None]:
        """Tombstones for every offset of the group. The offsets are looked up when its turn comes
        on the writer thread, so commits queued before it are deleted too."""
        if not isinstance(group_id, str):
            raise errors.InvalidRequestError(f"group id {group_id!r} is not a string")
        return self._enqueue(_Request([], group_id, Future(), time.monotonic()))

    def compact(self) -> int:
        """Rewrite the table to its live rows in one overwrite commit, then vacuum, checkpoint and
        clean the log; returns the rows removed. Runs on the writer thread, between appends."""
        future: Future[int] = Future()
        with self._lock:
            if self._closed:
                raise errors.CoordinatorNotAvailableError("the offset store is closed")
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

    def _enqueue(self, request: _Request) -> Future[None]:
        with self._lock:
            if self._closed:
                raise errors.CoordinatorNotAvailableError("the offset store is closed")
            if not request.commits and request.delete_group is None:
                request.future.set_result(None)
                return request.future
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
                if self._queue:  # linger: let more commits join this Delta commit
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
                log.exception("the __consumer_offsets writer failed")
                for future in [r.future for r in batch] + compactions:
                    if not future.done():
                        future.set_exception(errors.KafkaStorageError(f"offset store: {e!r}"))

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
        pending: dict[tuple[str, str, int], bool] = {}  # key -> live, after earlier requests
        for request in batch:
            commits = (request.commits if request.delete_group is None
                       else self._tombstones(request.delete_group, pending))
            for c in commits:
                rows.append(_row(first + len(rows), c, now_ms))
                pending[(c.group_id, c.topic, c.partition)] = c.offset is not None
        # Used even if the append fails: an append whose outcome is unknown may have landed.
        self._next_sequence = first + len(rows)
        if rows:
            try:
                self._append(rows, first)
            except (errors.KafkaStorageError, CommitConflict, FencedWriter) as e:
                log.warning("cannot write %d offset commits to %s: %s", len(rows), self.path, e)
                for request in batch:
                    request.future.set_exception(errors.KafkaStorageError(
                        f"cannot write offset commits to {self.path}: {e}"))
                return
        with self._lock:
            for row in rows:
                self._apply(row)
            self._rows += len(rows)
        for request in batch:
            request.future.set_result(None)

    def _append(self, rows: list[dict[str, Any]], first: int) -> None:
        """One Delta commit of `rows`, or an exception with nothing committed. An append whose
        outcome was unknown (the store failed, perhaps after the commit landed) that did land
        counts as committed, so memory keeps matching the table."""
        data = pa.Table.from_pylist(rows, schema=SCHEMA)
        try:
            self._appends.commit(adds=[self._appends.write_file(data)],
                                 txns={OFFSETS_TXN_APP_ID: first + len(rows)},
                                 info={"deltabus.operation": COMMIT,
                                       "deltabus.first_sequence": first})
        except errors.KafkaStorageError:
            if not self._landed(rows):
                raise
        if self._appends.version % CHECKPOINT_COMMITS == 0:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Checkpoint the latest version and delete the log files past the table's log
        retention: after the acknowledgement, and a failure only leaves it to the next one."""
        try:
            update(self._table)
            self._table.create_checkpoint()
            self._table.cleanup_metadata()
        except Exception as e:
            log.warning("cannot checkpoint %s: %s", self.path, e)

    def _tombstones(self, group_id: str, pending: dict[tuple[str, str, int], bool]
                    ) -> list[OffsetCommit]:
        """Tombstones for the group's live offsets: in memory, as changed by the batch so far.
        Reads memory without the lock: only this thread changes it."""
        keys = {(group_id, t, p) for t, p in self._groups.get(group_id, {})}
        for key, live in pending.items():
            if key[0] == group_id:
                if live:
                    keys.add(key)
                else:
                    keys.discard(key)
        return [OffsetCommit(g, t, p, None) for g, t, p in sorted(keys)]

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
        with self._lock:
            for row in rows:
                self._apply(row)
            self._rows += len(rows)

    def _compaction_due(self) -> bool:
        return (self._rows > self._compact_min_rows and self._rows > 2 * self._live
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
        live = [e.row for entries in self._groups.values() for e in entries.values()]
        if self._newest is not None and self._newest["committed_offset"] is None:
            live.append(self._newest)  # keeps the highest sequence for a restart
        live.sort(key=lambda row: row["sequence"])
        if len(live) >= before:
            for future in requests:
                future.set_result(0)
            return
        try:
            update(self._table)
            write_deltalake(self._table, pa.Table.from_pylist(live, schema=SCHEMA),
                            mode="overwrite", commit_properties=_properties(COMPACTION))
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
                               commit_properties=_properties(COMPACTION))
            update(self._table)
            self._appends.catch_up(self._table.version())
            self._table.create_checkpoint()
            self._table.cleanup_metadata()
        except Exception as e:
            log.warning("cannot checkpoint or vacuum %s after compacting it: %s", self.path, e)

    # ---- replay --------------------------------------------------------------------------------

    def _replay(self) -> None:
        """Load the table into memory: rows in sequence order, the latest of a key wins."""
        try:
            table = self._table.to_pyarrow_table()
        except Exception as e:
            raise errors.KafkaStorageError(f"cannot read {self.path}: {e}") from e
        missing = set(SCHEMA.names) - set(table.column_names)
        if missing:
            raise errors.KafkaStorageError(
                f"{self.path} is not a consumer offsets table: no {sorted(missing)} columns")
        table = table.sort_by("sequence")
        # Delta stores microseconds; the store writes and keeps milliseconds.
        stamps = pc.cast(table["commit_timestamp"], pa.timestamp("ms", tz="UTC"), safe=False)
        columns = [stamps.cast(pa.int64()).to_pylist() if name == "commit_timestamp"
                   else table[name].to_pylist() for name in SCHEMA.names]
        with self._lock:
            for values in zip(*columns, strict=True):
                self._apply(dict(zip(SCHEMA.names, values, strict=True)))
            self._rows = table.num_rows
            if self._newest is not None:
                self._next_sequence = self._newest["sequence"] + 1

    def _apply(self, row: dict[str, Any]) -> None:
        """One row into memory, in sequence order. Called under the lock."""
        key = (row["topic"], row["partition"])
        entries = self._groups.get(row["group_id"])
        if row["committed_offset"] is None:
            if entries is not None and entries.pop(key, None) is not None:
                self._live -= 1
                if not entries:
                    del self._groups[row["group_id"]]
        else:
            if entries is None:
                entries = self._groups[row["group_id"]] = {}
            epoch = row["leader_epoch"]
            offset = OffsetAndMetadata(row["committed_offset"], -1 if epoch is None else epoch,
                                       row["metadata"] or "", row["commit_timestamp"])
            if entries.get(key) is None:
                self._live += 1
            entries[key] = _Entry(row, offset)
        self._newest = row


def _open(path: str, storage_options: dict[str, str] | None) -> DeltaTable:
    try:
        try:
            return open_table(path, storage_options=storage_options)
        except TableNotFoundError:
            return DeltaTable.create(
                path, SCHEMA, mode="ignore", name="__consumer_offsets",
                description="deltabus: consumer groups' committed offsets",
                configuration=TABLE_CONFIGURATION, storage_options=storage_options)
    except Exception as e:
        raise errors.KafkaStorageError(f"cannot open {path}: {e}") from e


def _check(c: OffsetCommit, metadata_max_bytes: int) -> None:
    """Kafka's limits, and values that fit the columns (a bad one would fail a shared append)."""
    if not isinstance(c, OffsetCommit):
        raise errors.InvalidRequestError(f"{c!r} is not an OffsetCommit")
    where = f"{c.group_id!r} {c.topic!r} partition {c.partition!r}"
    if not all(isinstance(s, str) for s in (c.group_id, c.topic, c.member_id)):
        raise errors.InvalidRequestError(f"{where}: group, topic and member ids are strings")
    if not _fits(c.partition, 0, _INT32[1]):
        raise errors.InvalidRequestError(f"{where}: a partition is an int32 >= 0")
    if not _fits(c.generation_id, *_INT32):
        raise errors.InvalidRequestError(f"{where}: generation {c.generation_id!r} is no int32")
    om = c.offset
    if om is None:
        return
    if not isinstance(om, OffsetAndMetadata):
        raise errors.InvalidRequestError(f"{where}: {om!r} is not an OffsetAndMetadata")
    if not _fits(om.offset, *_INT64) or not _fits(om.leader_epoch, *_INT32):
        raise errors.InvalidRequestError(
            f"{where}: offset {om.offset!r} (int64) or leader epoch {om.leader_epoch!r} (int32)")
    if not _fits(om.commit_timestamp_ms, 0, _MAX_TIMESTAMP_MS):
        raise errors.InvalidRequestError(
            f"{where}: commit timestamp {om.commit_timestamp_ms!r} out of range")
    if not isinstance(om.metadata, str):
        raise errors.InvalidRequestError(f"{where}: metadata {om.metadata!r} is not a string")
    if len(om.metadata.encode()) > metadata_max_bytes:
        raise errors.OffsetMetadataTooLargeError(
            f"{where}: metadata of {len(om.metadata.encode())} bytes, more than "
            f"{metadata_max_bytes} (offset.metadata.max.bytes)")


def _fits(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and low <= value <= high


def _row(sequence: int, c: OffsetCommit, now_ms: int) -> dict[str, Any]:
    om = c.offset
    return {
        "sequence": sequence,
        "group_id": c.group_id,
        "topic": c.topic,
        "partition": c.partition,
        "committed_offset": None if om is None else om.offset,
        "leader_epoch": None if om is None else om.leader_epoch,
        "metadata": None if om is None else om.metadata,
        "commit_timestamp": now_ms if om is None else om.commit_timestamp_ms or now_ms,
        "member_id": c.member_id,
        "generation_id": c.generation_id,
    }


def _properties(operation: str) -> CommitProperties:
    """commitInfo of delta-rs's commits (the compaction, vacuum) saying what they were: Delta
    history shows it."""
    return commit_properties({"deltabus.operation": operation})
