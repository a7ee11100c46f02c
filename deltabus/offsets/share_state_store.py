"""`__share_group_state`: how far each share group (KIP-932) has got in each partition, as one
Delta table, where Kafka keeps it in its `__share_group_state` topic.

A partition's leader holds a share group's state there in memory (cluster/share_partition.py)
and writes it here, in the driver, whenever an acknowledgement, a release or an expired lock
changes it, before it answers: a leader change or a broker restart resumes every group where it
was. Each row is a whole snapshot of one share-partition (Kafka's ShareSnapshot): the start
offset (every record below it is done), and the in-flight records past it in batches, each with
its state and delivery count. Records still acquired are written as AVAILABLE: a new leader
delivers them again rather than lose them. A compacted table (compacted_table.py): the key is
(group, topic, partition), the newest row wins, a null start offset is a tombstone.

Two epochs fence stale writers, as Kafka's share coordinator does:
- the leader epoch: a new leader's first act is `claim`, which raises the stored leader epoch to
  its own in the same append that reads the state, so a former leader's later writes are refused
  (FENCED_LEADER_EPOCH) and no write lands between the read and the claim;
- the state epoch: altering or deleting a group's offsets (an admin call, the group empty) bumps
  it, so a leader still holding the old state is refused (FENCED_STATE_EPOCH) and reloads.
Checks run on the writer thread, against memory as the batch so far leaves it, so two writers'
order is the table's order.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from deltabus import errors
from deltabus.offsets.compacted_table import CompactedTable, Key

# Kafka's RecordState, as the state APIs carry it.
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4

_BATCH = pa.struct([
    pa.field("first_offset", pa.int64(), nullable=False),
    pa.field("last_offset", pa.int64(), nullable=False),
    pa.field("delivery_state", pa.int8(), nullable=False),
    pa.field("delivery_count", pa.int16(), nullable=False),
])
SCHEMA = pa.schema([
    pa.field("sequence", pa.int64(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("start_offset", pa.int64()),  # null: a tombstone (the group's state was deleted)
    pa.field("state_epoch", pa.int32(), nullable=False),
    pa.field("leader_epoch", pa.int32(), nullable=False),
    pa.field("batches", pa.list_(_BATCH)),
    pa.field("write_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
])


@dataclass(frozen=True)
class StateBatch:
    """In-flight records first_offset..last_offset (inclusive), in one state."""

    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


@dataclass(frozen=True)
class ShareState:
    """A share-partition's durable state: records below `start_offset` are done (acknowledged
    or archived); `batches` are the in-flight ones past it; past them, nothing was delivered."""

    group_id: str
    topic: str
    partition: int
    start_offset: int
    state_epoch: int = 0
    leader_epoch: int = -1
    batches: tuple[StateBatch, ...] = ()
    write_timestamp_ms: int = 0


@dataclass
class _Claim:
    key: Key
    leader_epoch: int
    answer: ShareState | None = None


@dataclass
class _Alter:
    key: Key
    start_offset: int
    answer: ShareState | None = None


@dataclass
class _Delete:
    group_id: str
    partitions: list[tuple[str, int]] | None  # None: every partition of the group
    deleted: list[tuple[str, int]] = field(default_factory=list)


class ShareStateStore(CompactedTable):
    """Every share group's state in every partition: in memory for reads, durably in Delta."""

    SCHEMA = SCHEMA
    TABLE_NAME = "__share_group_state"
    DESCRIPTION = "deltabus: share groups' start offsets and in-flight records (KIP-932)"
    TXN_APP_ID = "deltabus.share_group_state"
    COMMIT = "share-state-write"
    COMPACTION = "share-state-compaction"
    TIMESTAMP_COLUMNS = ("write_timestamp",)

    def __init__(self, path: str, *, commit_linger_ms: int = 5, commit_batch_max: int = 10_000,
                 compact_min_rows: int = 10_000,
                 storage_options: dict[str, str] | None = None) -> None:
        self._groups: dict[str, dict[tuple[str, int], ShareState]] = {}  # under the lock
        # Deleted states' next state epoch, so a leader that still holds one is fenced: while
        # their tombstones are in the table (a compaction keeps only the newest row's).
        self._deleted: dict[Key, int] = {}
        super().__init__(path, commit_linger_ms=commit_linger_ms,
                         commit_batch_max=commit_batch_max, compact_min_rows=compact_min_rows,
                         storage_options=storage_options)

    # ---- reading -------------------------------------------------------------------------------

    def read(self, group_id: str, topic: str, partition: int) -> ShareState | None:
        """The durable state of a share-partition (None: the group never started it)."""
        with self._lock:
            return self._groups.get(group_id, {}).get((topic, partition))

    def states(self, group_id: str) -> dict[tuple[str, int], ShareState]:
        """Every partition's state of a share group."""
        with self._lock:
            return dict(self._groups.get(group_id, {}))

    def groups(self) -> list[str]:
        """Share groups with state in at least one partition, sorted."""
        with self._lock:
            return sorted(self._groups)

    # ---- writing -------------------------------------------------------------------------------

    def claim(self, group_id: str, topic: str, partition: int,
              leader_epoch: int) -> Future[ShareState | None]:
        """A leader's first step with a share-partition: the state as it is, with the stored
        leader epoch raised to `leader_epoch`, durably, so a former leader's writes are refused
        from then on. None: the group has no state there (nothing is written). Refused with
        FENCED_LEADER_EPOCH when a newer leader claimed it."""
        claim = _Claim((group_id, topic, partition), leader_epoch)
        return _answer(self._enqueue(claim, 1), lambda: claim.answer)

    def write(self, state: ShareState) -> Future[None]:
        """A leader's snapshot of a share-partition. Refused with FENCED_LEADER_EPOCH after a
        newer leader's claim, and with FENCED_STATE_EPOCH when the offsets were altered or
        deleted since the state it holds was read."""
        _check(state)
        return self._enqueue(state, 1)

    def alter(self, group_id: str, topic: str, partition: int,
              start_offset: int) -> Future[ShareState]:
        """AlterShareGroupOffsets (and a group's first start offset): the partition starts
        over at `start_offset`, nothing in flight, in a new state epoch."""
        alter = _Alter((group_id, topic, partition), start_offset)
        return _answer(self._enqueue(alter, 1), lambda: _present(alter.answer))

    def delete(self, group_id: str, partitions: Iterable[tuple[str, int]] | None = None
               ) -> Future[list[tuple[str, int]]]:
        """DeleteShareGroupOffsets (the named partitions) or a deleted group (None: all):
        tombstones for the state there is; answers the partitions deleted."""
        delete = _Delete(group_id, None if partitions is None else list(partitions))
        return _answer(self._enqueue(delete, 1), lambda: delete.deleted)

    # ---- the compacted table's hooks ------------------------------------------------------------

    def _key(self, row: dict[str, Any]) -> Key:
        return row["group_id"], row["topic"], row["partition"]

    def _is_tombstone(self, row: dict[str, Any]) -> bool:
        return row["start_offset"] is None

    def _rows_of(self, payload: Any, pending: dict[Key, dict[str, Any] | None], now_ms: int
                 ) -> list[dict[str, Any]]:
        def current(key: Key) -> dict[str, Any] | None:
            return pending[key] if key in pending else self._live.get(key)

        if isinstance(payload, _Delete):
            live = {k for k in self._live if k[0] == payload.group_id}
            live |= {k for k, row in pending.items() if k[0] == payload.group_id and row}
            live -= {k for k, row in pending.items() if k[0] == payload.group_id and not row}
            asked = (live if payload.partitions is None
                     else {(payload.group_id, t, p) for t, p in payload.partitions} & live)
            payload.deleted = sorted((t, p) for _, t, p in asked)
            return [{**_unkeyed(current(k)), **_keyed(k), "start_offset": None,
                     "state_epoch": _present_row(current(k))["state_epoch"] + 1,
                     "batches": None, "write_timestamp": now_ms} for k in sorted(asked)]
        if isinstance(payload, _Claim):
            row = current(payload.key)
            if row is None:
                return []
            if row["leader_epoch"] > payload.leader_epoch:
                raise errors.FencedLeaderEpochError(
                    f"{_name(payload.key)}: leader epoch {payload.leader_epoch} is older than "
                    f"{row['leader_epoch']}, whose leader claimed the share state")
            row = {**row, "leader_epoch": payload.leader_epoch, "write_timestamp": now_ms}
            payload.answer = _state(row)
            return [_unkeyed(row) | _keyed(payload.key)]
        if isinstance(payload, _Alter):
            row = current(payload.key)
            group_id, topic, partition = payload.key
            state = ShareState(group_id, topic, partition, start_offset=payload.start_offset,
                               state_epoch=(self._deleted.get(payload.key, 0) if row is None
                                            else row["state_epoch"] + 1),
                               leader_epoch=-1 if row is None else row["leader_epoch"],
                               write_timestamp_ms=now_ms)
            payload.answer = state
            return [_row(state)]
        state = payload
        key = (state.group_id, state.topic, state.partition)
        row = current(key)
        if row is not None and row["leader_epoch"] > state.leader_epoch:
            raise errors.FencedLeaderEpochError(
                f"{_name(key)}: leader epoch {state.leader_epoch} is older than "
                f"{row['leader_epoch']}, whose leader claimed the share state")
        stored = row["state_epoch"] if row is not None else self._deleted.get(key, 0)
        if stored != state.state_epoch:
            raise errors.FencedStateEpochError(
                f"{_name(key)}: state epoch {state.state_epoch} is not the stored one "
                f"({stored}): its offsets were altered or deleted")
        return [_row(state, now_ms)]

    def _on_apply(self, row: dict[str, Any], tombstone: bool) -> None:
        if tombstone:  # a state started again later begins past the deleted one's epoch
            self._deleted[self._key(row)] = row["state_epoch"]
        key = (row["topic"], row["partition"])
        states = self._groups.get(row["group_id"])
        if tombstone:
            if states is not None and states.pop(key, None) is not None and not states:
                del self._groups[row["group_id"]]
            return
        if states is None:
            states = self._groups[row["group_id"]] = {}
        states[key] = _state(row)


def _answer(written: Future[None], answer: Any) -> Future[Any]:
    """A future of `answer()`, once the write it was worked out in is durable."""
    result: Future[Any] = Future()

    def done(f: Future[None]) -> None:
        error = f.exception()
        if error is not None:
            result.set_exception(error)
        else:
            result.set_result(answer())

    written.add_done_callback(done)
    return result


def _present_row(row: dict[str, Any] | None) -> dict[str, Any]:
    assert row is not None
    return row


def _present(state: ShareState | None) -> ShareState:
    assert state is not None
    return state


def _name(key: Key) -> str:
    return f"share group {key[0]!r} {key[1]}-{key[2]}"


def _keyed(key: Key) -> dict[str, Any]:
    return {"group_id": key[0], "topic": key[1], "partition": key[2]}


def _unkeyed(row: dict[str, Any] | None) -> dict[str, Any]:
    """A row without its sequence (the writer numbers it again)."""
    if row is None:
        return {"state_epoch": 0, "leader_epoch": -1}
    return {k: v for k, v in row.items() if k != "sequence"}


def _row(state: ShareState, now_ms: int | None = None) -> dict[str, Any]:
    return {
        "group_id": state.group_id, "topic": state.topic, "partition": state.partition,
        "start_offset": state.start_offset, "state_epoch": state.state_epoch,
        "leader_epoch": state.leader_epoch,
        "batches": [{"first_offset": b.first_offset, "last_offset": b.last_offset,
                     "delivery_state": b.delivery_state, "delivery_count": b.delivery_count}
                    for b in state.batches],
        "write_timestamp": state.write_timestamp_ms if now_ms is None else now_ms,
    }


def _state(row: dict[str, Any]) -> ShareState:
    return ShareState(
        row["group_id"], row["topic"], row["partition"], start_offset=row["start_offset"],
        state_epoch=row["state_epoch"], leader_epoch=row["leader_epoch"],
        batches=tuple(StateBatch(b["first_offset"], b["last_offset"], b["delivery_state"],
                                 b["delivery_count"]) for b in row["batches"] or ()),
        write_timestamp_ms=row["write_timestamp"])


_INT32 = (-(2**31), 2**31 - 1)


def _check(state: ShareState) -> None:
    """Values that fit the columns: a bad one would fail the whole shared append."""
    if not isinstance(state, ShareState) or not all(
            isinstance(s, str) for s in (state.group_id, state.topic)):
        raise errors.InvalidRequestError(f"{state!r} is not a share state")
    if not (0 <= state.partition <= _INT32[1] and state.start_offset >= 0
            and _INT32[0] <= state.leader_epoch <= _INT32[1]
            and 0 <= state.state_epoch <= _INT32[1]):
        raise errors.InvalidRequestError(f"{state!r}: a value out of its column's range")
    for b in state.batches:
        if not (state.start_offset <= b.first_offset <= b.last_offset
                and b.delivery_state in (AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED)
                and 0 <= b.delivery_count <= 2**15 - 1):
            raise errors.InvalidRequestError(f"{state!r}: batch {b} is not valid")
