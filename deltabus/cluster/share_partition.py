"""One share group's view of one partition, on the partition's leader (KIP-932's
SharePartition): which records are in flight, who holds them, how often each was delivered.

Pure state, driven by the SharePartitionManager under its lock (not thread-safe by itself).
Offsets below the start offset are done; from the start offset to the end offset every offset is
in flight, in one of four states; past the end offset nothing was delivered yet:

    AVAILABLE --acquire (delivery count + 1, a lock for lock_duration)--> ACQUIRED
    ACQUIRED --accept--> ACKNOWLEDGED          ACQUIRED --reject, gap--> ARCHIVED
    ACQUIRED --release, lock timed out, member gone--> AVAILABLE, or ARCHIVED once its
        delivery count reached the limit

The start offset moves past every offset at its front that is ACKNOWLEDGED or ARCHIVED. At most
`max_record_locks` offsets are in flight (end - start): a consumer that holds records back holds
up only new acquisitions, as on Kafka. Offsets with no record (compacted away, control records)
are archived as they are read past, never delivered.

Invariants:
- An offset is ACQUIRED by one member at a time, and only an offset ACQUIRED by a member may be
  acknowledged by it (INVALID_RECORD_STATE otherwise: its lock timed out, or it is another's).
- `snapshot` is the durable form: ACQUIRED offsets are written AVAILABLE, so a new leader
  delivers them again instead of losing them; nothing ACKNOWLEDGED is ever AVAILABLE again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from deltabus import errors
from deltabus.cluster.handler import AcknowledgementBatch, Acquired
from deltabus.offsets.share_state_store import (
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    ShareState,
    StateBatch,
)

# Kafka's AcknowledgeType (ShareFetch and ShareAcknowledge): GAP names an offset with no record.
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
__all__ = ["ACCEPT", "GAP", "REJECT", "RELEASE", "RENEW", "AcknowledgementBatch", "Acquired",
           "InFlight", "SharePartition"]
ACKNOWLEDGE_TYPES = {GAP: "gap", ACCEPT: "accept", RELEASE: "release", REJECT: "reject",
                     RENEW: "renew"}
STATE_NAMES = {AVAILABLE: "Available", ACQUIRED: "Acquired", ACKNOWLEDGED: "Acknowledged",
               ARCHIVED: "Archived"}


@dataclass
class InFlight:
    """An in-flight offset."""

    state: int
    delivery_count: int
    member_id: str = ""
    lock_until_s: float = 0.0


class SharePartition:
    """A share group's in-flight records of one partition, on its leader."""

    def __init__(self, state: ShareState, *, lock_duration_ms: int, delivery_count_limit: int,
                 max_record_locks: int, clock: Callable[[], float]) -> None:
        self.group_id, self.topic, self.partition = state.group_id, state.topic, state.partition
        self.state_epoch = state.state_epoch
        self.leader_epoch = state.leader_epoch
        self.start_offset = state.start_offset
        self.lock_duration_ms = lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_record_locks = max_record_locks
        self._clock = clock
        self.records: dict[int, InFlight] = {}
        for b in state.batches:
            restored = AVAILABLE if b.delivery_state == ACQUIRED else b.delivery_state
            if restored == AVAILABLE and b.delivery_count >= delivery_count_limit:
                restored = ARCHIVED  # its last lock timed out before a leader change
            for offset in range(b.first_offset, b.last_offset + 1):
                self.records[offset] = InFlight(restored, b.delivery_count)
        self.end_offset = max(self.records, default=self.start_offset - 1) + 1
        self.version = 0  # bumped by every change `snapshot` would show
        self._advance_start()

    def skip_to(self, log_start_offset: int) -> None:
        """The log's start moved past records in flight or not yet delivered (retention,
        DeleteRecords): they are gone, so archived; the start offset moves to the log's."""
        if log_start_offset <= self.start_offset:
            return
        for offset in range(self.start_offset, log_start_offset):
            self.records.pop(offset, None)
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        self.version += 1

    # ---- acquiring -----------------------------------------------------------------------------

    def to_read(self, high_watermark: int, max_records: int) -> tuple[int, int] | None:
        """The offsets [first, last) a fetch reads to acquire up to `max_records`: from the
        first AVAILABLE in-flight offset, or else the end offset, to the high watermark and
        within the in-flight window. None: nothing to acquire."""
        self.expire_locks()
        available = [o for o, r in sorted(self.records.items()) if r.state == AVAILABLE]
        window_end = min(high_watermark, self.start_offset + self.max_record_locks)
        if available:
            first = available[0]
        elif self.end_offset < window_end:
            first = self.end_offset
        else:
            return None
        last = max(window_end, self.end_offset)
        if len(available) >= max_records:
            last = available[max_records - 1] + 1
        return first, max(last, first + 1)

    def acquire(self, member_id: str, present: Sequence[int], read_to: int,
                max_records: int) -> list[Acquired]:
        """Acquire for `member_id` up to `max_records` of the offsets that a read of the log up
        to `read_to` (exclusive) found records at (`present`, ascending). Offsets past the end
        offset that the read passed with no record there are archived (gaps)."""
        now = self._clock()
        window_end = self.start_offset + self.max_record_locks
        taken: list[int] = []
        for offset in present:
            if len(taken) >= max_records:
                break
            if offset >= self.end_offset:
                if offset >= window_end:
                    break
                self._archive_gaps(self.end_offset, offset)
                self.records[offset] = InFlight(AVAILABLE, 0)
                self.end_offset = offset + 1
            record = self.records.get(offset)
            if record is None or record.state != AVAILABLE:
                continue
            record.state, record.member_id = ACQUIRED, member_id
            record.delivery_count += 1
            record.lock_until_s = now + self.lock_duration_ms / 1000
            taken.append(offset)
        if len(taken) < max_records:  # the read passed these with no record: gaps
            self._archive_gaps(self.end_offset, min(read_to, window_end))
        if taken:
            self.version += 1
        self._advance_start()
        return _runs(taken, self.records)

    def _archive_gaps(self, first: int, last: int) -> None:
        for offset in range(first, last):
            self.records[offset] = InFlight(ARCHIVED, 0)
        if last > self.end_offset:
            self.end_offset = last
            self.version += 1

    # ---- acknowledging -------------------------------------------------------------------------

    def acknowledge(self, member_id: str, batches: Iterable[AcknowledgementBatch]) -> None:
        """Apply a member's acknowledgements, each batch whole or not at all: INVALID_RECORD_STATE
        for a batch with an offset the member does not hold (the others still apply)."""
        failed: errors.DeltaBusError | None = None
        for batch in batches:
            try:
                self._acknowledge(member_id, batch)
            except errors.DeltaBusError as e:
                failed = failed or e
        self._advance_start()
        if failed is not None:
            raise failed

    def _acknowledge(self, member_id: str, batch: AcknowledgementBatch) -> None:
        count = batch.last_offset - batch.first_offset + 1
        if count < 1 or len(batch.types) not in (1, count) or any(
                t not in ACKNOWLEDGE_TYPES for t in batch.types):
            raise errors.InvalidRequestError(
                f"acknowledgement batch {batch.first_offset}-{batch.last_offset}: "
                f"{len(batch.types)} acknowledge types, one or one per offset expected")
        types = batch.types * count if len(batch.types) == 1 else batch.types
        offsets = range(batch.first_offset, batch.last_offset + 1)
        for offset in offsets:
            record = self.records.get(offset)
            if record is None or record.state != ACQUIRED or record.member_id != member_id:
                raise errors.InvalidRecordStateError(
                    f"{self.topic}-{self.partition} offset {offset} is not acquired by member "
                    f"{member_id} of share group {self.group_id} (its lock may have timed out)")
        now = self._clock()
        for offset, kind in zip(offsets, types, strict=True):
            record = self.records[offset]
            if kind == RENEW:
                record.lock_until_s = now + self.lock_duration_ms / 1000
            elif kind == ACCEPT:
                record.state, record.member_id = ACKNOWLEDGED, ""
            elif kind in (REJECT, GAP):
                record.state, record.member_id = ARCHIVED, ""
            else:
                self._release(record)
        self.version += 1

    def release_member(self, member_id: str) -> bool:
        """Release every offset the member holds (its session closed, it left the group).
        Returns whether anything changed."""
        return self._release_held(lambda r: r.member_id == member_id)

    def expire_locks(self) -> bool:
        """Release the offsets whose lock timed out. Returns whether anything changed."""
        now = self._clock()
        return self._release_held(lambda r: r.lock_until_s <= now)

    def _release_held(self, which: Callable[[InFlight], bool]) -> bool:
        held = [r for r in self.records.values() if r.state == ACQUIRED and which(r)]
        for record in held:
            self._release(record)
        if held:
            self.version += 1
            self._advance_start()
        return bool(held)

    def _release(self, record: InFlight) -> None:
        record.member_id = ""
        record.state = (ARCHIVED if record.delivery_count >= self.delivery_count_limit
                        else AVAILABLE)

    def _advance_start(self) -> None:
        start = self.start_offset
        while start < self.end_offset and self.records[start].state in (ACKNOWLEDGED, ARCHIVED):
            del self.records[start]
            start += 1
        if start != self.start_offset:
            self.start_offset = start
            self.version += 1

    # ---- what is durable -----------------------------------------------------------------------

    def snapshot(self) -> ShareState:
        """The durable form (ACQUIRED written AVAILABLE), in runs of one state and count."""
        batches: list[StateBatch] = []
        for (state, count), run in itertools.groupby(
                sorted(self.records.items()),
                key=lambda item: (AVAILABLE if item[1].state == ACQUIRED else item[1].state,
                                  item[1].delivery_count)):
            offsets = [o for o, _ in run]
            batches.extend(StateBatch(first, last, state, count)
                           for first, last in _contiguous(offsets))
        return ShareState(self.group_id, self.topic, self.partition, self.start_offset,
                          state_epoch=self.state_epoch, leader_epoch=self.leader_epoch,
                          batches=tuple(batches))

    def acquired(self) -> int:
        """How many records members hold now."""
        return sum(1 for r in self.records.values() if r.state == ACQUIRED)

    def in_flight(self) -> int:
        return self.end_offset - self.start_offset


def _contiguous(offsets: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] + 1 == offset:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def _runs(offsets: list[int], records: dict[int, InFlight]) -> list[Acquired]:
    """Acquired offsets as runs of consecutive offsets with one delivery count."""
    runs: list[Acquired] = []
    for offset in offsets:
        count = records[offset].delivery_count
        last = runs[-1] if runs else None
        if last is not None and last.last_offset + 1 == offset and last.delivery_count == count:
            runs[-1] = Acquired(last.first_offset, offset, count)
        else:
            runs.append(Acquired(offset, offset, count))
    return runs
