"""PartitionLog on a real Delta table under tmp_path: offsets, group commit, recovery, reads,
limits, long-poll and close."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltabus import errors
from deltabus.log_tables import appender
from deltabus.log_tables.log_reader import TRANSACTION_COLUMNS, LogReader
from deltabus.log_tables.partition_log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    AppendResult,
    LogConfig,
    PartitionLog,
)
from deltabus.records import (
    LOG_SCHEMA,
    VALUE_FIELDS,
    batch_size_bytes,
    from_ipc,
    normalize_produce,
    produce_batch,
    to_ipc_batches,
    to_log_batch,
)
from deltabus.storage import Storage

RESULT_TIMEOUT_S = 30
READ_ALL = 1 << 30


def _batch(values, keys=None, headers=None, timestamps_ms=None) -> pa.Table:
    return normalize_produce(produce_batch(values, keys=keys, headers=headers,
                                           timestamps_ms=timestamps_ms))


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _read_all(log: PartitionLog, offset: int = 0) -> pa.Table:
    """Everything from `offset` to the high watermark, however many reads it takes."""
    parts = []
    while offset < log.high_watermark:
        part = log.read(offset, READ_ALL)
        assert part.num_rows > 0
        parts.append(part)
        offset += part.num_rows
    return pa.concat_tables(parts) if parts else LOG_SCHEMA.empty_table()


def _open(path: Path, config: LogConfig | None = None) -> PartitionLog:
    return PartitionLog(str(path), topic="t", partition=0, config=config or LogConfig())


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "topics" / "t" / "0" / "replica-0"


@pytest.fixture
def log(path: Path):
    log = _open(path)
    yield log
    log.close()


def _wait(futures: list[Future]) -> list[AppendResult]:
    return [f.result(RESULT_TIMEOUT_S) for f in futures]


# ---- appending -----------------------------------------------------------------------------


def test_new_log_is_empty(log: PartitionLog, path: Path) -> None:
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 0, 0)
    assert DeltaTable(str(path)).version() == 0


def test_a_replica_whose_table_is_missing_is_an_error_not_an_empty_log(path: Path) -> None:
    """A broker opens its replicas with create=False: a lost table must not come back empty."""
    log = _open(path)
    log.append(_batch(_values("a", 3)), leader_epoch=0).result(RESULT_TIMEOUT_S)
    log.close()
    with pytest.raises(errors.KafkaStorageError, match="missing") as info:
        PartitionLog(str(path.parent / "replica-1"), topic="t", partition=0, create=False)
    assert info.value.code == 56 and info.value.retriable
    assert not (path.parent / "replica-1").exists()  # nothing was created in its place
    reopened = PartitionLog(str(path), topic="t", partition=0, create=False)
    assert reopened.log_end_offset == 3  # an existing table opens as ever
    reopened.close()


def test_append_returns_offsets_and_moves_log_end(log: PartitionLog) -> None:
    first = log.append(_batch([b"a", b"b", b"c"]), leader_epoch=0).result(RESULT_TIMEOUT_S)
    second = log.append(_batch([b"d"]), leader_epoch=0).result(RESULT_TIMEOUT_S)
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (second.base_offset, second.last_offset) == (3, 3)
    assert first.log_start_offset == 0
    assert log.log_end_offset == log.high_watermark == 4


def test_concurrent_appends_get_contiguous_offsets_and_are_grouped(
    log: PartitionLog, path: Path
) -> None:
    threads_n, appends_per_thread = 8, 25
    version_before = DeltaTable(str(path)).version()
    start = threading.Barrier(threads_n)
    submitted: list[list[tuple[pa.Table, Future]]] = [[] for _ in range(threads_n)]

    def produce(t: int) -> None:
        start.wait()
        for i in range(appends_per_thread):
            n = 1 + (t + i) % 5
            batch = _batch(_values(f"t{t}-a{i}", n), keys=[f"k{t}".encode()] * n)
            submitted[t].append((batch, log.append(batch, leader_epoch=1)))

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(RESULT_TIMEOUT_S)
    pairs = [pair for per_thread in submitted for pair in per_thread]
    assert len(pairs) == threads_n * appends_per_thread
    results = _wait([f for _, f in pairs])
    total = sum(b.num_rows for b, _ in pairs)

    # Every offset 0..N-1 exactly once, and each future's range has its batch's length.
    covered = sorted(o for r in results for o in range(r.base_offset, r.last_offset + 1))
    assert covered == list(range(total))
    for (batch, _), r in zip(pairs, results, strict=True):
        assert r.last_offset - r.base_offset + 1 == batch.num_rows
    assert log.log_end_offset == log.high_watermark == total

    # Each future's range holds exactly its batch.
    stored = _read_all(log)
    assert stored.column("offset").to_pylist() == list(range(total))
    stored_values = stored.column("value").to_pylist()
    for (batch, _), r in zip(pairs, results, strict=True):
        assert stored_values[r.base_offset:r.last_offset + 1] == batch.column("value").to_pylist()

    # Group commit really groups: fewer Delta versions than appends.
    commits = DeltaTable(str(path)).version() - version_before
    assert 1 <= commits < len(pairs)


def test_group_commit_batches_are_recorded_in_commit_info(log: PartitionLog, path: Path) -> None:
    futures = [log.append(_batch(_values(f"b{i}", 2)), leader_epoch=0) for i in range(40)]
    _wait(futures)
    writes = [h for h in DeltaTable(str(path)).history() if h["operation"] == "WRITE"]
    assert sum(int(h["deltabus.batches"]) for h in writes) == 40
    assert len(writes) < 40


def test_empty_batch_is_refused(log: PartitionLog) -> None:
    with pytest.raises(errors.InvalidRecordError):
        log.append(_batch([]), leader_epoch=0)
    assert log.log_end_offset == 0


def test_message_too_large_writes_nothing(log: PartitionLog, path: Path) -> None:
    """max.message.bytes limits the whole batch, as Kafka's broker checks it (its size as one
    record batch), not each record: a batch of small records over it is refused. (It was
    checked per record before issue 17, which let three records of 600 KiB through.)"""
    log.append(_batch([b"ok"]), leader_epoch=0).result(RESULT_TIMEOUT_S)
    version = DeltaTable(str(path)).version()
    three = _batch([b"v" * 60] * 3, keys=[None, b"k" * 11, None])
    limit = batch_size_bytes(three) - 1  # each record is far below it, the batch is not
    with pytest.raises(errors.MessageTooLargeError) as info:
        log.append(three, leader_epoch=0, max_message_bytes=limit)
    assert info.value.code == 10
    assert f"max.message.bytes={limit}" in str(info.value) and "t-0" in str(info.value)
    assert log.log_end_offset == 1
    assert DeltaTable(str(path)).version() == version

    # A batch of exactly max.message.bytes is accepted; the refused one took no offsets.
    r = log.append(three, leader_epoch=0, max_message_bytes=limit + 1).result(RESULT_TIMEOUT_S)
    assert (r.base_offset, r.last_offset) == (1, 3)
    assert DeltaTable(str(path)).version() == version + 1
    assert _read_all(log).column("value").to_pylist() == [b"ok"] + [b"v" * 60] * 3


def test_each_arrow_record_batch_of_an_entry_is_a_batch_for_max_message_bytes(
        log: PartitionLog) -> None:
    """A bulk produce entry carries several record batches (the Arrow record batches of its
    IPC stream): each must fit max.message.bytes, not the entry as a whole."""
    three = _batch([b"v" * 60] * 3)
    limit = batch_size_bytes(three)
    entry = from_ipc(to_ipc_batches([three] * 5))  # 15 records, 5 batches that fit
    assert batch_size_bytes(normalize_produce(entry)) > limit
    r = log.append(entry, leader_epoch=0, max_message_bytes=limit).result(RESULT_TIMEOUT_S)
    assert (r.base_offset, r.last_offset) == (0, 14)
    six = _batch([b"v" * 60] * 6)  # one batch over the limit among batches under it
    with pytest.raises(errors.MessageTooLargeError, match=f"max.message.bytes={limit}"):
        log.append(from_ipc(to_ipc_batches([three, six, three])), leader_epoch=0,
                   max_message_bytes=limit)
    assert log.log_end_offset == 15


def test_a_batch_well_under_max_message_bytes_is_not_counted_record_by_record(
        log: PartitionLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its buffers' size bounds it (records.batch_bytes_at_most): the per-record count, which
    cost more than a small batch's commit, runs only for batches near the limit."""
    from deltabus.log_tables import log_validator
    counted: list[int] = []
    real = log_validator.largest_batch_bytes
    monkeypatch.setattr(log_validator, "largest_batch_bytes",
                        lambda batch, rows: counted.append(batch.num_rows) or real(batch, rows))
    small = _batch([b"v" * 60] * 3)
    log.append(small, leader_epoch=0, max_message_bytes=1_000_000).result(RESULT_TIMEOUT_S)
    assert counted == []
    limit = batch_size_bytes(small)  # the bound is over it: counted, and it fits exactly
    r = log.append(small, leader_epoch=0, max_message_bytes=limit).result(RESULT_TIMEOUT_S)
    assert counted == [3] and (r.base_offset, r.last_offset) == (3, 5)


def test_max_message_bytes_counts_the_batch_a_kafka_client_sent(log: PartitionLog) -> None:
    """The Kafka door hands over the size of the client's record batch (compressed, maybe):
    that is what the limit applies to, whatever the records' size unpacked."""
    batch = _batch([b"x" * 1000])
    with pytest.raises(errors.MessageTooLargeError, match="is 900 bytes"):
        log.append(batch, leader_epoch=0, max_message_bytes=800, batch_bytes=900)
    r = log.append(batch, leader_epoch=0, max_message_bytes=800, batch_bytes=120)
    assert r.result(RESULT_TIMEOUT_S).base_offset == 0


def test_failed_commit_fails_its_appends_and_leaves_no_gap(
    log: PartitionLog, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.append(_batch([b"before"]), leader_epoch=0).result(RESULT_TIMEOUT_S)
    real_put = Storage.put_if_absent
    calls = {"n": 0}

    def fail_once(self: Storage, uri: str, data: bytes) -> bool:  # the disk, not Delta
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk on fire")
        return real_put(self, uri, data)

    monkeypatch.setattr(Storage, "put_if_absent", fail_once)
    failed = log.append(_batch([b"lost", b"lost"]), leader_epoch=0)
    with pytest.raises(errors.KafkaStorageError) as info:
        failed.result(RESULT_TIMEOUT_S)
    assert info.value.retriable and info.value.code == 56
    assert log.log_end_offset == log.high_watermark == 1

    # The retry gets the offsets the failed append would have had: no gap, no lost offsets.
    r = log.append(_batch([b"retried", b"retried"]), leader_epoch=0).result(RESULT_TIMEOUT_S)
    assert (r.base_offset, r.last_offset) == (1, 2)
    assert _read_all(log).column("value").to_pylist() == [b"before", b"retried", b"retried"]
    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 3


def test_flush_messages_fsyncs_every_file_since_the_last_fsync_before_acknowledging(
        log: PartitionLog, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flush.messages on a local disk: nothing is fsynced by default (Kafka's default: the page
    cache and replication); with 5, the append that reaches 5 records since the last fsync is
    acknowledged only after its own and the earlier commits' data and commit files, and the
    folders naming them, were fsynced."""
    synced: list[str] = []
    fsync = os.fsync

    def recorded(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recorded)
    log.append(_batch(_values("never", 10)), leader_epoch=0).result(RESULT_TIMEOUT_S)
    assert synced == []
    log.flush_messages = 5
    log.append(_batch(_values("a", 3)), leader_epoch=0).result(RESULT_TIMEOUT_S)
    assert synced == []  # 3 records since: not yet
    log.append(_batch(_values("b", 2)), leader_epoch=0).result(RESULT_TIMEOUT_S)
    table = DeltaTable(str(path))
    newest = sorted(pa.table(table.get_add_actions()).column("path").to_pylist(),
                    key=lambda f: (path / f).stat().st_mtime)[-2:]
    delta_log = path / "_delta_log"
    assert sorted(synced) == sorted(
        [str(path / f) for f in newest]
        + [str(delta_log / f"{v:020d}.json") for v in (table.version() - 1, table.version())]
        + [str(path), str(delta_log)])
    synced.clear()
    log.append(_batch(_values("c", 1)), leader_epoch=0).result(RESULT_TIMEOUT_S)
    assert synced == []  # counting starts again


def test_append_after_close_is_refused(path: Path) -> None:
    log = _open(path)
    log.close()
    with pytest.raises(errors.NotLeaderOrFollowerError):
        log.append(_batch([b"late"]), leader_epoch=0)


def test_flush_waits_for_every_queued_append(log: PartitionLog) -> None:
    futures = [log.append(_batch(_values(f"f{i}", 3)), leader_epoch=0) for i in range(30)]
    log.flush()
    assert all(f.done() for f in futures), "flush() returned before the queued appends committed"
    assert log.log_end_offset == 90


def test_close_commits_everything_queued(path: Path) -> None:
    log = _open(path)
    batches = [_batch(_values(f"c{i}", 1 + i % 4)) for i in range(150)]
    futures = [log.append(b, leader_epoch=0) for b in batches]
    log.close()
    assert all(f.done() for f in futures)
    _wait(futures)
    expected = [v for b in batches for v in b.column("value").to_pylist()]

    reopened = _open(path)
    try:
        assert reopened.log_end_offset == len(expected)
        assert _read_all(reopened).column("value").to_pylist() == expected
    finally:
        reopened.close()


# ---- recovery ------------------------------------------------------------------------------


def test_reopen_recovers_offsets_and_appends_continue(path: Path) -> None:
    log = _open(path)
    _wait([log.append(_batch(_values(f"r{i}", 3)), leader_epoch=0) for i in range(4)])
    log.close()

    reopened = _open(path)
    try:
        assert reopened.log_start_offset == 0
        assert reopened.log_end_offset == reopened.high_watermark == 12
        r = reopened.append(_batch([b"next"]), leader_epoch=1).result(RESULT_TIMEOUT_S)
        assert (r.base_offset, r.last_offset) == (12, 12)
        assert reopened.log_end_offset == 13
    finally:
        reopened.close()


# ---- reading -------------------------------------------------------------------------------


def _fill(log: PartitionLog) -> pa.Table:
    """Three batches with keys, values, headers and timestamps; returns what was sent, in order."""
    sent = [
        _batch([b"v0", b"v1"], keys=[b"k0", None],
               headers=[[("h", b"x"), ("null", None)], None], timestamps_ms=[1000, 2000]),
        _batch([None, b""], keys=[b"k2", b"k3"], timestamps_ms=[3000, 1500]),
        _batch([b"v4"], keys=[b"k4"], headers=[[("unicodé", b"\x00\xff")]],
               timestamps_ms=[2500]),
    ]
    for b in sent:  # one commit per batch: several files for the Parquet path
        log.append(b, leader_epoch=2).result(RESULT_TIMEOUT_S)
    return pa.concat_tables(sent)


def _assert_records(table: pa.Table, sent: pa.Table, offset: int) -> None:
    assert table.schema == LOG_SCHEMA
    n = sent.num_rows - offset
    assert table.column("offset").to_pylist() == list(range(offset, sent.num_rows))
    for name in ("key", "value", "headers", "timestamp"):
        assert table.column(name).to_pylist() == sent.column(name).to_pylist()[offset:], name
    assert table.column("leader_epoch").to_pylist() == [2] * n


@pytest.mark.parametrize("offset", [0, 1, 2, 3, 4])
def test_read_from_cache_returns_records_from_offset(log: PartitionLog, offset: int) -> None:
    sent = _fill(log)
    _assert_records(_read_all(log, offset), sent, offset)


def test_read_after_reopen_comes_from_parquet_intact(path: Path) -> None:
    log = _open(path)
    sent = _fill(log)
    log.close()
    reopened = _open(path)
    try:
        assert not reopened._tail  # nothing in memory: these reads are Parquet reads
        for offset in range(sent.num_rows):
            _assert_records(_read_all(reopened, offset), sent, offset)
    finally:
        reopened.close()


def test_read_of_evicted_records_falls_back_to_parquet(path: Path) -> None:
    log = _open(path, LogConfig(log_cache_bytes_max=1))  # the cache keeps only the last commit
    try:
        sent = _fill(log)
        for offset in range(sent.num_rows):
            _assert_records(_read_all(log, offset), sent, offset)
    finally:
        log.close()


def test_read_respects_max_bytes_but_returns_at_least_one_record(log: PartitionLog) -> None:
    _wait([log.append(_batch([b"x" * 1000] * 10), leader_epoch=0)])
    one = log.read(3, 1)
    assert one.column("offset").to_pylist() == [3]
    some = log.read(0, 3500)
    assert 1 <= some.num_rows < 10
    assert some.column("offset").to_pylist() == list(range(some.num_rows))


def test_reads_of_a_file_whose_row_groups_interleave_return_every_offset_once(
        path: Path) -> None:
    """delta-rs may interleave a file's rows across its row groups (seen in 3 of 6 files of a
    bulk produce: groups of offsets 233309-314812 and 276789-335544). A read stopping after
    `max_bytes` must still return a contiguous run: it once returned the first group's
    offsets with the second's missing, and the consumer's position skipped them for good."""
    _open(path).close()
    records = 1_000
    ordered = to_log_batch(_batch([b"x" * 100] * records), base_offset=0, now_ms=1,
                           leader_epoch=0)
    interleaved = ordered.take(list(range(0, records, 2)) + list(range(1, records, 2)))
    write_deltalake(str(path), interleaved, mode="append",
                    writer_properties=WriterProperties(max_row_group_size=100),
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(appender.LOG_TXN_APP_ID, records)]))
    log = _open(path)
    try:
        assert log.high_watermark == records
        for max_bytes in (1, 5_000, 30_000, READ_ALL):
            offset, seen = 0, []
            while offset < records:
                part = log.read(offset, max_bytes)
                assert part.num_rows > 0, f"nothing at {offset} ({max_bytes} bytes)"
                seen += part.column("offset").to_pylist()
                offset = seen[-1] + 1
            assert seen == list(range(records)), max_bytes
    finally:
        log.close()


def test_an_executors_reader_hands_on_a_file_group_by_group_and_orders_interleaved_ones(
        path: Path) -> None:
    """The Spark source's reader (LogReader) holds one Parquet row group at a time, not a
    whole data file, and leaves out the transaction columns where statistics show no marker;
    a file whose groups interleave is still read whole and in offset order."""
    log = _open(path)
    try:
        _wait([log.append(_batch([b"x" * 10] * 150_000), leader_epoch=0)])
    finally:
        log.close()
    columns = ["offset", "value", *TRANSACTION_COLUMNS]
    parts = list(LogReader(str(path)).read(70_000, 140_000, columns, skip_marker_free=True))
    assert [p.num_rows for p in parts] == [131_072 - 70_000, 140_000 - 131_072]
    assert pa.concat_tables(parts).column("offset").to_pylist() == list(range(70_000, 140_000))
    assert all(p.column_names == ["offset", "value"] for p in parts)
    asked = list(LogReader(str(path)).read(70_000, 140_000, columns))
    assert all(p.column_names == columns for p in asked)

    shuffled = path.parent / "replica-1"
    ordered = to_log_batch(_batch([b"x" * 100] * 1_000), base_offset=0, now_ms=1,
                           leader_epoch=0)
    write_deltalake(str(shuffled), ordered.take(list(range(0, 1_000, 2))
                                                + list(range(1, 1_000, 2))),
                    writer_properties=WriterProperties(max_row_group_size=100))
    whole = list(LogReader(str(shuffled)).read(150, 850, columns, skip_marker_free=True))
    assert len(whole) == 1
    assert whole[0].column("offset").to_pylist() == list(range(150, 850))


def test_read_upto_stops_early(log: PartitionLog) -> None:
    _fill(log)
    assert log.read(1, READ_ALL, upto=3).column("offset").to_pylist() == [1, 2]


def test_read_at_high_watermark_is_empty_and_past_it_is_out_of_range(log: PartitionLog) -> None:
    empty = log.read(0, READ_ALL)
    assert empty.num_rows == 0 and empty.schema == LOG_SCHEMA
    with pytest.raises(errors.OffsetOutOfRangeError):
        log.read(1, READ_ALL)
    _fill(log)
    hw = log.high_watermark
    at_hw = log.read(hw, READ_ALL)
    assert at_hw.num_rows == 0 and at_hw.schema == LOG_SCHEMA
    for bad in (hw + 1, hw + 1000, -1):
        with pytest.raises(errors.OffsetOutOfRangeError) as info:
            log.read(bad, READ_ALL)
        assert info.value.code == 1


def test_a_position_above_the_high_watermark_within_the_log_gets_no_records(path: Path) -> None:
    """A new leader's high watermark lags its log end until its followers fetch again; a
    consumer already past it (it read that far from the old leader) must get no records, not
    OFFSET_OUT_OF_RANGE (which resets it)."""
    log = PartitionLog(str(path), topic="t", partition=0, config=LogConfig(), replicated=True)
    try:
        log.append(_batch(_values("v", 10)), leader_epoch=0).result(RESULT_TIMEOUT_S)
        log.advance_high_watermark(4)
        assert (log.high_watermark, log.log_end_offset) == (4, 10)
        for position in (5, 9, 10):
            assert log.read(position, READ_ALL).num_rows == 0
        assert log.read(2, READ_ALL).column("offset").to_pylist() == [2, 3]
        assert log.read(7, READ_ALL, to_log_end=True).column("offset").to_pylist() == [7, 8, 9]
        with pytest.raises(errors.OffsetOutOfRangeError, match="log end offset 10"):
            log.read(11, READ_ALL)
    finally:
        log.close()


# ---- ListOffsets ---------------------------------------------------------------------------


def test_offset_for_timestamp(log: PartitionLog) -> None:
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (0, -1)
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (-1, -1)
    _fill(log)  # timestamps by offset: 1000, 2000, 3000, 1500, 2500
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (5, -1)
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (2, 3000)
    assert log.offset_for_timestamp(0) == (0, 1000)
    assert log.offset_for_timestamp(1000) == (0, 1000)
    assert log.offset_for_timestamp(1001) == (1, 2000)  # first offset at or after, not nearest
    assert log.offset_for_timestamp(2600) == (2, 3000)
    assert log.offset_for_timestamp(3001) == (-1, -1)


def test_max_timestamp_tie_returns_the_earliest_offset(log: PartitionLog) -> None:
    # Kafka keeps the first record carrying the largest timestamp (strict `>` when it tracks
    # offsetOfMaxTimestamp; KAFKA-16342 tests LogAppendTime batches expect their first offset).
    # Ties are common: with LogAppendTime every record of a commit has the same timestamp.
    for _ in range(5):
        log.append(_batch([b"same"], timestamps_ms=[7000]), leader_epoch=0).result(
            RESULT_TIMEOUT_S)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (0, 7000), \
        "MAX_TIMESTAMP must pick the earliest offset among records with the largest timestamp"


# ---- long poll -----------------------------------------------------------------------------


def test_wait_for_data_wakes_when_another_thread_appends(log: PartitionLog) -> None:
    waiting = threading.Event()
    outcome: list[bool] = []

    def consumer() -> None:
        waiting.set()
        outcome.append(log.wait_for_data(0, timeout_s=RESULT_TIMEOUT_S))

    t = threading.Thread(target=consumer)
    t.start()
    assert waiting.wait(RESULT_TIMEOUT_S)
    log.append(_batch([b"wake"]), leader_epoch=0).result(RESULT_TIMEOUT_S)
    t.join(RESULT_TIMEOUT_S)
    assert not t.is_alive(), "wait_for_data did not wake on append"
    assert outcome == [True]


def test_wait_for_data_returns_at_once_when_data_is_there(log: PartitionLog) -> None:
    log.append(_batch([b"a", b"b"]), leader_epoch=0).result(RESULT_TIMEOUT_S)
    assert log.wait_for_data(1, timeout_s=0) is True
    assert log.wait_for_data(2, timeout_s=0.01) is False


def test_wait_for_data_wakes_on_close(path: Path) -> None:
    log = _open(path)
    outcome: list[bool] = []
    t = threading.Thread(target=lambda: outcome.append(log.wait_for_data(0, RESULT_TIMEOUT_S)))
    t.start()
    log.close()
    t.join(RESULT_TIMEOUT_S)
    assert not t.is_alive()
    assert outcome == [False]


# ---- the table as other readers see it -----------------------------------------------------


def test_table_is_readable_by_plain_deltalake(log: PartitionLog, path: Path) -> None:
    sent = _fill(log)
    table = DeltaTable(str(path)).to_pyarrow_table().sort_by("offset")
    assert table.column_names == LOG_SCHEMA.names
    assert table.column("offset").to_pylist() == list(range(sent.num_rows))
    assert table.column("value").to_pylist() == sent.column("value").to_pylist()
    assert table.column("key").to_pylist() == sent.column("key").to_pylist()
    assert table.cast(LOG_SCHEMA).column("headers").to_pylist() == \
        sent.column("headers").to_pylist()


def test_commit_info_carries_offset_ranges(log: PartitionLog, path: Path) -> None:
    _wait([log.append(_batch(_values(f"h{i}", 1 + i)), leader_epoch=0) for i in range(6)])
    writes = sorted((h for h in DeltaTable(str(path)).history() if h["operation"] == "WRITE"),
                    key=lambda h: h["version"])
    assert writes
    expected_base = 0
    for h in writes:
        base, last = int(h["deltabus.baseOffset"]), int(h["deltabus.lastOffset"])
        assert base == expected_base
        assert last >= base
        assert h["operationMetrics"]["num_added_rows"] == last - base + 1
        expected_base = last + 1
    assert expected_base == log.log_end_offset == sum(1 + i for i in range(6))


# ---- properties ----------------------------------------------------------------------------


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12))
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_read_back_equals_written_for_any_batch_sizes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int]
) -> None:
    path = tmp_path_factory.mktemp("prop") / "log"
    log = _open(path)
    try:
        batches = [_batch(_values(f"p{i}", n), keys=[str(n).encode()] * n)
                   for i, n in enumerate(sizes)]
        results = _wait([log.append(b, leader_epoch=0) for b in batches])
        expected_base = 0
        for b, r in zip(batches, results, strict=True):
            assert (r.base_offset, r.last_offset) == (expected_base, expected_base + b.num_rows - 1)
            expected_base += b.num_rows
        written = pa.concat_tables(batches)
        back = _read_all(log)
        assert back.column("offset").to_pylist() == list(range(written.num_rows))
        assert back.column("value").to_pylist() == written.column("value").to_pylist()
        assert back.column("key").to_pylist() == written.column("key").to_pylist()
    finally:
        log.close()
    reopened = _open(path)
    try:
        back = _read_all(reopened)
        assert back.column("value").to_pylist() == written.column("value").to_pylist()
    finally:
        reopened.close()


def test_a_logs_size_is_its_live_data_files(log: PartitionLog, path: Path) -> None:
    """DescribeLogDirs' partition size: the bytes of the table's live data files, as the Delta
    log lists them, growing with every append."""
    assert log.size_bytes() == 0
    log.append(_batch(_values("a", 100)), leader_epoch=0).result(10)
    first = log.size_bytes()
    log.append(_batch(_values("b", 100)), leader_epoch=0).result(10)
    sizes = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).column("size_bytes")
    assert 0 < first < log.size_bytes() == sum(sizes.to_pylist())


def test_a_tail_in_memory_goes_to_followers_as_records_up_to_a_size(path: Path) -> None:
    """What a follower fetching from an offset is sent: records while the tail cache holds
    the log from there, in less than replica_files_min_bytes; files otherwise."""
    log = _open(path, LogConfig(log_cache_bytes_max=6_000))
    for i in range(3):  # three commits of about 2 KB each: the cache keeps the last two
        log.append(_batch([bytes([i]) * 1_000, bytes([i]) * 1_000]), leader_epoch=0).result(
            RESULT_TIMEOUT_S)
    assert log.cached_tail_under(6, 1_000)  # caught up: nothing to send
    assert log.cached_tail_under(4, 3_000)
    assert not log.cached_tail_under(4, 1_000)  # the tail is larger: files
    assert log.cached_tail_under(2, 10_000)
    assert not log.cached_tail_under(0, 10_000)  # left the cache: files
    log.close()


def test_a_followers_read_from_parquet_carries_a_typed_topics_values_across_evolution(
        path: Path) -> None:
    """A follower whose catch-up starts inside a data file copies records the leader reads from
    Parquet: they must carry the typed columns (records.VALUE_FIELDS) as the commit wrote them,
    or that replica's table holds nulls where the leader's holds values. Consumers' reads keep
    the log's own columns."""
    v1 = [{"id": f"a{i}", "amount": float(i)} for i in range(3)]
    v2 = [{"id": f"b{i}", "amount": 10.0 + i, "note": f"n{i}"} for i in range(2)]
    log = _open(path)
    try:
        for values in (v1, v2):
            fields = pa.array(values)
            _wait([log.append(_batch([b"x"] * len(values)), leader_epoch=0,
                              validate=lambda _batch, f=fields: {VALUE_FIELDS: f})])
    finally:
        log.close()
    reopened = _open(path)
    try:
        assert not reopened._tail  # nothing in memory: the reads below are Parquet reads
        copied = reopened.read(1, READ_ALL, to_log_end=True)  # inside the first commit's file
        assert copied.column("offset").to_pylist() == [1, 2, 3, 4]
        assert copied.column(VALUE_FIELDS).to_pylist() == [
            {**v, "note": None} for v in v1[1:]] + v2
        consumed = reopened.read(1, READ_ALL)
        assert consumed.schema.equals(LOG_SCHEMA)
    finally:
        reopened.close()


def test_a_typed_tables_files_carry_statistics_of_each_decoded_field(log: PartitionLog,
                                                                     path: Path) -> None:
    """SQL on a typed topic (Spark's Parquet reader, spark/parquet_reads.py) skips row groups
    by the decoded fields (WHERE amount > ...): the head files are written for speed (no
    dictionaries, no page index: see delta_writes.writer_properties), but each field keeps its
    row-group statistics."""
    values = pa.array([{"id": f"p{i}", "amount": float(i), "currency": ("EUR", "USD")[i % 2]}
                       for i in range(1_000)])
    _wait([log.append(_batch([b"x"] * len(values)), leader_epoch=0,
                      validate=lambda _batch: {VALUE_FIELDS: values})])
    [data_file] = DeltaTable(str(path)).file_uris()
    group = pq.ParquetFile(data_file).metadata.row_group(0)
    leaves = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    amount = leaves[f"{VALUE_FIELDS}.amount"].statistics
    assert (amount.min, amount.max) == (0.0, 999.0)
    assert leaves[f"{VALUE_FIELDS}.currency"].statistics.max == "USD"
    assert leaves[f"{VALUE_FIELDS}.id"].statistics.min == "p0"


def test_a_typed_column_holds_promoted_values_and_refuses_what_its_type_cannot_hold(
        log: PartitionLog, path: Path) -> None:
    """A registry lets a schema promote a field (Avro int to long or to double), but a Delta
    column written by delta-rs never changes type: integers are stored as 64-bit from the
    first commit, and a value the column cannot hold is refused with INVALID_RECORD naming the
    field, before it could fail the group commit other producers' batches joined."""
    def append(values: pa.Array) -> Future:
        return log.append(_batch([b"x"] * len(values)), leader_epoch=0,
                          validate=lambda _batch: {VALUE_FIELDS: values})

    first = pa.array([{"id": "a", "qty": 1}], pa.struct([("id", pa.string()),
                                                         ("qty", pa.int32())]))
    _wait([append(first)])
    promoted = pa.array([{"id": "b", "qty": 2**40}], pa.struct([("id", pa.string()),
                                                                ("qty", pa.int64())]))
    _wait([append(promoted)])
    with pytest.raises(errors.InvalidRecordError, match="qty"):
        append(pa.array([{"id": "c", "qty": 2.5}], pa.struct([("id", pa.string()),
                                                              ("qty", pa.float64())])))
    whole = pa.array([{"id": "d", "qty": 3.0}], pa.struct([("id", pa.string()),
                                                           ("qty", pa.float64())]))
    _wait([append(whole)])  # a double that is a whole number fits the integer column
    table = DeltaTable(str(path))
    assert pa.schema(table.schema().to_arrow()).field(VALUE_FIELDS).type == pa.struct(
        [("id", pa.string()), ("qty", pa.int64())])
    rows = table.to_pyarrow_table(columns=["offset", VALUE_FIELDS]).sort_by("offset")
    assert rows.column("offset").to_pylist() == [0, 1, 2]
    assert [v["qty"] for v in rows.column(VALUE_FIELDS).to_pylist()] == [1, 2**40, 3]


def test_a_batch_of_many_chunks_is_written_in_offset_order(log: PartitionLog, path: Path) -> None:
    """A bulk produce entry arrives as several Arrow record batches; delta-rs may write a
    table's chunks in any order, and a data file out of offset order costs every read of it
    from Parquet a sort (a fetch below the tail cache, every Spark stream's read)."""
    chunks = [_batch(_values(f"c{c}", 20_000)) for c in range(6)]
    _wait([log.append(pa.concat_tables(chunks), leader_epoch=0)])
    [data_file] = DeltaTable(str(path)).file_uris()
    offsets = pq.read_table(data_file, columns=["offset"]).column("offset").to_pylist()
    assert offsets == list(range(120_000))


def test_a_data_file_that_reads_wrong_answers_a_storage_error_and_is_opened_afresh(
        tmp_path: Path) -> None:
    """A read of a data file that fails (here: cut short under its open handle) answers
    KAFKA_STORAGE_ERROR, which clients retry, not whatever pyarrow raised (which failed the
    whole Fetch); once the file reads again, so does the log."""
    path = str(tmp_path / "t-0")
    log = PartitionLog(path, topic="t", partition=0)
    values = [os.urandom(200) for _ in range(500)]
    log.append(normalize_produce(produce_batch(values)), leader_epoch=0).result(30)
    log.close()
    log = PartitionLog(path, topic="t", partition=0)  # nothing in its tail cache
    try:
        assert log.read(0, 1 << 20, to_log_end=True).column("value").to_pylist() == values
        (data,) = [f for f in os.listdir(path) if f.endswith(".parquet")]
        whole = (tmp_path / "t-0" / data).read_bytes()
        with open(tmp_path / "t-0" / data, "r+b") as f:
            f.truncate(len(whole) // 3)  # under the open file's cached footer
        with pytest.raises(errors.KafkaStorageError, match="cannot read row group 0 of"):
            log.read(0, 1 << 20, to_log_end=True)
        (tmp_path / "t-0" / data).write_bytes(whole)
        assert log.read(0, 1 << 20, to_log_end=True).column("value").to_pylist() == values
    finally:
        log.close()


def test_the_file_counts_the_metrics_show_follow_commits_and_truncations(tmp_path: Path) -> None:
    """A broker's deltabus_log_files and kafka_log_log_size come from `file_stats`, kept up as
    the log commits (no table read per scrape) and counted afresh after a truncation: always
    what the table's add actions say. Its commits are timed in the broker's metrics."""
    from prometheus_client import generate_latest

    from deltabus.metrics import NodeMetrics

    metrics = NodeMetrics()
    log = PartitionLog(str(tmp_path / "replica-0"), topic="t", partition=0,
                       meters=metrics.logs)

    def from_table() -> tuple[int, int]:
        table = DeltaTable(str(tmp_path / "replica-0"))
        sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
        return len(sizes), sum(sizes)

    try:
        for i in range(3):
            log.append(_batch(_values(f"b{i}-", 10)), leader_epoch=0).result(30)
            assert log.file_stats() == from_table()
        log.truncate_to(15).result(30)
        assert log.file_stats() == from_table()
        log.append(_batch(_values("after-", 5)), leader_epoch=0).result(30)
        assert log.file_stats() == from_table()
        assert log.read(0, 1 << 20).num_rows == 20
    finally:
        log.close()
    text = generate_latest(metrics.registry).decode()
    assert "deltabus_log_commit_seconds_count 4.0" in text  # the appends; not the truncation
    assert "deltabus_log_tail_cache_hits_total 1.0" in text
