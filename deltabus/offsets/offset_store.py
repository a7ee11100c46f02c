"""`__consumer_offsets`: consumer groups' committed offsets, as one Delta table.

Runs in the Spark driver beside the group coordinator. Thread-safe: many gRPC threads commit and
read at once; one writer thread is the only writer of the table.

Each row is one committed offset (Kafka's OffsetCommitKey and OffsetCommitValue as plain columns),
so a group's progress is queryable with SQL like any table. Invariants:
- `sequence` grows strictly across everything the store ever wrote; replaying rows in sequence
  order (the latest row of a group, topic and partition wins; a null offset is a tombstone) gives
  exactly the acknowledged state, before and after compaction.
- A commit's future resolves only after the Delta commit holding it succeeded, and memory changes
  only then: an acknowledged offset survives a restart, a failed one changes nothing.
- Commits queued together share one Delta commit (group commit), so a thousand committing
  consumers do not mean a thousand Delta commits a second.
- Compaction rewrites the table to its live rows on the writer thread, so no append races it.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from deltabus import errors

log = logging.getLogger(__name__)

SCHEMA = pa.schema([
    pa.field("sequence", pa.int64(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("committed_offset", pa.int64()),  # null: a tombstone
    pa.field("leader_epoch", pa.int32()),
    pa.field("metadata", pa.string()),
    pa.field("commit_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("member_id", pa.string()),
    pa.field("generation_id", pa.int32()),
])
METADATA_MAX_CHARS = 4096  # Kafka's offset.metadata.max.bytes
VACUUM_RETENTION_HOURS = 1  # files compaction removed stay this long for running readers


@dataclass(frozen=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = 0


@dataclass(frozen=True)
class OffsetCommit:
    """One row to write; `offset` None writes a tombstone."""

    group_id: str
    topic: str
    partition: int
    offset: OffsetAndMetadata | None
    member_id: str = ""
    generation_id: int = -1


Key = tuple[str, str, int]  # (group, topic, partition)


class OffsetStore:
    """The committed offsets of every group, in memory and durably in Delta."""

    def __init__(self, path: str, *, commit_linger_ms: int = 5, commit_batch_max: int = 10_000,
                 compact_min_rows: int = 10_000,
                 storage_options: dict[str, str] | None = None) -> None:
        self.path = path
        self._linger_s = commit_linger_ms / 1000
        self._batch_max = commit_batch_max
        self._compact_min_rows = compact_min_rows
        try:
            self._table = DeltaTable(path, storage_options=storage_options)
        except TableNotFoundError:
            self._table = DeltaTable.create(
                path, SCHEMA, mode="ignore", name="__consumer_offsets",
                description="deltabus consumer groups' committed offsets",
                storage_options=storage_options)
        self._offsets: dict[Key, OffsetAndMetadata] = {}
        self._next_sequence = 0
        self._rows = 0
        self._replay()
        self._lock = threading.Condition()
        self._queue: list[tuple[list[OffsetCommit], Future[None]]] = []
        self._compact_requests: list[Future[int]] = []
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name="deltabus-consumer-offsets")
        self._writer.start()

    def _replay(self) -> None:
        table = self._table.to_pyarrow_table().sort_by("sequence")
        self._rows = table.num_rows
        for row in table.to_pylist():
            self._apply(row)
        if table.num_rows:
            self._next_sequence = int(table.column("sequence")[-1].as_py()) + 1

    def _apply(self, row: dict) -> None:
        key = (row["group_id"], row["topic"], row["partition"])
        if row["committed_offset"] is None:
            self._offsets.pop(key, None)
            return
        ts = row["commit_timestamp"]
        ms = int(ts.timestamp() * 1000) if hasattr(ts, "timestamp") else int(ts)
        self._offsets[key] = OffsetAndMetadata(row["committed_offset"], row["leader_epoch"],
                                               row["metadata"] or "", ms)

    # ---- reading -------------------------------------------------------------------------------

    def offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        with self._lock:
            return {(t, p): om for (g, t, p), om in self._offsets.items() if g == group_id}

    def groups(self) -> list[str]:
        with self._lock:
            return sorted({g for g, _, _ in self._offsets})

    def last_commit_ms(self, group_id: str) -> int:
        with self._lock:
            return max((om.commit_timestamp_ms for (g, _, _), om in self._offsets.items()
                        if g == group_id), default=0)

    # ---- writing -------------------------------------------------------------------------------

    def commit(self, commits: list[OffsetCommit]) -> Future[None]:
        """Queue commits; the future resolves once they are durable (KafkaStorageError if the
        Delta write failed: then nothing of them is applied)."""
        for c in commits:
            if c.partition < 0:
                raise errors.InvalidRequestError(f"partition {c.partition} of {c.topic} < 0")
            if c.offset is not None and len(c.offset.metadata) > METADATA_MAX_CHARS:
                raise errors.OffsetMetadataTooLargeError(
                    f"metadata of {c.topic}-{c.partition} is longer than {METADATA_MAX_CHARS}")
        future: Future[None] = Future()
        with self._lock:
            if self._closed:
                raise errors.CoordinatorNotAvailableError("the offset store is closed")
            self._queue.append((commits, future))
            self._lock.notify_all()
        return future

    def delete_group(self, group_id: str) -> Future[None]:
        """Tombstones for every offset of the group."""
        with self._lock:
            keys = [k for k in self._offsets if k[0] == group_id]
        return self.commit([OffsetCommit(g, t, p, None) for g, t, p in keys])

    def compact(self) -> int:
        """Rewrite the table to its live rows (on the writer thread); returns rows removed."""
        future: Future[int] = Future()
        with self._lock:
            self._compact_requests.append(future)
            self._lock.notify_all()
        return future.result()

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._compact_requests and not self._closed:
                    self._lock.wait()
                if self._closed and not self._queue and not self._compact_requests:
                    return
                requests, self._compact_requests = self._compact_requests, []
            if requests:
                self._run_compaction(requests)
                continue
            time.sleep(self._linger_s)  # let more commits join this Delta commit
            with self._lock:
                batch, rows = [], 0
                while self._queue and rows < self._batch_max:
                    commits, future = self._queue.pop(0)
                    batch.append((commits, future))
                    rows += len(commits)
            self._write(batch)
            if self._rows > self._compact_min_rows and self._rows > 2 * len(self._offsets):
                self._run_compaction([])

    def _write(self, batch: list[tuple[list[OffsetCommit], Future[None]]]) -> None:
        commits = [c for cs, _ in batch for c in cs]
        now_ms = int(time.time() * 1000)
        first = self._next_sequence
        rows = [_row(first + i, c, now_ms) for i, c in enumerate(commits)]
        try:
            if rows:
                write_deltalake(self._table, pa.Table.from_pylist(rows, schema=SCHEMA),
                                mode="append", commit_properties=_commit_properties(
                                    "offset-commit"))
        except Exception as e:
            error = errors.KafkaStorageError(f"cannot write __consumer_offsets: {e}")
            for _, future in batch:
                future.set_exception(error)
            return
        with self._lock:
            self._next_sequence += len(rows)
            self._rows += len(rows)
            for row in rows:
                self._apply(row)
        for _, future in batch:
            future.set_result(None)

    def _run_compaction(self, requests: list[Future[int]]) -> None:
        with self._lock:
            live = [(k, om) for k, om in sorted(self._offsets.items())]
            before = self._rows
        rows = [{"sequence": self._next_sequence + i, "group_id": g, "topic": t,
                 "partition": p, "committed_offset": om.offset,
                 "leader_epoch": om.leader_epoch, "metadata": om.metadata,
                 "commit_timestamp": om.commit_timestamp_ms, "member_id": "",
                 "generation_id": -1} for i, ((g, t, p), om) in enumerate(live)]
        try:
            write_deltalake(self._table, pa.Table.from_pylist(rows, schema=SCHEMA),
                            mode="overwrite",
                            commit_properties=_commit_properties("offset-compaction"))
            self._table.create_checkpoint()
            self._table.cleanup_metadata()
            self._table.vacuum(retention_hours=VACUUM_RETENTION_HOURS,
                               enforce_retention_duration=False, dry_run=False)
        except Exception as e:
            log.warning("compacting __consumer_offsets failed (it stays as it was): %s", e)
            for future in requests:
                future.set_exception(errors.KafkaStorageError(str(e)))
            return
        with self._lock:
            self._next_sequence += len(rows)
            self._rows = len(rows)
        log.info("compacted __consumer_offsets: %d rows to %d", before, len(rows))
        for future in requests:
            future.set_result(before - len(rows))

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._writer.join(30)


def _row(sequence: int, c: OffsetCommit, now_ms: int) -> dict:
    om = c.offset
    return {"sequence": sequence, "group_id": c.group_id, "topic": c.topic,
            "partition": c.partition, "committed_offset": om.offset if om else None,
            "leader_epoch": om.leader_epoch if om else None,
            "metadata": om.metadata if om else None,
            "commit_timestamp": (om.commit_timestamp_ms or now_ms) if om else now_ms,
            "member_id": c.member_id, "generation_id": c.generation_id}


def _commit_properties(operation: str) -> CommitProperties:
    return CommitProperties(custom_metadata={"deltabus.operation": operation},
                            max_commit_retries=20)
