"""What a partition log knows of its idempotent producers: Kafka's ProducerStateManager.

A producer's batches carry (producer id, producer epoch, base sequence). The log takes them in
sequence order: a batch that arrives before its predecessor waits for it (pipelined requests may
be served out of order), a retried one is answered with its first result (no duplicate), and an
older epoch is fenced. A producer the log has not seen since it opened is rebuilt from the records
it wrote; a follower builds its producers from the records it copies, so as a new leader it
recognises their retries and next sequences.

Looking a producer up reads the table's files (their footers at least), which a log of many
partitions cannot afford for every new producer on every partition. The log keeps an upper bound
of the producer ids its table holds (`producer_id_max`: the largest id of its files' statistics,
in the add actions, or in the footers of files written before those carried producer ids; taken
when first needed, raised by every id it takes in since), so an id above it has written nothing
here and is not looked up: ids are handed out in increasing order (producer_id_control.py), so
every new producer is such an id. The bound only has to stay at or above every id in the table:
only this log adds records to it (the cleaner only removes), and after a truncation, a restart,
or a failed commit that left the table other than the log knew it, the bound is forgotten and
read again.
A producer looked up is read from the newest few files holding it (`recent_producer_rows`).

Not locked itself: the log's lock (a Condition) guards every call, and the out-of-order hold
waits on it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus import errors
from deltabus.log_tables.appender import AppendResult
from deltabus.log_tables.log_reader import leaf_columns
from deltabus.records import TIMESTAMP_TYPE, ProducerState

log = logging.getLogger(__name__)

NO_PRODUCER = ProducerState()
PRODUCER_BATCHES_REMEMBERED = 5  # as Kafka's broker: retries of the last 5 batches are answered
_COLUMNS = ["offset", "producer_id", "producer_epoch", "sequence"]


@dataclass
class ProducerEntry:
    """What the log knows of one idempotent producer: its epoch, the next sequence it must send,
    the futures of its last few batches by (base sequence, records), to answer retries with
    their first result (a batch is a retry only with the same first and last sequence, as
    Kafka's broker matches them), and the sequence runs a follower copied (first sequence,
    last sequence, first offset): a retry sent to a new leader is answered with the offsets
    the old leader gave it."""

    epoch: int
    next_sequence: int
    last_timestamp_ms: int = -1  # the newest timestamp of its records in the last commit
    recent: collections.OrderedDict[tuple[int, int], Future[AppendResult]] = field(
        default_factory=collections.OrderedDict)
    copied: collections.deque[tuple[int, int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=PRODUCER_BATCHES_REMEMBERED))

    def remember(self, base_sequence: int, records: int, future: Future[AppendResult]) -> None:
        self.recent[(base_sequence, records)] = future
        while len(self.recent) > PRODUCER_BATCHES_REMEMBERED:
            self.recent.popitem(last=False)

    def earlier(self, base_sequence: int, records: int) -> Future[AppendResult] | None:
        """The result of a batch written before (a retry), if it is still remembered."""
        future = self.recent.get((base_sequence, records))
        if future is not None:
            return future
        for first_seq, last_seq, first_offset in self.copied:
            if first_seq <= base_sequence and base_sequence + records - 1 <= last_seq:
                base = first_offset + base_sequence - first_seq
                future = Future()
                future.set_result(AppendResult(base, base + records - 1, -1, -1))
                return future
        return None


@dataclass(frozen=True)
class ActiveProducer:
    """An idempotent producer as Kafka's DescribeProducers shows it (kafka-transactions.sh
    describe-producers): the last sequence it sent here, the newest timestamp it wrote."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int


class ProducerStateManager:
    """The idempotent producers of one log (see the module docstring)."""

    def __init__(self, name: str, lock: threading.Condition,
                 data_files: Callable[[int], Iterable[pq.ParquetFile]],
                 id_bound: Callable[[], int | None], sequence_wait_ms: int) -> None:
        """`name` names the log in messages; `data_files` gives the log's committed Parquet
        files that may hold a producer's records, newest first, to rebuild it from; `id_bound`
        the largest producer id they hold (-1: none; None: not known)."""
        self._name = name
        self._lock = lock
        self._data_files = data_files
        self._id_bound = id_bound
        self._sequence_wait_ms = sequence_wait_ms
        self._producers: dict[int, ProducerEntry] = {}
        # At or above every producer id in the table and every one queued for it; None: not
        # known yet (read from the files' statistics when first needed).
        self._producer_id_max: int | None = None

    def await_turn(self, producer: ProducerState, records: int, closed: Callable[[], bool],
                   timeout_ms: int | None = None
                   ) -> tuple[ProducerEntry, Future[AppendResult] | None]:
        """Wait (lock held) until `producer`'s batch of `records` is next in its sequence, or
        the log closes. Returns the producer's entry, and the first append's future when the
        batch is a retry of one already taken. Raises when the epoch is fenced, the sequence
        was written too long ago to answer (out of order if only part of the batch was), or
        its predecessor did not come in time: within
        the sequence wait, and within `timeout_ms` (what is left of the produce request's
        timeout; None: no request bounds it), so no request holds its thread past its own
        timeout."""
        wait_ms = self._sequence_wait_ms
        if timeout_ms is not None:
            wait_ms = max(0, min(wait_ms, timeout_ms))
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            entry = self._entry(producer)
            if producer.producer_epoch < entry.epoch:
                raise _fenced(producer, entry.epoch)
            if producer.base_sequence < entry.next_sequence:
                earlier = entry.earlier(producer.base_sequence, records)
                if earlier is None:
                    log.warning("%s: producer %d sequence %d is below %d and not remembered",
                                self._name, producer.producer_id, producer.base_sequence,
                                entry.next_sequence)
                    if producer.base_sequence + records > entry.next_sequence:
                        # Not all of it was written: a client takes DUPLICATE_SEQUENCE_NUMBER
                        # as "written" and would drop the rest (Kafka: out of order).
                        raise errors.OutOfOrderSequenceNumberError(
                            f"producer {producer.producer_id} sent sequences "
                            f"{producer.base_sequence}-{producer.base_sequence + records - 1} "
                            f"but {entry.next_sequence} is next on {self._name}")
                    raise errors.DuplicateSequenceNumberError(
                        f"sequence {producer.base_sequence} of producer {producer.producer_id} "
                        f"was written long ago (next is {entry.next_sequence})")
                return entry, earlier
            if producer.base_sequence == entry.next_sequence or closed():
                return entry, None
            left = deadline - time.monotonic()
            if left <= 0:  # never skip the gap: its batch may still come, and be lost then
                log.warning("%s: producer %d sequence %d waited %d ms for %d (remembered %s, "
                            "copied %s)", self._name, producer.producer_id,
                            producer.base_sequence, wait_ms, entry.next_sequence,
                            list(entry.recent), list(entry.copied)[-3:])
                raise errors.OutOfOrderSequenceNumberError(
                    f"producer {producer.producer_id} sent sequence {producer.base_sequence} "
                    f"but {entry.next_sequence} is next on {self._name} (waited {wait_ms} ms "
                    f"for it)")
            self._lock.wait(left)

    def take_marker_epoch(self, producer_id: int, producer_epoch: int) -> None:
        """A transaction marker of `producer_id` at `producer_epoch` is about to be queued:
        refused (InvalidProducerEpochError) when the producer's epoch here is newer, else the
        marker's epoch becomes the producer's (a newer one starts its sequences afresh, as
        the coordinator's epoch bump fences the producer's earlier incarnation)."""
        entry = self._entry(ProducerState(producer_id, producer_epoch))
        if producer_epoch < entry.epoch:
            raise errors.InvalidProducerEpochError(
                f"the marker's epoch {producer_epoch} of producer {producer_id} is older than "
                f"its epoch {entry.epoch} on {self._name}")

    def check_epoch(self, producer: ProducerState) -> None:
        """INVALID_PRODUCER_EPOCH when the log knows `producer`'s id at a newer epoch (a
        successor's batch, or the coordinator's marker fencing it, was written here); nothing
        is taken or queued. A producer the log has not seen is looked up as a batch's is."""
        if producer.producer_id not in self._producers:
            self._look_up(producer.producer_id)
        entry = self._producers.get(producer.producer_id)
        if entry is not None and producer.producer_epoch < entry.epoch:
            raise _fenced(producer, entry.epoch)

    def note_copied(self, table: pa.Table) -> None:
        """Take in the producers' state from records a follower copied (offsets, producer id,
        epoch and sequence columns, in offset order)."""
        pids = table.column("producer_id").to_numpy()
        if not (pids >= 0).any():
            return
        seqs = table.column("sequence").to_numpy()
        epochs = table.column("producer_epoch").to_numpy()
        offsets = table.column("offset").to_numpy()
        self._raise_producer_id_max(int(pids.max()))
        for pid in np.unique(pids[pids >= 0]):
            rows = np.nonzero(pids == pid)[0]
            marker = seqs[rows] < 0  # transaction markers: control records carry no sequence
            breaks = np.nonzero((np.diff(seqs[rows]) != 1) | (np.diff(offsets[rows]) != 1)
                                | (np.diff(epochs[rows]) != 0) | marker[1:] | marker[:-1])[0] + 1
            for run in np.split(rows, breaks):
                first, last = int(run[0]), int(run[-1])
                epoch = int(epochs[last])
                entry = self._producers.get(int(pid))
                if seqs[first] < 0:
                    # A marker moves the epoch, never the sequence (as Kafka's producer state).
                    # One of a producer not known here leaves it unknown: its next batch reads
                    # its sequence from the table (a follower restarted after copying its
                    # records, then copying only its marker, must not take it for sequence 0).
                    if entry is not None and epoch > entry.epoch:
                        self._producers[int(pid)] = ProducerEntry(epoch, 0)
                    continue
                if entry is None or epoch > entry.epoch:
                    entry = self._producers[int(pid)] = ProducerEntry(epoch, 0)
                elif epoch < entry.epoch:
                    continue
                entry.next_sequence = max(entry.next_sequence, int(seqs[last]) + 1)
                entry.copied.append((int(seqs[first]), int(seqs[last]), int(offsets[first])))

    def note_timestamps(self, table: pa.Table) -> None:
        """Take in the newest timestamp of each known producer's records in a commit (LOG_SCHEMA
        columns), in commit order: Kafka's last timestamp of a producer, its last batch's max
        timestamp (here the max over its batches in the last commit holding any)."""
        pids = table.column("producer_id").to_numpy()
        if not (pids >= 0).any():
            return
        stamps = pc.cast(table.column("timestamp"), TIMESTAMP_TYPE)
        stamps_us = pc.cast(stamps, pa.int64()).to_numpy(zero_copy_only=False)
        for pid in np.unique(pids[pids >= 0]):
            entry = self._producers.get(int(pid))
            if entry is not None:
                entry.last_timestamp_ms = int(stamps_us[pids == pid].max()) // 1000

    def active(self) -> list[ActiveProducer]:
        """The producers this log knows, by id: those that wrote to it since it opened (and,
        on a follower, those whose records it copied). A producer known only from the table
        (written before a restart) shows once it writes again: the log reads no files for
        this."""
        return [ActiveProducer(pid, e.epoch, e.next_sequence - 1, e.last_timestamp_ms)
                for pid, e in sorted(self._producers.items())]

    def roll_back(self, producer: ProducerState, future: Future[AppendResult]) -> None:
        """A batch of `producer` queued with `future` was not written (its commit failed, and
        with it everything queued after it): as Kafka's producer state after a failed append,
        as if it never came. Its base sequence is the producer's next again, so its retry is
        taken, and its failed result is not remembered, so the retry is not answered with it.
        A producer that moved to a newer epoch since is left as it is."""
        entry = self._producers.get(producer.producer_id)
        if producer.base_sequence < 0 or entry is None or entry.epoch != producer.producer_epoch:
            return  # not idempotent (a plain batch, a marker, a copy), or forgotten
        for key, remembered in list(entry.recent.items()):
            if remembered is future:
                del entry.recent[key]
        entry.next_sequence = min(entry.next_sequence, producer.base_sequence)

    def clear(self) -> None:
        """Forget every producer (the log was truncated, or a failed commit left the table
        other than the log knew it): each is rebuilt from the table on its next batch."""
        self._producers.clear()
        self._producer_id_max = None

    def _raise_producer_id_max(self, producer_id: int) -> None:
        if self._producer_id_max is not None:
            self._producer_id_max = max(self._producer_id_max, producer_id)

    def _entry(self, producer: ProducerState) -> ProducerEntry:
        """What the log knows of a producer; one it has not seen since it opened is looked up
        in the table (its first batch may be a retry of one written before a restart or by an
        earlier leader), unless its id is above every id the table holds."""
        pid = producer.producer_id
        if pid not in self._producers:
            self._look_up(pid)
            self._raise_producer_id_max(pid)  # its batch is about to be queued
        entry = self._producers.get(pid)
        if entry is None or producer.producer_epoch > entry.epoch:
            entry = self._producers[pid] = ProducerEntry(producer.producer_epoch, 0)
        return entry

    def _look_up(self, producer_id: int) -> None:
        """Take in what the table holds of a producer the log has not seen since it opened,
        unless its id is above every id the table holds."""
        if self._producer_id_max is None:
            self._producer_id_max = self._id_bound()
        if self._producer_id_max is None or producer_id <= self._producer_id_max:
            written = recent_producer_rows(self._data_files(producer_id), producer_id)
            if written is not None:
                self.note_copied(written)


def _fenced(producer: ProducerState, epoch: int) -> errors.DeltaBusError:
    """INVALID_PRODUCER_EPOCH for a batch of `producer` where its id has `epoch` now."""
    return errors.InvalidProducerEpochError(
        f"producer {producer.producer_id} epoch {producer.producer_epoch} is older than {epoch}")


def producer_rows(files: Iterable[pq.ParquetFile], producer_id: int) -> pa.Table | None:
    """The records one producer wrote (offset, producer id, epoch, sequence), in offset order,
    or None. Only row groups whose producer_id statistics may hold it are read: a new producer's
    id is above every id written before, so for it this reads no data at all."""
    parts = [_rows_of(reader, producer_id) for reader in files]
    found = [part for part in parts if part is not None]
    return pa.concat_tables(found).sort_by("offset") if found else None


def recent_producer_rows(files: Iterable[pq.ParquetFile], producer_id: int) -> pa.Table | None:
    """A producer's records in the newest PRODUCER_BATCHES_REMEMBERED files holding any
    (`files` newest first), in offset order, or None: what its next batch is checked against.
    Each batch is committed whole into one file, so these hold its last batches, the ones a
    retry may repeat (answered with their offsets), and its epoch and next sequence; a retry of
    an older batch is below its next sequence, answered DUPLICATE_SEQUENCE_NUMBER (written, at
    an offset not said), as Kafka's broker does. Every file instead is the whole table, read
    under the log's lock for each producer's first batch: at a new leader of a diskless
    partition of a few thousand small commits, seconds on an object store, for every producer."""
    parts = []
    for reader in files:
        part = _rows_of(reader, producer_id)
        if part is not None and part.num_rows:
            parts.append(part)
            if len(parts) == PRODUCER_BATCHES_REMEMBERED:
                break
    return pa.concat_tables(parts).sort_by("offset") if parts else None


def _rows_of(reader: pq.ParquetFile, producer_id: int) -> pa.Table | None:
    """`producer_rows` of one file: None when no row group's statistics may hold the id."""
    parts = []
    column = leaf_columns(reader).get("producer_id")
    for group in range(reader.metadata.num_row_groups):
        stats = (reader.metadata.row_group(group).column(column).statistics
                 if column is not None else None)
        if stats is not None and stats.has_min_max and not (
                stats.min <= producer_id <= stats.max):
            continue
        part = reader.read_row_group(group, columns=_COLUMNS)
        parts.append(part.filter(pc.equal(part.column("producer_id"), producer_id)))
    return pa.concat_tables(parts) if parts else None
