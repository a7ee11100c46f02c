"""`__consumer_offsets`: commits are durable before they are acknowledged, share Delta commits,
survive restarts and compaction, and the table stays a plain Delta table any reader can query.

Real Delta tables under tmp_path; no Spark, no mocks. A storage failure is made real by putting a
file where `_delta_log` should be, or, for an answer lost after the write, by raising after the
storage layer's own put."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.config import OFFSET_METADATA_MAX_BYTES as METADATA_MAX_CHARS
from deltabus.offsets.offset_store import (
    CHECKPOINT_COMMITS,
    OffsetAndMetadata,
    OffsetCommit,
    OffsetStore,
)
from deltabus.storage import Storage


def commit(store: OffsetStore, group: str, partition: int, offset: int,
           topic: str = "t") -> None:
    store.commit([OffsetCommit(group, topic, partition, OffsetAndMetadata(offset))]).result(10)


def committed(store: OffsetStore, group: str) -> dict[tuple[str, int], int]:
    return {tp: om.offset for tp, om in store.offsets(group).items()}


def state(store: OffsetStore) -> dict[str, dict[tuple[str, int], OffsetAndMetadata]]:
    return {g: store.offsets(g) for g in store.groups()}


def rows(path: str) -> list[dict]:
    return DeltaTable(path).to_pyarrow_table().sort_by("sequence").to_pylist()


def operations(path: str) -> list[str | None]:
    """deltabus.operation of each commit, oldest first."""
    return [c.get("deltabus.operation") for c in reversed(DeltaTable(path).history())]


def test_commits_read_back_as_plain_columns(tmp_path: Path):
    path = str(tmp_path / "__consumer_offsets")
    store = OffsetStore(path)
    before_ms = int(time.time() * 1000)
    future = store.commit([
        OffsetCommit("g", "t", 0, OffsetAndMetadata(5, leader_epoch=3, metadata="m"),
                     member_id="m-1", generation_id=7),
        OffsetCommit("g", "u", 2, OffsetAndMetadata(9, commit_timestamp_ms=1_700_000_000_123)),
    ])
    assert future.result(10) is None
    got = store.offsets("g")
    assert got[("t", 0)].offset == 5 and got[("t", 0)].leader_epoch == 3
    assert got[("t", 0)].metadata == "m" and got[("t", 0)].commit_timestamp_ms >= before_ms
    assert got[("u", 2)] == OffsetAndMetadata(9, -1, "", 1_700_000_000_123)  # its own time kept
    assert store.groups() == ["g"] and store.offsets("nobody") == {}
    assert store.last_commit_ms("g") == got[("t", 0)].commit_timestamp_ms
    assert store.last_commit_ms("nobody") == 0
    store.close()

    table = DeltaTable(path).to_pyarrow_table()
    types = {f.name: f.type for f in table.schema}
    assert types["partition"] == pa.int32() and types["committed_offset"] == pa.int64()
    assert pa.types.is_timestamp(types["commit_timestamp"])
    first = rows(path)[0]
    assert (first["group_id"], first["topic"], first["partition"], first["committed_offset"],
            first["leader_epoch"], first["metadata"], first["member_id"],
            first["generation_id"]) == ("g", "t", 0, 5, 3, "m", "m-1", 7)
    assert operations(path)[-1] == "offset-commit"


def test_a_restarted_store_replays_exactly_the_acknowledged_commits(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    commit(store, "g", 0, 5)
    commit(store, "g", 0, 7)
    commit(store, "g", 1, 1)
    commit(store, "h", 1, 3)
    store.commit([OffsetCommit("g", "t", 1, None)]).result(10)  # tombstone
    expected = state(store)
    store.close()

    again = OffsetStore(path)
    assert state(again) == expected
    assert committed(again, "g") == {("t", 0): 7} and committed(again, "h") == {("t", 1): 3}
    commit(again, "h", 1, 4)  # sequences go on from the replayed ones
    again.close()
    sequences = [r["sequence"] for r in rows(path)]
    assert sequences == sorted(set(sequences)) and len(sequences) == 6


def test_tombstones_and_delete_group(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    for p in range(3):
        commit(store, "g", p, 10 + p)
    commit(store, "other", 0, 1)
    store.commit([OffsetCommit("g", "t", 1, None)]).result(10)
    assert committed(store, "g") == {("t", 0): 10, ("t", 2): 12}
    store.delete_group("g").result(10)
    assert store.offsets("g") == {} and store.groups() == ["other"]
    assert store.last_commit_ms("g") == 0
    store.delete_group("never-existed").result(10)  # nothing to delete, nothing written
    store.close()
    tombstones = [r for r in rows(path) if r["committed_offset"] is None]
    assert sorted(r["partition"] for r in tombstones) == [0, 1, 2]
    again = OffsetStore(path)
    assert again.groups() == ["other"] and committed(again, "other") == {("t", 0): 1}
    again.close()


def test_delete_group_deletes_commits_queued_before_it(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path, commit_linger_ms=300)  # all four requests share one batch
    version = DeltaTable(path).version()
    before = store.commit([OffsetCommit("g", "t", 0, OffsetAndMetadata(1))])
    deleted = store.delete_group("g")
    after = store.commit([OffsetCommit("g", "t", 1, OffsetAndMetadata(2))])
    kept = store.commit([OffsetCommit("h", "t", 0, OffsetAndMetadata(3))])
    for f in (before, deleted, after, kept):
        f.result(10)
    assert committed(store, "g") == {("t", 1): 2} and committed(store, "h") == {("t", 0): 3}
    assert DeltaTable(path).version() == version + 1
    store.close()
    assert committed(OffsetStore(path), "g") == {("t", 1): 2}


def test_a_thousand_concurrent_commits_share_far_fewer_delta_commits(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    version_before = DeltaTable(path).version()
    failures: list[BaseException] = []

    def consumer(i: int) -> None:
        for n in range(20):
            try:
                commit(store, f"g{i}", i % 4, n + 1)
            except BaseException as e:
                failures.append(e)

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(50)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    delta_commits = DeltaTable(path).version() - version_before
    print(f"\n1000 offset commits from 50 threads: {delta_commits} Delta commits, "
          f"{elapsed:.2f} s")
    assert failures == []
    assert delta_commits < 200, f"1000 offset commits took {delta_commits} Delta commits"
    assert all(committed(store, f"g{i}") == {("t", i % 4): 20} for i in range(50))
    assert DeltaTable(path).to_pyarrow_table().num_rows == 1000
    store.close()
    again = OffsetStore(path)
    assert all(committed(again, f"g{i}") == {("t", i % 4): 20} for i in range(50))
    again.close()


def test_compaction_keeps_exactly_the_live_offsets(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path, compact_min_rows=1_000_000)  # compacted by hand here
    for n in range(30):
        commit(store, "g", n % 3, n)
    commit(store, "gone", 0, 1)
    commit(store, "h", 0, 4)
    store.delete_group("gone").result(10)
    live_before = [r for r in rows(path) if (r["group_id"], r["committed_offset"]) in {
        ("g", 27), ("g", 28), ("g", 29), ("h", 4)}]
    expected = state(store)

    removed = store.compact()
    after = rows(path)
    assert removed == 33 - len(after) and removed > 0
    # The live rows, unchanged (sequence too), and the newest row, a tombstone: it keeps the
    # highest sequence for a restart.
    assert [r for r in after if r["committed_offset"] is not None] == live_before
    assert len(after) == 5 and after[-1]["group_id"] == "gone"
    assert after[-1]["committed_offset"] is None
    assert state(store) == expected
    assert "offset-compaction" in operations(path)
    assert os.path.exists(os.path.join(path, "_delta_log", "_last_checkpoint"))
    assert store.compact() == 0  # already compact: no commit at all

    commit(store, "g", 0, 100)  # appends after a compaction keep the replay order
    store.close()
    again = OffsetStore(path)
    assert committed(again, "g") == {("t", 0): 100, ("t", 1): 28, ("t", 2): 29}
    assert again.groups() == ["g", "h"]
    commit(again, "h", 0, 5)
    again.close()
    sequences = [r["sequence"] for r in rows(path)]
    assert sequences == sorted(set(sequences))  # never reused across compaction and restart


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
    assert committed(store, "g") == {("t", i): 60 for i in range(4)}
    store.close()
    assert "offset-compaction" in operations(path)
    assert DeltaTable(path).to_pyarrow_table().num_rows <= 50  # compacted along the way
    again = OffsetStore(path)
    assert committed(again, "g") == {("t", i): 60 for i in range(4)}
    again.close()


def test_compaction_by_hand_during_concurrent_commits_loses_nothing(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path, compact_min_rows=1_000_000)
    acknowledged: dict[tuple[str, int], int] = {}
    stop = threading.Event()

    def consumer(i: int) -> None:
        n = 0
        while not stop.is_set() or n < 20:
            n += 1
            commit(store, f"g{i}", 0, n)
            acknowledged[(f"g{i}", 0)] = n

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    removed = 0
    for _ in range(5):
        time.sleep(0.1)
        removed += store.compact()
    stop.set()
    for t in threads:
        t.join()
    assert removed > 0
    assert {(g, p): om.offset for g in store.groups()
            for (_, p), om in store.offsets(g).items()} == acknowledged
    store.close()
    again = OffsetStore(path)
    assert {(g, p): om.offset for g in again.groups()
            for (_, p), om in again.offsets(g).items()} == acknowledged
    again.close()


def test_bad_commits_are_refused_and_write_nothing(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    version = DeltaTable(path).version()
    good = OffsetCommit("g", "t", 0, OffsetAndMetadata(1))
    with pytest.raises(errors.OffsetMetadataTooLargeError):
        store.commit([good, OffsetCommit(
            "g", "t", 1, OffsetAndMetadata(1, metadata="x" * (METADATA_MAX_CHARS + 1)))])
    with pytest.raises(errors.InvalidRequestError):
        store.commit([good, OffsetCommit("g", "t", -1, OffsetAndMetadata(1))])
    with pytest.raises(errors.InvalidRequestError):  # would not fit the int64 column
        store.commit([OffsetCommit("g", "t", 0, OffsetAndMetadata(2**63))])
    store.close()
    assert store.offsets("g") == {} and DeltaTable(path).version() == version
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0

    again = OffsetStore(path)
    longest = "x" * METADATA_MAX_CHARS  # the limit itself is allowed
    again.commit([OffsetCommit("g", "t", 0, OffsetAndMetadata(1, metadata=longest))]).result(10)
    assert again.offsets("g")[("t", 0)].metadata == longest
    again.close()


def test_a_failed_write_fails_its_batch_and_changes_nothing(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    commit(store, "g", 0, 1)
    log_dir = os.path.join(path, "_delta_log")
    os.rename(log_dir, log_dir + ".away")
    Path(log_dir).write_text("")  # the storage is broken: no commit can be written
    try:
        futures = [store.commit([OffsetCommit("g", "t", p, OffsetAndMetadata(2))])
                   for p in range(3)]
        for f in futures:
            with pytest.raises(errors.KafkaStorageError):
                f.result(10)
        assert committed(store, "g") == {("t", 0): 1}
    finally:
        os.remove(log_dir)
        os.rename(log_dir + ".away", log_dir)
    commit(store, "g", 1, 3)  # the storage is back
    assert committed(store, "g") == {("t", 0): 1, ("t", 1): 3}
    store.close()
    again = OffsetStore(path)
    assert committed(again, "g") == {("t", 0): 1, ("t", 1): 3}
    again.close()


def test_close_flushes_queued_commits_then_refuses_more(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path, commit_linger_ms=10_000)  # only close() makes it write now
    queued = store.commit([OffsetCommit("g", "t", 0, OffsetAndMetadata(8))])
    cancelled: Future[None] = store.commit([OffsetCommit("g", "t", 1, OffsetAndMetadata(9))])
    assert cancelled.cancel()  # not written yet: cancelling it means it never is
    start = time.monotonic()
    store.close()
    assert time.monotonic() - start < 5 and queued.result(0) is None
    with pytest.raises(errors.CoordinatorNotAvailableError):
        store.commit([OffsetCommit("g", "t", 0, OffsetAndMetadata(9))])
    with pytest.raises(errors.CoordinatorNotAvailableError):
        store.compact()
    again = OffsetStore(path)
    assert committed(again, "g") == {("t", 0): 8}
    again.close()


def test_a_commit_whose_answer_was_lost_but_landed_is_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The store failed after the commit file was written (an object store's answer lost on
    the way back): the commit is there, so it is acknowledged and in memory, as a restart
    would replay it."""
    path = str(tmp_path / "o")
    store = OffsetStore(path)
    put = Storage.put_if_absent

    def put_then_fail(self: Storage, uri: str, data: bytes) -> bool:
        put(self, uri, data)
        raise errors.KafkaStorageError(f"cannot write {uri}: the answer was lost")

    monkeypatch.setattr(Storage, "put_if_absent", put_then_fail)
    commit(store, "g", 0, 7)
    monkeypatch.undo()
    commit(store, "g", 1, 8)
    assert committed(store, "g") == {("t", 0): 7, ("t", 1): 8}
    store.close()
    again = OffsetStore(path)
    assert committed(again, "g") == {("t", 0): 7, ("t", 1): 8}
    again.close()


def test_a_second_store_writing_the_table_fences_the_first(tmp_path: Path):
    """Two coordinators on one table (a driver started twice on one root): the one that finds
    the other's commit fails its batch instead of interleaving sequences with it."""
    path = str(tmp_path / "o")
    first = OffsetStore(path)
    commit(first, "g", 0, 1)
    second = OffsetStore(path)
    commit(second, "g", 1, 2)
    with pytest.raises(errors.KafkaStorageError, match="another writer"):
        commit(first, "g", 2, 3)
    assert committed(first, "g") == {("t", 0): 1}
    first.close()
    second.close()
    assert [(r["partition"], r["committed_offset"]) for r in rows(path)] == [(0, 1), (1, 2)]


def test_the_table_is_checkpointed_as_it_grows_and_reopens_whole(tmp_path: Path):
    path = str(tmp_path / "o")
    store = OffsetStore(path, commit_linger_ms=0)
    for i in range(CHECKPOINT_COMMITS):
        commit(store, "g", i % 3, i)
    store.close()
    checkpoints = list(Path(path, "_delta_log").glob("*.checkpoint.parquet"))
    assert [p.name for p in checkpoints] == [f"{CHECKPOINT_COMMITS:020d}.checkpoint.parquet"]
    again = OffsetStore(path)
    assert committed(again, "g") == {("t", i % 3): i for i in range(CHECKPOINT_COMMITS)}
    again.close()
