"""`__consumer_offsets`: commits are durable before they are acknowledged, share Delta commits,
survive restarts and compaction, and the table stays a plain Delta table."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetCommit, OffsetStore


def commit(store: OffsetStore, group: str, partition: int, offset: int) -> None:
    store.commit([OffsetCommit(group, "t", partition, OffsetAndMetadata(offset))]).result(10)


def test_commits_read_back_and_survive_a_restart(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    commit(store, "g", 0, 5)
    commit(store, "g", 0, 7)
    commit(store, "h", 1, 3)
    assert {tp: om.offset for tp, om in store.offsets("g").items()} == {("t", 0): 7}
    assert store.groups() == ["g", "h"] and store.last_commit_ms("g") > 0
    store.close()
    again = OffsetStore(path)
    assert again.offsets("g")[("t", 0)].offset == 7 and again.offsets("h")[("t", 1)].offset == 3
    again.delete_group("g").result(10)
    assert again.offsets("g") == {} and again.groups() == ["h"]
    again.close()
    assert OffsetStore(path).groups() == ["h"]


def test_a_thousand_concurrent_commits_share_far_fewer_delta_commits(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    version_before = DeltaTable(path).version()

    def consumer(i: int) -> None:
        for n in range(20):
            commit(store, f"g{i}", 0, n + 1)

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    delta_commits = DeltaTable(path).version() - version_before
    assert delta_commits < 200, f"1000 offset commits took {delta_commits} Delta commits"
    assert all(store.offsets(f"g{i}")[("t", 0)].offset == 20 for i in range(50))
    store.close()


def test_compaction_keeps_exactly_the_live_offsets(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path, compact_min_rows=1_000_000)  # compacted by hand here
    for n in range(30):
        commit(store, "g", n % 3, n)
    commit(store, "gone", 0, 1)
    store.delete_group("gone").result(10)
    removed = store.compact()
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert removed > 0 and len(rows) == 3
    assert sorted((r["partition"], r["committed_offset"]) for r in rows) == [
        (0, 27), (1, 28), (2, 29)]
    commit(store, "g", 0, 100)  # appends after a compaction keep replay order
    store.close()
    again = OffsetStore(path)
    assert {tp: om.offset for tp, om in again.offsets("g").items()} == {
        ("t", 0): 100, ("t", 1): 28, ("t", 2): 29}
    again.close()


def test_automatic_compaction_with_commits_racing_it_loses_nothing(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path, compact_min_rows=50)

    def consumer(i: int) -> None:
        for n in range(60):
            commit(store, "g", i, n + 1)

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    again = OffsetStore(path)
    assert {tp: om.offset for tp, om in again.offsets("g").items()} == {
        ("t", i): 60 for i in range(4)}
    assert DeltaTable(path).to_pyarrow_table().num_rows < 240  # compacted along the way
    again.close()


def test_bad_commits_are_refused_and_write_nothing(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    with pytest.raises(errors.OffsetMetadataTooLargeError):
        store.commit([OffsetCommit("g", "t", 0, OffsetAndMetadata(1, metadata="x" * 5000))])
    with pytest.raises(errors.InvalidRequestError):
        store.commit([OffsetCommit("g", "t", -1, OffsetAndMetadata(1))])
    assert store.offsets("g") == {} and DeltaTable(path).to_pyarrow_table().num_rows == 0
    store.close()
