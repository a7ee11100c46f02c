"""`__consumer_offsets`: the committed offsets of every consumer group, as one Delta table.

Runs in the Spark driver beside the group coordinator, a compacted table (compacted_table.py,
where the writer thread, the group commit, the unknown appends and the compaction are; its
invariants hold here). Each row is one offset commit, Kafka's OffsetCommitKey and
OffsetCommitValue as plain columns, so any Delta reader can query a group's progress with SQL. A
key is (group, topic, partition); its committed offset is its row with the highest `sequence`; a
null `committed_offset` is a tombstone (the offset was deleted or expired). One OffsetCommit
request is one write: its partitions land in one Delta commit.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
from deltabus.offsets.compacted_table import CHECKPOINT_COMMITS, CompactedTable, Key

__all__ = ["CHECKPOINT_COMMITS", "OffsetAndMetadata", "OffsetCommit", "OffsetStore"]

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
COMMIT = "offset-commit"
COMPACTION = "offset-compaction"
OFFSETS_TXN_APP_ID = "deltabus.offsets"  # app transaction of every append: the next sequence

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


class OffsetStore(CompactedTable):
    """The committed offsets of every group: in memory for reads, durably in Delta."""

    SCHEMA = SCHEMA
    TABLE_NAME = "__consumer_offsets"
    DESCRIPTION = "deltabus: consumer groups' committed offsets"
    TXN_APP_ID = OFFSETS_TXN_APP_ID
    COMMIT = COMMIT
    COMPACTION = COMPACTION
    TIMESTAMP_COLUMNS = ("commit_timestamp",)

    def __init__(self, path: str, *, commit_linger_ms: int = 5, commit_batch_max: int = 10_000,
                 compact_min_rows: int = 10_000,
                 metadata_max_bytes: int = cfg.OFFSET_METADATA_MAX_BYTES,
                 storage_options: dict[str, str] | None = None) -> None:
        self.metadata_max_bytes = metadata_max_bytes
        # group -> (topic, partition) -> its offset: under the lock, as the base's state.
        self._groups: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
        super().__init__(path, commit_linger_ms=commit_linger_ms,
                         commit_batch_max=commit_batch_max, compact_min_rows=compact_min_rows,
                         storage_options=storage_options)

    # ---- reading -------------------------------------------------------------------------------

    def offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        """The group's committed offsets by (topic, partition): acknowledged commits only."""
        with self._lock:
            return dict(self._groups.get(group_id, {}))

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
            return max((om.commit_timestamp_ms
                        for om in self._groups.get(group_id, {}).values()), default=0)

    # ---- writing -------------------------------------------------------------------------------

    def commit(self, commits: list[OffsetCommit]) -> Future[None]:
        """Queue commits for the next Delta append. The future resolves once they are durable and
        visible to `offsets`, or fails with KafkaStorageError (then none of them is applied).

        Everything is checked here, before queueing: a bad commit fails alone instead of failing
        the whole batch it would have shared with other groups' commits."""
        commits = list(commits)
        for c in commits:
            _check(c, self.metadata_max_bytes)
        if not commits:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        return self._enqueue(commits, len(commits))

    def delete_group(self, group_id: str) -> Future[None]:
        """Tombstones for every offset of the group. The offsets are looked up when its turn comes
        on the writer thread, so commits queued before it are deleted too."""
        if not isinstance(group_id, str):
            raise errors.InvalidRequestError(f"group id {group_id!r} is not a string")
        return self._enqueue(_DeleteGroup(group_id), 1)

    # ---- the compacted table's hooks ------------------------------------------------------------

    def _key(self, row: dict[str, Any]) -> Key:
        return row["group_id"], row["topic"], row["partition"]

    def _is_tombstone(self, row: dict[str, Any]) -> bool:
        return row["committed_offset"] is None

    def _rows_of(self, payload: Any, pending: dict[Key, dict[str, Any] | None], now_ms: int
              ) -> list[dict[str, Any]]:
        commits = (self._tombstones(payload.group_id, pending)
                   if isinstance(payload, _DeleteGroup) else payload)
        return [_row(c, now_ms) for c in commits]

    def _tombstones(self, group_id: str, pending: dict[Key, dict[str, Any] | None]
                    ) -> list[OffsetCommit]:
        """Tombstones for the group's live offsets: in memory, as changed by the batch so far.
        Reads memory without the lock: only the writer thread changes it."""
        keys = {(group_id, t, p) for t, p in self._groups.get(group_id, {})}
        for key, row in pending.items():
            if key[0] == group_id:
                if row is not None:
                    keys.add(key)
                else:
                    keys.discard(key)
        return [OffsetCommit(g, t, p, None) for g, t, p in sorted(keys)]

    def _on_apply(self, row: dict[str, Any], tombstone: bool) -> None:
        key = (row["topic"], row["partition"])
        entries = self._groups.get(row["group_id"])
        if tombstone:
            if entries is not None and entries.pop(key, None) is not None and not entries:
                del self._groups[row["group_id"]]
            return
        if entries is None:
            entries = self._groups[row["group_id"]] = {}
        epoch = row["leader_epoch"]
        entries[key] = OffsetAndMetadata(row["committed_offset"],
                                         -1 if epoch is None else epoch,
                                         row["metadata"] or "", row["commit_timestamp"])


@dataclass(frozen=True)
class _DeleteGroup:
    """A queued deletion of a group's offsets: its tombstones are made on the writer thread."""

    group_id: str


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


def _row(c: OffsetCommit, now_ms: int) -> dict[str, Any]:
    om = c.offset
    return {
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
