"""What a partition log does for replication, on real Delta tables: follower copies with the
leader's offsets, the app transaction that makes two writers of one table conflict, truncation,
leader epochs, and a high watermark held back until the ISR has the records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.cluster.catch_up import copy_replica
from deltabus.log_tables.appender import LOG_TXN_APP_ID
from deltabus.log_tables.partition_log import (
    NO_PRODUCER,
    LogConfig,
    PartitionLog,
    commit_ranges,
)
from deltabus.log_tables.partition_reader import PartitionReader
from deltabus.records import ProducerState, normalize_produce, produce_batch, to_log_batch

RESULT_TIMEOUT_S = 30
READ_ALL = 1 << 30


def _batch(prefix: str, n: int) -> pa.Table:
    return normalize_produce(produce_batch([f"{prefix}-{i}".encode() for i in range(n)]))


def _open(path: Path, **kwargs) -> PartitionLog:
    return PartitionLog(str(path), topic="t", partition=0,
                        config=LogConfig(sequence_wait_ms=200), **kwargs)


def _append(log: PartitionLog, prefix: str, n: int, epoch: int,
            producer: ProducerState = NO_PRODUCER) -> tuple[int, int]:
    result = log.append(_batch(prefix, n), leader_epoch=epoch,
                        producer=producer).result(RESULT_TIMEOUT_S)
    return result.base_offset, result.last_offset


def _copy_all(leader: PartitionLog, follower: PartitionLog) -> None:
    """What a follower's fetcher does: read from its log end to the leader's, append copies."""
    while follower.log_end_offset < leader.log_end_offset:
        records = leader.read(follower.log_end_offset, READ_ALL, to_log_end=True)
        follower.append_copy(records).result(RESULT_TIMEOUT_S)


def _values(log: PartitionLog) -> list[bytes]:
    return log.read(log.log_start_offset, READ_ALL, to_log_end=True).column("value").to_pylist()


@pytest.fixture
def logs(tmp_path: Path):
    leader = _open(tmp_path / "replica-0")
    follower = _open(tmp_path / "replica-1", replicated=True)
    yield leader, follower
    leader.close()
    follower.close()


def test_follower_copy_keeps_offsets_records_and_epochs(logs, tmp_path: Path) -> None:
    leader, follower = logs
    _append(leader, "a", 5, epoch=0)
    _append(leader, "b", 3, epoch=1)
    _copy_all(leader, follower)
    expected = leader.read(0, READ_ALL, to_log_end=True)
    copied = follower.read(0, READ_ALL, to_log_end=True)
    assert copied.equals(expected)
    assert follower.log_end_offset == 8
    assert follower.end_offset_for_epoch(0) == (0, 5)
    table = DeltaTable(str(tmp_path / "replica-1"))
    assert table.transaction_version(LOG_TXN_APP_ID) == 8
    assert [(r.base_offset, r.last_offset) for r in commit_ranges(table)] == [(0, 7)]


def test_copy_that_does_not_continue_the_log_fails_and_writes_nothing(logs) -> None:
    leader, follower = logs
    _append(leader, "a", 5, epoch=0)
    records = leader.read(2, READ_ALL, to_log_end=True)  # offsets 2..4 on an empty follower
    with pytest.raises(errors.InvalidRecordError, match="continues at 0"):
        follower.append_copy(records).result(RESULT_TIMEOUT_S)
    assert follower.log_end_offset == 0
    _copy_all(leader, follower)  # a correct copy still goes through afterwards
    assert _values(follower) == _values(leader)


def test_two_writers_of_one_table_conflict_instead_of_duplicating(tmp_path: Path) -> None:
    """A zombie broker and its successor (or a catch-up job and a follower) both open a table:
    the app transaction every commit sets makes the second writer's stale commit fail. The
    writer that lost learns it was fenced and acknowledges nothing: its producers get
    NOT_LEADER_OR_FOLLOWER and look the leader up again."""
    first = _open(tmp_path / "replica-0")
    second = _open(tmp_path / "replica-0")
    try:
        _append(first, "a", 3, epoch=0)
        with pytest.raises(errors.NotLeaderOrFollowerError, match="another writer"):
            _append(second, "zombie", 3, epoch=0)
        # The failed writer reloaded the table: it continues after what the other one wrote.
        assert second.log_end_offset == 3
        assert _append(second, "b", 2, epoch=1) == (3, 4)
    finally:
        first.close()
        second.close()
    reopened = _open(tmp_path / "replica-0")
    try:
        assert _values(reopened) == [b"a-0", b"a-1", b"a-2", b"b-0", b"b-1"]
    finally:
        reopened.close()


def test_a_leader_whose_log_end_another_writer_took_back_appends_nothing_more(
        tmp_path: Path) -> None:
    """A zombie leader whose table the catch-up job before its relaunch rewrote from a
    follower of this same leader epoch (so no newer epoch is in the table) and shorter (its
    log end went back) lost its commit to that job. Retrying at its epoch must fail too:
    appended at the reloaded log end, the records would take offsets its followers already
    hold other records at, and be acknowledged there (the network partition test's misplaced
    records)."""
    zombie = _open(tmp_path / "replica-0")
    follower = _open(tmp_path / "replica-1", replicated=True)
    try:
        _append(zombie, "a", 2, epoch=0)
        _copy_all(zombie, follower)  # the follower holds a-0, a-1
        _append(zombie, "b", 2, epoch=0)  # b-0, b-1: a follower may have fetched them
        job = _open(tmp_path / "replica-0")  # the catch-up job, copying from the follower
        copy_replica(follower, job)
        job.close()
        with pytest.raises(errors.NotLeaderOrFollowerError, match="another writer"):
            _append(zombie, "c", 2, epoch=0)
        assert zombie.log_end_offset == 2
        with pytest.raises(errors.NotLeaderOrFollowerError, match="no longer leads"):
            _append(zombie, "d", 2, epoch=0)
        # A newer epoch (its next election) appends again.
        assert _append(zombie, "e", 1, epoch=1) == (2, 2)
    finally:
        zombie.close()
        follower.close()
    reopened = _open(tmp_path / "replica-0")
    try:
        assert _values(reopened) == [b"a-0", b"a-1", b"e-0"]
    finally:
        reopened.close()


def test_a_leader_whose_log_another_writer_only_added_to_goes_on(tmp_path: Path) -> None:
    """A catch-up job finishing late into a relaunched leader's table adds the previous
    leader's records and takes nothing back: the leader loses its commit, reloads, and goes on
    leading after them at its epoch."""
    leader = _open(tmp_path / "replica-0")
    try:
        _append(leader, "a", 2, epoch=1)
        job = _open(tmp_path / "replica-0")
        _append(job, "copied", 1, epoch=1)
        job.close()
        with pytest.raises(errors.NotLeaderOrFollowerError, match="another writer"):
            _append(leader, "b", 1, epoch=1)
        assert _append(leader, "c", 1, epoch=1) == (3, 3)
        assert _values(leader) == [b"a-0", b"a-1", b"copied-0", b"c-0"]
    finally:
        leader.close()


def test_truncate_removes_the_tail_durably_and_appends_continue(tmp_path: Path) -> None:
    log = _open(tmp_path / "replica-0")
    _append(log, "a", 4, epoch=0)
    _append(log, "b", 4, epoch=1)
    result = log.truncate_to(6).result(RESULT_TIMEOUT_S)
    assert result.base_offset == 6
    assert (log.log_end_offset, log.high_watermark) == (6, 6)
    assert _values(log) == [b"a-0", b"a-1", b"a-2", b"a-3", b"b-0", b"b-1"]
    assert _append(log, "c", 2, epoch=2) == (6, 7)
    assert log.end_offset_for_epoch(1) == (1, 6)
    log.close()
    reopened = _open(tmp_path / "replica-0")
    try:
        assert reopened.log_end_offset == 8
        assert _values(reopened) == [b"a-0", b"a-1", b"a-2", b"a-3", b"b-0", b"b-1",
                                     b"c-0", b"c-1"]
        assert reopened.end_offset_for_epoch(1) == (1, 6)
        table = DeltaTable(str(tmp_path / "replica-0"))
        assert table.transaction_version(LOG_TXN_APP_ID) == 8
    finally:
        reopened.close()


def test_truncate_below_log_start_is_refused(tmp_path: Path) -> None:
    log = _open(tmp_path / "replica-0")
    try:
        with pytest.raises(errors.OffsetOutOfRangeError, match="below its log start"):
            log.truncate_to(-1)
    finally:
        log.close()


def test_end_offset_for_epoch_answers_as_kafka_and_survives_reopen(tmp_path: Path) -> None:
    log = _open(tmp_path / "replica-0")
    assert log.end_offset_for_epoch(0) == (-1, -1)  # empty log
    _append(log, "a", 5, epoch=2)
    _append(log, "b", 3, epoch=4)
    # One commit holding two epochs: recovery must read that row group, not trust statistics.
    log.append(_batch("c", 2), leader_epoch=7)
    log.append(_batch("d", 2), leader_epoch=9).result(RESULT_TIMEOUT_S)
    answers = {e: log.end_offset_for_epoch(e) for e in (1, 2, 3, 4, 7, 8, 9, 10)}
    assert answers == {1: (1, 0), 2: (2, 5), 3: (2, 5), 4: (4, 8), 7: (7, 10), 8: (7, 10),
                       9: (9, 12), 10: (9, 12)}
    assert log.last_epoch == 9
    log.close()
    reopened = _open(tmp_path / "replica-0")
    try:
        assert {e: reopened.end_offset_for_epoch(e) for e in answers} == answers
    finally:
        reopened.close()


def test_a_log_opens_from_its_add_actions_reading_only_footers_they_do_not_tell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relaunched broker opens each log from the Delta log alone: every file's add action
    carries its leader epochs and producer ids, so only a file holding several epochs has its
    footer read (on an object store a footer is a round trip, and a busy log holds thousands
    of small files between merges), and a new producer's first batch reads no file."""
    log = _open(tmp_path / "replica-0")
    _append(log, "a", 5, epoch=2, producer=ProducerState(50, 0, 0))
    _append(log, "b", 3, epoch=4)
    log.append(_batch("c", 2), leader_epoch=7)
    log.append(_batch("d", 2), leader_epoch=9).result(RESULT_TIMEOUT_S)
    answers = {e: log.end_offset_for_epoch(e) for e in (1, 2, 3, 4, 7, 8, 9, 10)}
    log.close()
    actions = pa.table(DeltaTable(str(tmp_path / "replica-0")).get_add_actions(flatten=True))
    assert actions.column("max.producer_id").to_pylist().count(50) == 1
    mixed = {path for path, low, high in zip(
        actions.column("path").to_pylist(), actions.column("min.leader_epoch").to_pylist(),
        actions.column("max.leader_epoch").to_pylist(), strict=True) if low != high}
    assert len(actions) - len(mixed) >= 2  # at least "a" and "b" hold one epoch each
    opened: list[str] = []
    footer = PartitionReader.parquet_file
    monkeypatch.setattr(PartitionReader, "parquet_file",
                        lambda self, path: opened.append(path) or footer(self, path))
    reopened = _open(tmp_path / "replica-0")
    try:
        assert {e: reopened.end_offset_for_epoch(e) for e in answers} == answers
        assert set(opened) == mixed
        opened.clear()
        _append(reopened, "new", 2, epoch=10, producer=ProducerState(51, 0, 0))
        assert opened == []  # above every producer id the table holds: nothing to look up
        # producer 50 is in the table: looked up, in the one file its statistics take in,
        # it goes on from its last sequence
        assert _append(reopened, "next", 1, epoch=10, producer=ProducerState(50, 0, 5)) == (
            14, 14)
        assert opened == [path for path, high in zip(
            actions.column("path").to_pylist(), actions.column("max.producer_id").to_pylist(),
            strict=True) if high == 50]
    finally:
        reopened.close()


def test_replicated_log_holds_the_high_watermark_for_its_owner(logs) -> None:
    _, follower = logs
    follower.append_copy(_leader_records(5)).result(RESULT_TIMEOUT_S)
    assert (follower.log_end_offset, follower.high_watermark) == (5, 0)
    waiter = follower.await_high_watermark(2)
    assert follower.read(0, READ_ALL).num_rows == 0  # consumers see nothing past the HW
    follower.advance_high_watermark(2)
    assert not waiter.done()
    follower.advance_high_watermark(100)  # capped at the log end offset
    assert follower.high_watermark == 5
    assert waiter.result(RESULT_TIMEOUT_S) == 5
    follower.advance_high_watermark(1)  # never back
    assert follower.high_watermark == 5
    lost = follower.await_high_watermark(7)
    follower.fail_waiters(errors.NotLeaderOrFollowerError("leadership moved"))
    with pytest.raises(errors.NotLeaderOrFollowerError):
        lost.result(RESULT_TIMEOUT_S)


def _leader_records(n: int) -> pa.Table:
    """Records as a leader at epoch 0 wrote them at offsets 0..n-1."""
    return to_log_batch(_batch("x", n), base_offset=0, now_ms=0, leader_epoch=0,
                        timestamp_type=0, producer=ProducerState())


def test_new_leader_answers_retries_of_batches_it_copied(logs) -> None:
    """After a failover, a producer retrying a batch the old leader wrote gets its offsets
    back, not a second copy; its next batch continues the sequence."""
    leader, follower = logs
    producer = 7
    _append(leader, "other", 2, epoch=0)
    _append(leader, "p0", 3, epoch=0, producer=ProducerState(producer, 0, 0))
    _append(leader, "p1", 4, epoch=0, producer=ProducerState(producer, 0, 3))
    _copy_all(leader, follower)
    # The follower is leader now (epoch 1); the producer retries its second batch.
    retry = follower.append(_batch("p1", 4), leader_epoch=1,
                            producer=ProducerState(producer, 0, 3)).result(RESULT_TIMEOUT_S)
    assert (retry.base_offset, retry.last_offset) == (5, 8)
    assert follower.log_end_offset == 9
    nxt = follower.append(_batch("p2", 1), leader_epoch=1,
                          producer=ProducerState(producer, 0, 7)).result(RESULT_TIMEOUT_S)
    assert nxt.base_offset == 9
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        follower.append(_batch("gap", 1), leader_epoch=1,
                        producer=ProducerState(producer, 0, 20)).result(RESULT_TIMEOUT_S)


def _copy_files(leader: PartitionLog, follower: PartitionLog) -> None:
    """The file path of a follower's fetch: whole committed files, copied byte for byte."""
    while follower.log_end_offset < leader.log_end_offset:
        files = leader.files_from(follower.log_end_offset, 1)  # one file a round
        assert files, "every commit of the leader starts a file"
        follower.append_files(files).result(RESULT_TIMEOUT_S)


def test_follower_copies_whole_files_with_their_statistics(logs, tmp_path: Path) -> None:
    leader, follower = logs
    _append(leader, "a", 5, epoch=0)
    _append(leader, "b", 3, epoch=2, producer=ProducerState(9, 0, 0))
    assert leader.files_from(2, READ_ALL) == []  # mid-file: the follower copies records
    _copy_files(leader, follower)
    assert follower.read(0, READ_ALL, to_log_end=True).equals(
        leader.read(0, READ_ALL, to_log_end=True))
    assert follower.end_offset_for_epoch(0) == (0, 5)
    follower.close()
    table = DeltaTable(str(tmp_path / "replica-1"))
    assert table.transaction_version(LOG_TXN_APP_ID) == 8
    copied = {a["path"]: a for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()}
    original = {a["path"]: a for a in pa.table(DeltaTable(str(tmp_path / "replica-0"))
                .get_add_actions(flatten=True)).to_pylist()}
    assert set(copied) == set(original)  # the same files, with the same statistics
    for path, action in copied.items():
        for key in ("size_bytes", "num_records", "min.offset", "max.offset", "min.timestamp"):
            assert action[key] == original[path][key]
    reopened = _open(tmp_path / "replica-1", replicated=True)
    try:
        assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 8)
        assert reopened.end_offset_for_epoch(2) == (2, 8)
        retry = reopened.append(_batch("b", 3), leader_epoch=3,  # the producer's retry
                                producer=ProducerState(9, 0, 0)).result(RESULT_TIMEOUT_S)
        assert retry.base_offset == 5 and reopened.log_end_offset == 8
    finally:
        reopened.close()


def test_files_that_do_not_continue_the_log_are_refused(logs) -> None:
    leader, follower = logs
    _append(leader, "a", 5, epoch=0)
    _append(leader, "b", 3, epoch=0)
    second = leader.files_from(5, READ_ALL)
    with pytest.raises(errors.InvalidRecordError, match="continues at 0"):
        follower.append_files(second).result(RESULT_TIMEOUT_S)
    assert follower.log_end_offset == 0
    _copy_files(leader, follower)
    assert _values(follower) == _values(leader)


def test_a_copied_file_is_read_back_and_never_committed_unless_it_matches(
        logs, tmp_path: Path) -> None:
    """A follower copies a leader's file whole: a copy that is torn (the leader's file was cut
    short, the copy failed midway) or holds other records than the leader stated is an error,
    nothing of it is committed or left behind, and the fetch tried again lands."""
    leader, follower = logs
    _append(leader, "a", 5, epoch=0)
    [leader_file] = leader.files_from(0, READ_ALL)
    source = Path(leader_file.uri)
    whole = source.read_bytes()
    follower_dir = tmp_path / "replica-1"

    source.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(errors.DeltaBusError) as torn:
        follower.append_files([leader_file]).result(RESULT_TIMEOUT_S)
    assert DeltaTable(str(follower_dir)).file_uris() == []  # nothing committed
    assert follower.log_end_offset == 0
    assert not list(follower_dir.glob("*.parquet"))  # nor left in the table's directory
    assert isinstance(torn.value, errors.CorruptMessageError) and torn.value.retriable

    source.write_bytes(whole)
    misstated = dataclasses.replace(
        leader_file, stats=leader_file.stats.replace('"numRecords":5', '"numRecords":4'))
    assert misstated.stats != leader_file.stats
    with pytest.raises(errors.CorruptMessageError, match="4 records"):
        follower.append_files([misstated]).result(RESULT_TIMEOUT_S)
    assert DeltaTable(str(follower_dir)).file_uris() == []

    follower.append_files([leader_file]).result(RESULT_TIMEOUT_S)  # the retry
    assert _values(follower) == _values(leader)


def test_a_new_leader_that_copied_only_a_producers_marker_takes_its_next_batch(
        tmp_path: Path) -> None:
    """A follower restarted after copying a producer's transaction, then copying only its
    commit marker (a control record, no sequence), and then elected: the producer's next
    transaction goes on from the sequence its table holds. It was answered
    OUT_OF_ORDER_SEQUENCE_NUMBER after the sequence wait (the marker had made the producer
    known at sequence 0, so its records in the table were never read): librdkafka's
    transactional producer takes that as fatal."""
    leader = _open(tmp_path / "replica-0")
    follower = _open(tmp_path / "replica-1", replicated=True)
    producer = 7
    txn = dict(producer_id=producer, producer_epoch=0, transactional=True)
    _append(leader, "t0", 3, epoch=0, producer=ProducerState(base_sequence=0, **txn))
    _copy_all(leader, follower)
    follower.close()  # its broker restarts: it knows no producer until it reads or copies one
    follower = _open(tmp_path / "replica-1", replicated=True)
    leader.append_marker(producer, 0, committed=True, coordinator_epoch=0,
                         leader_epoch=0).result(RESULT_TIMEOUT_S)
    _copy_all(leader, follower)
    leader.close()
    # The follower leads now (epoch 1); the producer's next transaction.
    nxt = follower.append(_batch("t1", 2), leader_epoch=1,
                          producer=ProducerState(base_sequence=3, **txn)).result(RESULT_TIMEOUT_S)
    assert (nxt.base_offset, nxt.last_offset) == (4, 5)
    follower.close()
