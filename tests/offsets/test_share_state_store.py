"""`__share_group_state` (offsets/share_state_store.py): share groups' state survives a
restart of the store, and the two epochs fence a replaced leader and a leader whose state was
altered under it, as Kafka's share coordinator fences them."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.offsets.share_state_store import (
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    ShareState,
    ShareStateStore,
    StateBatch,
)


def snapshot(start: int, *batches: StateBatch, leader_epoch: int = 0,
             state_epoch: int = 0) -> ShareState:
    return ShareState("g", "t", 0, start_offset=start, state_epoch=state_epoch,
                      leader_epoch=leader_epoch, batches=batches)


def test_a_restarted_store_has_every_acknowledged_state(tmp_path: Path):
    path = str(tmp_path / "__share_group_state")
    store = ShareStateStore(path)
    assert store.claim("g", "t", 0, leader_epoch=0).result(10) is None  # nothing yet
    store.write(snapshot(0)).result(10)
    batches = (StateBatch(3, 4, ACKNOWLEDGED, 1), StateBatch(5, 5, AVAILABLE, 2),
               StateBatch(6, 9, ARCHIVED, 5))
    store.write(snapshot(3, *batches)).result(10)
    store.write(ShareState("g", "t", 1, start_offset=40)).result(10)
    store.write(ShareState("h", "t", 0, start_offset=7)).result(10)
    store.close()

    again = ShareStateStore(path)
    state = again.read("g", "t", 0)
    assert state is not None and state.start_offset == 3 and state.batches == batches
    assert sorted(again.states("g")) == [("t", 0), ("t", 1)] and again.groups() == ["g", "h"]
    assert again.read("g", "t", 2) is None
    again.close()
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert {(r["group_id"], r["partition"], r["start_offset"]) for r in rows} >= {
        ("g", 0, 3), ("g", 1, 40), ("h", 0, 7)}


def test_a_claim_fences_the_former_leader(tmp_path: Path):
    store = ShareStateStore(str(tmp_path / "s"))
    store.write(snapshot(5, leader_epoch=1)).result(10)
    claimed = store.claim("g", "t", 0, leader_epoch=2).result(10)
    assert claimed is not None and claimed.start_offset == 5 and claimed.leader_epoch == 2
    with pytest.raises(errors.FencedLeaderEpochError):  # the old leader wakes up and writes
        store.write(snapshot(9, leader_epoch=1)).result(10)
    with pytest.raises(errors.FencedLeaderEpochError):  # nor may it claim back
        store.claim("g", "t", 0, leader_epoch=1).result(10)
    store.write(snapshot(6, leader_epoch=2)).result(10)
    state = store.read("g", "t", 0)
    assert state is not None and state.start_offset == 6  # the refused writes changed nothing
    store.close()


def test_altered_offsets_fence_the_leaders_old_state(tmp_path: Path):
    store = ShareStateStore(str(tmp_path / "s"))
    store.write(snapshot(5, StateBatch(5, 6, AVAILABLE, 1), leader_epoch=3)).result(10)
    altered = store.alter("g", "t", 0, start_offset=100).result(10)
    assert (altered.start_offset, altered.state_epoch, altered.batches) == (100, 1, ())
    with pytest.raises(errors.FencedStateEpochError):
        store.write(snapshot(7, leader_epoch=3)).result(10)  # read before the alter
    store.write(snapshot(101, leader_epoch=3, state_epoch=1)).result(10)
    state = store.read("g", "t", 0)
    assert state is not None and (state.start_offset, state.state_epoch) == (101, 1)
    store.close()


def test_deleted_state_is_gone_after_a_restart(tmp_path: Path):
    path = str(tmp_path / "s")
    store = ShareStateStore(path)
    for p in range(3):
        store.write(ShareState("g", "t", p, start_offset=p)).result(10)
    store.write(ShareState("other", "t", 0, start_offset=1)).result(10)
    assert store.delete("g", [("t", 1), ("t", 7)]).result(10) == [("t", 1)]
    assert sorted(store.states("g")) == [("t", 0), ("t", 2)]
    assert store.delete("g").result(10) == [("t", 0), ("t", 2)]
    assert store.delete("never").result(10) == []
    store.close()
    again = ShareStateStore(path)
    assert again.groups() == ["other"] and again.states("g") == {}
    # A leader still holding the deleted state is fenced; the group starts over past it.
    with pytest.raises(errors.FencedStateEpochError):
        again.write(ShareState("g", "t", 1, start_offset=9)).result(10)
    started = again.alter("g", "t", 1, start_offset=9).result(10)
    assert started.state_epoch == 1
    again.write(ShareState("g", "t", 1, start_offset=10, state_epoch=1)).result(10)
    again.close()


def test_a_bad_state_is_refused_before_it_is_queued(tmp_path: Path):
    store = ShareStateStore(str(tmp_path / "s"))
    with pytest.raises(errors.InvalidRequestError):
        store.write(snapshot(5, StateBatch(3, 4, AVAILABLE, 1)))  # in flight below the start
    with pytest.raises(errors.InvalidRequestError):
        store.write(snapshot(-1))
    assert store.groups() == []
    store.close()
