"""A share group's in-flight records on a partition's leader (cluster/share_partition.py): the
acquisition locks, acknowledgements, delivery counts and the in-flight window of KIP-932."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.cluster.share_partition import (
    ACCEPT,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    AcknowledgementBatch,
    Acquired,
    SharePartition,
)
from deltabus.offsets.share_state_store import (
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    ShareState,
    StateBatch,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def partition(clock: Clock, start: int = 0, *batches: StateBatch, limit: int = 3,
              locks: int = 100) -> SharePartition:
    return SharePartition(ShareState("g", "t", 0, start, batches=batches),
                          lock_duration_ms=1000, delivery_count_limit=limit,
                          max_record_locks=locks, clock=clock)


def ack(first: int, last: int, *types: int) -> AcknowledgementBatch:
    return AcknowledgementBatch(first, last, types)


def acquire(sp: SharePartition, member: str, hw: int, max_records: int = 500,
            present: list[int] | None = None) -> list[Acquired]:
    """What a fetch does: read what `to_read` says, acquire what the log has there."""
    asked = sp.to_read(hw, max_records)
    if asked is None:
        return []
    first, last = asked
    found = [o for o in (range(first, last) if present is None else present)
             if first <= o < last]
    return sp.acquire(member, found, last, max_records)


def test_members_get_different_records_and_accepted_ones_are_done():
    clock = Clock()
    sp = partition(clock)
    assert acquire(sp, "a", hw=10, max_records=4) == [Acquired(0, 3, 1)]
    assert acquire(sp, "b", hw=10, max_records=4) == [Acquired(4, 7, 1)]
    sp.acknowledge("a", [ack(0, 3, ACCEPT)])
    assert sp.start_offset == 4  # everything below is done
    with pytest.raises(errors.InvalidRecordStateError):
        sp.acknowledge("a", [ack(4, 4, ACCEPT)])  # b's record
    with pytest.raises(errors.InvalidRecordStateError):
        sp.acknowledge("a", [ack(0, 0, ACCEPT)])  # done already
    assert acquire(sp, "c", hw=10) == [Acquired(8, 9, 1)]
    assert acquire(sp, "c", hw=10) == []  # everything is in flight


def test_released_and_timed_out_records_come_again_until_the_delivery_limit():
    clock = Clock()
    sp = partition(clock, limit=2)
    assert acquire(sp, "a", hw=3) == [Acquired(0, 2, 1)]
    sp.acknowledge("a", [ack(0, 2, RELEASE, ACCEPT, RELEASE)])
    assert acquire(sp, "b", hw=3) == [Acquired(0, 0, 2), Acquired(2, 2, 2)]
    clock.now += 1.5  # b's locks time out: delivered twice, the limit, so archived
    assert acquire(sp, "a", hw=3) == []
    assert sp.start_offset == 3 and sp.records == {}
    with pytest.raises(errors.InvalidRecordStateError):
        sp.acknowledge("b", [ack(0, 0, ACCEPT)])  # its lock timed out


def test_rejected_records_are_never_delivered_again_and_renew_keeps_the_lock():
    clock = Clock()
    sp = partition(clock)
    acquire(sp, "a", hw=4)
    clock.now += 0.9
    sp.acknowledge("a", [ack(1, 1, REJECT), ack(2, 3, RENEW), ack(0, 0, RELEASE)])
    clock.now += 0.5  # past 2-3's first lock, within their renewed one
    assert acquire(sp, "b", hw=4) == [Acquired(0, 0, 2)]
    sp.acknowledge("a", [ack(2, 3, ACCEPT)])
    sp.acknowledge("b", [ack(0, 0, ACCEPT)])
    assert sp.start_offset == 4


def test_a_leaving_member_releases_what_it_holds_and_gaps_are_archived():
    clock = Clock()
    sp = partition(clock)
    # Offsets 2 and 3 have no record (a control record, a compacted key): never delivered.
    assert acquire(sp, "a", hw=6, present=[0, 1, 4, 5]) == [Acquired(0, 1, 1), Acquired(4, 5, 1)]
    sp.acknowledge("a", [ack(0, 1, ACCEPT)])
    assert sp.start_offset == 4
    assert sp.release_member("a") and not sp.release_member("a")
    assert acquire(sp, "b", hw=6) == [Acquired(4, 5, 2)]
    sp.acknowledge("b", [ack(4, 4, GAP), ack(5, 5, ACCEPT)])
    assert sp.start_offset == 6


def test_the_in_flight_window_holds_up_new_records_only():
    clock = Clock()
    sp = partition(clock, locks=3)
    assert acquire(sp, "a", hw=10) == [Acquired(0, 2, 1)]
    assert acquire(sp, "b", hw=10) == []  # three in flight: the window is full
    sp.acknowledge("a", [ack(1, 2, ACCEPT)])
    assert acquire(sp, "b", hw=10) == []  # 0 is still held at the front
    sp.acknowledge("a", [ack(0, 0, RELEASE)])
    assert acquire(sp, "b", hw=10) == [Acquired(0, 0, 2)]
    sp.acknowledge("b", [ack(0, 0, ACCEPT)])
    assert acquire(sp, "b", hw=10) == [Acquired(3, 5, 1)]


def test_a_snapshot_restores_to_the_same_state_with_acquired_records_available():
    clock = Clock()
    sp = partition(clock, 10)
    acquire(sp, "a", hw=16)
    sp.acknowledge("a", [ack(11, 11, ACCEPT), ack(12, 12, REJECT), ack(13, 13, RELEASE)])
    state = sp.snapshot()
    assert state.start_offset == 10
    assert state.batches == (StateBatch(10, 10, AVAILABLE, 1), StateBatch(11, 11, ACKNOWLEDGED, 1),
                             StateBatch(12, 12, ARCHIVED, 1), StateBatch(13, 15, AVAILABLE, 1))
    again = SharePartition(state, lock_duration_ms=1000, delivery_count_limit=3,
                           max_record_locks=100, clock=clock)
    assert acquire(again, "b", hw=16) == [Acquired(10, 10, 2), Acquired(13, 15, 2)]
    again.acknowledge("b", [ack(10, 10, ACCEPT)])
    assert again.start_offset == 13


def test_a_bad_acknowledgement_batch_is_refused_whole():
    clock = Clock()
    sp = partition(clock)
    acquire(sp, "a", hw=3)
    with pytest.raises(errors.InvalidRequestError):
        sp.acknowledge("a", [ack(0, 2, ACCEPT, ACCEPT)])  # two types for three offsets
    with pytest.raises(errors.InvalidRecordStateError):
        sp.acknowledge("a", [ack(1, 5, ACCEPT)])  # 3-5 were never acquired
    assert sp.start_offset == 0 and all(r.member_id == "a" for r in sp.records.values())
