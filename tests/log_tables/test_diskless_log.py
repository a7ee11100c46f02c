"""A diskless partition's one table, led in turn by the brokers the controller names: each
leader claims the table for its leader epoch before reading its end, so whatever an earlier
leader committed is in the log the next one goes on from, and an earlier leader that still
runs (a zombie: paused, or cut off from the controller) commits nothing after the claim.
Real Delta tables on disk; the brokers are two PartitionLogs on the same table."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.log_tables.appender import LEADER_EPOCH_TXN_APP_ID, LOG_TXN_APP_ID
from deltabus.log_tables.delta_commit import CommitConflict, DeltaCommitWriter, FencedWriter
from deltabus.log_tables.partition_log import NO_PRODUCER, LogConfig, PartitionLog
from deltabus.records import ProducerState, normalize_produce, produce_batch
from deltabus.storage import Storage

RESULT_TIMEOUT_S = 30
READ_ALL = 1 << 30


def _leader(path: Path, epoch: int) -> PartitionLog:
    return PartitionLog(str(path), topic="t", partition=0, config=LogConfig(sequence_wait_ms=200),
                        leader_epoch=epoch)


def _append(log: PartitionLog, prefix: str, n: int, epoch: int,
            producer: ProducerState = NO_PRODUCER) -> tuple[int, int]:
    batch = normalize_produce(produce_batch([f"{prefix}-{i}".encode() for i in range(n)]))
    result = log.append(batch, leader_epoch=epoch, producer=producer).result(RESULT_TIMEOUT_S)
    return result.base_offset, result.last_offset


def _values(log: PartitionLog) -> list[bytes]:
    return log.read(log.log_start_offset, READ_ALL, to_log_end=True).column("value").to_pylist()


def test_a_new_leader_goes_on_from_the_table_and_fences_the_old_one(tmp_path: Path) -> None:
    table = tmp_path / "0"
    old = _leader(table, epoch=0)
    new: PartitionLog | None = None
    try:
        assert _append(old, "a", 3, epoch=0) == (0, 2)
        producer = ProducerState(producer_id=7, producer_epoch=0, base_sequence=0)
        assert _append(old, "idem", 2, epoch=0, producer=producer) == (3, 4)
        new = _leader(table, epoch=1)  # the failover: metadata, then this open; nothing copied
        assert new.log_end_offset == new.high_watermark == 5
        assert DeltaTable(str(table)).transaction_version(LEADER_EPOCH_TXN_APP_ID) == 1
        # The old leader, still running, loses its next commit and stops: nothing more of it
        # is acknowledged, at its epoch.
        with pytest.raises(errors.NotLeaderOrFollowerError, match="another writer"):
            _append(old, "zombie", 2, epoch=0)
        with pytest.raises(errors.NotLeaderOrFollowerError):
            _append(old, "zombie-again", 2, epoch=0)
        # The new leader knows the idempotent producer from the table: its retry of the
        # acknowledged batch is answered with the batch's offsets, not written twice.
        assert _append(new, "idem", 2, epoch=1, producer=producer) == (3, 4)
        assert _append(new, "b", 2, epoch=1) == (5, 6)
        assert _values(new) == [b"a-0", b"a-1", b"a-2", b"idem-0", b"idem-1", b"b-0", b"b-1"]
    finally:
        old.close()
        if new is not None:
            new.close()


def test_a_lost_version_is_a_conflict_below_the_writers_epoch_and_a_fence_above(
        tmp_path: Path) -> None:
    """The rule the claim rests on, at the commit writer: the old leader's last commit landing
    before the new leader's claim is part of the log (CommitConflict: the claim reads it and
    goes on after it), while the new leader's claim landing first fences the old leader."""
    table = tmp_path / "0"
    PartitionLog(str(table), topic="t", partition=0).close()  # an empty log table
    storage = Storage(str(table))
    version = DeltaTable(str(table)).version()

    def writer(epoch: int) -> DeltaCommitWriter:
        return DeltaCommitWriter(storage, str(table), version, fence_app_id=LOG_TXN_APP_ID,
                                 epoch_app_id=LEADER_EPOCH_TXN_APP_ID, epoch=epoch)

    def stamp(epoch: int) -> dict[str, int]:
        return {LOG_TXN_APP_ID: 0, LEADER_EPOCH_TXN_APP_ID: epoch}

    old, new = writer(0), writer(1)
    old.commit(txns=stamp(0))
    with pytest.raises(CommitConflict, match="older than this writer's 1"):
        new.commit(txns=stamp(1))
    new.version = old.version  # the claim reloads the table and tries again: it lands
    new.commit(txns=stamp(1))
    with pytest.raises(FencedWriter):
        old.commit(txns=stamp(0))


def test_a_leader_of_an_older_epoch_cannot_claim_the_table(tmp_path: Path) -> None:
    table = tmp_path / "0"
    newer = _leader(table, epoch=4)
    try:
        _append(newer, "a", 1, epoch=4)
        with pytest.raises(errors.NotLeaderOrFollowerError, match="newer than"):
            _leader(table, epoch=3)
        assert _values(newer) == [b"a-0"]
    finally:
        newer.close()


def test_every_commit_carries_its_leaders_epoch(tmp_path: Path) -> None:
    table = tmp_path / "0"
    log = _leader(table, epoch=2)
    try:
        _append(log, "a", 1, epoch=2)
    finally:
        log.close()
    history = DeltaTable(str(table)).history()
    assert [h.get("deltabus.operation") for h in reversed(history)][-2:] == ["claim", "append"]


def test_commits_start_at_most_every_commit_interval(tmp_path: Path) -> None:
    """diskless.append.commit.interval.ms bounds a partition's commits (requests to the
    store) whatever its producers do: one record at a time, each waited for, still makes at
    most one commit per interval; an idle log commits its first record at once."""
    interval_s = 0.3
    log = PartitionLog(str(tmp_path / "0"), topic="t", partition=0, leader_epoch=0,
                       config=LogConfig(commit_interval_ms=int(interval_s * 1000)))
    try:
        _append(log, "first", 1, epoch=0)
        started = time.monotonic()
        for i in range(4):
            _append(log, f"r{i}", 1, epoch=0)
        assert time.monotonic() - started >= 4 * interval_s * 0.99
        burst = [log.append(normalize_produce(produce_batch([b"x"])), leader_epoch=0,
                            producer=NO_PRODUCER) for _ in range(50)]
        versions_before = DeltaTable(str(tmp_path / "0")).version()
        for future in burst:
            future.result(RESULT_TIMEOUT_S)
        assert DeltaTable(str(tmp_path / "0")).version() - versions_before <= 2
    finally:
        log.close()


def test_an_altered_commit_interval_applies_to_the_open_log(tmp_path: Path) -> None:
    """diskless.append.commit.interval.ms altered while the leader has the log open: an append
    waiting out a long interval commits as soon as a short one is set, without reopening."""
    log = PartitionLog(str(tmp_path / "0"), topic="t", partition=0, leader_epoch=0,
                       config=LogConfig(commit_interval_ms=3_600_000))
    try:
        _append(log, "first", 1, epoch=0)  # an idle log commits at once
        waiting = log.append(normalize_produce(produce_batch([b"second"])), leader_epoch=0,
                             producer=NO_PRODUCER)
        time.sleep(0.5)  # a commit round's chance to run: the hour keeps it queued
        assert not waiting.done()
        log.pace_commits(commit_interval_ms=0, group_commit_bytes_max=1 << 20)
        assert waiting.result(RESULT_TIMEOUT_S).base_offset == 1
        assert _values(log) == [b"first-0", b"second"]
    finally:
        log.close()
