"""A partition leader's transaction state (KIP-98): open transactions, the last stable offset and
the index of aborted transactions, as Kafka's ProducerStateManager and TransactionIndex keep them.

A transactional producer's first batch on a partition after its last marker (or ever) opens its
transaction here at that batch's first offset; its marker (control_records.py) ends it, and an
ABORT marker adds (producer id, first offset, marker offset) to the aborted index that
read_committed fetches are told of. The last stable offset (LSO) is the first offset of the oldest
open transaction, or the high watermark when none is open below it: read_committed consumers
read up to it, never past.

The state is not in the table as such: the log keeps it as it appends (`LogTransactions`), and
a log that did not see its appends (a follower made leader, a reopened table) rebuilds it with
`read_transactions`: the markers from the rows with producer_id >= 0 and sequence -1 (row groups
whose statistics exclude such rows are not read), and the open transactions from the producers
the metadata image says have one open here (`MetadataImage.open_transactions`): each one's first
row after its last marker here.

Invariants: every open transaction's first offset is below the log end offset; aborted entries
are in the order of their markers' offsets (increasing). Not locked itself: the log's lock guards
every call.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus.log_tables.control_records import (
    TXN_FIRST_OFFSET_HEADER,
    cannot_hold_markers,
    control_mask,
    is_commit,
)
from deltabus.log_tables.log_reader import leaf_columns
from deltabus.log_tables.producer_state import producer_rows

NO_OFFSET = -1  # a marker's first-offset header when its producer wrote nothing here
READ_UNCOMMITTED, READ_COMMITTED = 0, 1  # Kafka's isolation levels (Fetch, ListOffsets)
_MARKER_COLUMNS = ["offset", "key", "headers", "producer_id", "sequence"]


@dataclass(frozen=True)
class AbortedTxn:
    """An aborted transaction on this partition: Fetch's AbortedTransaction (its last offset
    is its ABORT marker's)."""

    producer_id: int
    first_offset: int
    last_offset: int


class TransactionState:
    """Open transactions and aborted index of one partition log (see the module docstring)."""

    def __init__(self, open_txns: dict[int, int] | None = None,
                 aborted: Iterable[AbortedTxn] = ()) -> None:
        self.open: dict[int, int] = dict(open_txns or {})  # producer id -> first offset
        self.aborted: list[AbortedTxn] = sorted(aborted, key=lambda a: a.last_offset)
        self._aborted_ends = [a.last_offset for a in self.aborted]

    def begin(self, producer_id: int, offset: int) -> None:
        """A transactional batch of `producer_id` was appended at `offset`."""
        self.open.setdefault(producer_id, offset)

    def first_offset(self, producer_id: int) -> int:
        """Where `producer_id`'s open transaction began here (NO_OFFSET: none is open)."""
        return self.open.get(producer_id, NO_OFFSET)

    def end(self, producer_id: int, marker_offset: int, committed: bool) -> None:
        """`producer_id`'s marker was appended at `marker_offset`."""
        first = self.open.pop(producer_id, NO_OFFSET)
        if not committed and first != NO_OFFSET:
            self.aborted.append(AbortedTxn(producer_id, first, marker_offset))
            self._aborted_ends.append(marker_offset)

    @property
    def first_open_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None: none is open)."""
        return min(self.open.values(), default=None)

    def last_stable_offset(self, high_watermark: int) -> int:
        """Kafka's LSO: below it every transaction is decided."""
        return min([high_watermark, *self.open.values()])

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions with records in [start, end): what a read_committed fetch
        of those offsets must be told of (their markers are at or after `start`)."""
        out = []
        for entry in self.aborted[bisect.bisect_left(self._aborted_ends, start):]:
            if entry.first_offset < end:
                out.append(entry)
        return out

    def apply(self, records: pa.Table, begins: Iterable[tuple[int, int]]) -> None:
        """Take in one commit: the transactional batches it appended ((producer id, first
        offset) each) and the markers among its `records`, in offset order."""
        events: list[tuple[int, int, bool | None]] = [(o, p, None) for p, o in begins]
        markers = records.filter(control_mask(records)) if records.num_rows else records
        for offset, pid, key in zip(markers.column("offset").to_pylist(),
                                    markers.column("producer_id").to_pylist(),
                                    markers.column("key").to_pylist(), strict=True):
            events.append((offset, pid, is_commit(key)))
        for offset, pid, committed in sorted(events, key=lambda e: e[0]):
            if committed is None:
                self.begin(pid, offset)
            else:
                self.end(pid, offset, committed)


class LogTransactions:
    """The transaction state as a leader's log keeps it: not known until first needed, then
    rebuilt from the committed table (`read_transactions`, once per leadership) and kept up as
    appends commit; forgotten when the log changes in ways it does not follow (a follower's
    copies, a truncation, a failed commit), to be rebuilt if it leads. Kept apart from the log so
    that the commit round (commit_round.py) can be handed it. Runs on executors; not locked
    itself: the log's lock guards every call, but `first_open` is read without it."""

    def __init__(self, files: Callable[[], Iterable[pq.ParquetFile]]) -> None:
        """`files()` gives the log's committed data files, opened, in offset order."""
        self._files = files
        # None until first needed, then kept as appends commit; `_open_hint` names the
        # producers the metadata says have one open here.
        self._txn: TransactionState | None = None
        self._open_hint: frozenset[int] = frozenset()
        # The oldest open transaction's first offset (None: none, or not known): read without
        # the lock by `PartitionLog.stable_offset_hint`.
        self.first_open: int | None = None

    def reset(self, open_producers: frozenset[int]) -> None:
        """Forget the state, to rebuild it when first needed with `open_producers` (the
        metadata's producers with a transaction open here)."""
        self._txn, self.first_open = None, None
        self._open_hint = open_producers

    def forget(self) -> None:
        """The log changed in a way the state does not follow: rebuilt when next needed."""
        self._txn, self.first_open = None, None

    def state(self) -> TransactionState:
        """The transaction state, rebuilt from the committed table if unknown (once per
        leadership; reads only the row groups that may hold markers or open producers)."""
        if self._txn is None:
            self._txn = read_transactions(self._files, self._open_hint)
            self.first_open = self._txn.first_open_offset
        return self._txn

    def take_in(self, records: pa.Table, begins: tuple[tuple[int, int], ...]) -> None:
        """An append committed `records`, with `begins` ((producer id, first offset) of each
        transactional batch): the state follows it when known, else the new transactions are
        read from the table when it is rebuilt."""
        if self._txn is not None:
            self._txn.apply(records, begins)
            self.first_open = self._txn.first_open_offset
        elif begins:  # the new transactions are read from the table
            self._open_hint |= {pid for pid, _ in begins}


def aborted_mask(rows: pa.Table, aborted: Iterable[AbortedTxn]) -> np.ndarray:
    """Which of `rows` (offset and producer_id columns) are records of the `aborted`
    transactions (their ABORT markers excluded)."""
    out = np.zeros(rows.num_rows, bool)
    aborted = list(aborted)
    if not aborted:
        return out
    pids = rows.column("producer_id").to_numpy()
    offsets = rows.column("offset").to_numpy()
    for txn in aborted:
        out |= ((pids == txn.producer_id) & (offsets >= txn.first_offset)
                & (offsets < txn.last_offset))
    return out


def consumed_rows(rows: pa.Table, aborted: Iterable[AbortedTxn] = ()) -> pa.Table:
    """The rows a consumer gets: never a marker, nor a record of the `aborted` transactions
    (read_committed passes those a fetch of `rows` is told of)."""
    if not rows.num_rows:
        return rows
    keep = ~(control_mask(rows).to_numpy(zero_copy_only=False) | aborted_mask(rows, aborted))
    return rows if keep.all() else rows.filter(pa.array(keep))


def read_markers(files: Iterable[pq.ParquetFile]) -> pa.Table:
    """The markers of the files (offset, key, headers, producer_id, sequence), in offset order.
    Row groups whose statistics show no producer id >= 0 or no sequence -1 are skipped."""
    parts = []
    for reader in files:
        leaves = leaf_columns(reader)
        for group in range(reader.metadata.num_row_groups):
            meta = reader.metadata.row_group(group)
            if cannot_hold_markers(meta, leaves):
                continue
            part = reader.read_row_group(group, columns=_MARKER_COLUMNS)
            parts.append(part.filter(control_mask(part)))
    if not parts:
        return pa.table({name: [] for name in _MARKER_COLUMNS})
    return pa.concat_tables(parts).sort_by("offset")


def first_offset_header(headers: list[dict] | None) -> int:
    """The transaction's first offset a marker's headers name (NO_OFFSET when none)."""
    for header in headers or ():
        if header["key"] == TXN_FIRST_OFFSET_HEADER and header["value"] is not None:
            return int(header["value"])
    return NO_OFFSET


def aborted_in(markers: pa.Table) -> tuple[list[AbortedTxn], dict[int, int]]:
    """The aborted transactions `markers` (read_markers) end, and each producer's last
    marker offset."""
    aborted = []
    last_marker: dict[int, int] = {}
    for offset, key, headers, pid in zip(
            markers.column("offset").to_pylist(), markers.column("key").to_pylist(),
            markers.column("headers").to_pylist(), markers.column("producer_id").to_pylist(),
            strict=True):
        last_marker[pid] = offset
        first = first_offset_header(headers)
        if not is_commit(key) and first != NO_OFFSET:
            aborted.append(AbortedTxn(pid, first, offset))
    return aborted, last_marker


def read_transactions(files: Callable[[], Iterable[pq.ParquetFile]],
                      open_producers: Iterable[int]) -> TransactionState:
    """Rebuild a log's transaction state from its committed files (`files()` gives them, in
    offset order, each call afresh) and the producers with a transaction open on it."""
    aborted, last_marker = aborted_in(read_markers(files()))
    open_txns = {}
    for pid in open_producers:
        rows = producer_rows(files(), pid)
        if rows is None:
            continue
        after = rows.filter(pc.and_(pc.greater(rows.column("offset"), last_marker.get(pid, -1)),
                                    pc.greater_equal(rows.column("sequence"), 0)))
        if after.num_rows:
            open_txns[pid] = int(pc.min(after.column("offset")).as_py())
    return TransactionState(open_txns, aborted)
