"""Idempotent-producer sequencing in a partition log: pipelined batches land in sequence order,
retries are not written twice, and a gap that never fills is refused, not silently skipped."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from deltabus import errors
from deltabus.log_tables import LogConfig, PartitionLog
from deltabus.records import ProducerState, normalize_produce, produce_batch


def batch(prefix: str, n: int):
    return normalize_produce(produce_batch([f"{prefix}-{i}".encode() for i in range(n)]))


def open_log(tmp_path, **config) -> PartitionLog:
    return PartitionLog(str(tmp_path / "log"), topic="t", partition=0,
                        config=LogConfig(**config))


def values(log: PartitionLog) -> list[bytes]:
    return log.read(0, 1 << 30).column("value").to_pylist()


def test_a_batch_that_arrives_early_waits_for_its_predecessor(tmp_path):
    log = open_log(tmp_path)
    results = {}

    def second() -> None:
        results["second"] = log.append(batch("b", 10), leader_epoch=0,
                                       producer=ProducerState(7, 0, 10)).result(10)

    early = threading.Thread(target=second)
    early.start()
    early.join(0.3)
    assert early.is_alive()  # held: sequence 0 has not arrived
    first = log.append(batch("a", 10), leader_epoch=0, producer=ProducerState(7, 0, 0)).result(10)
    early.join(10)
    assert (first.base_offset, results["second"].base_offset) == (0, 10)
    assert values(log) == [f"a-{i}".encode() for i in range(10)] + \
        [f"b-{i}".encode() for i in range(10)]
    log.close()


def test_a_retried_batch_gets_its_first_offsets_and_is_not_written_twice(tmp_path):
    log = open_log(tmp_path)
    producer = ProducerState(3, 0, 0)
    first = log.append(batch("a", 5), leader_epoch=0, producer=producer).result(10)
    retry = log.append(batch("a", 5), leader_epoch=0, producer=producer).result(10)
    assert retry == first
    assert len(values(log)) == 5
    log.close()


def test_a_gap_that_never_fills_is_refused(tmp_path):
    log = open_log(tmp_path, sequence_wait_ms=200)
    log.append(batch("a", 2), leader_epoch=0, producer=ProducerState(1, 0, 0)).result(10)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        log.append(batch("c", 2), leader_epoch=0, producer=ProducerState(1, 0, 5))
    assert log.log_end_offset == 2
    log.close()


def test_a_gap_waits_no_longer_than_its_request_timeout(tmp_path):
    """The sequence wait (a minute here) is the most a gap is waited for: the produce
    request's timeout ends the wait sooner, so no request holds its thread past it."""
    log = open_log(tmp_path, sequence_wait_ms=60_000)
    log.append(batch("a", 2), leader_epoch=0, producer=ProducerState(1, 0, 0)).result(10)
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match=r"waited \d{1,3} ms"):
        log.append(batch("c", 2), leader_epoch=0, producer=ProducerState(1, 0, 5),
                   timeout_ms=100)
    after = log.append(batch("b", 3), leader_epoch=0, producer=ProducerState(1, 0, 2),
                       timeout_ms=100).result(10)
    assert after.base_offset == 2 and log.log_end_offset == 5
    log.close()


def test_back_pressure_holds_a_produce_no_longer_than_its_request_timeout(tmp_path):
    """Past pending_bytes_max a produce waits for the commits to drain, at most its request's
    timeout: then REQUEST_TIMED_OUT, nothing of it queued, and the producer's sequence numbers
    left for its retry."""
    log = open_log(tmp_path, pending_bytes_max=1, group_commit_linger_ms=60_000)
    first = log.append(batch("a", 2), leader_epoch=0, producer=ProducerState(1, 0, 0))
    with pytest.raises(errors.RequestTimedOutError, match="pending_bytes_max"):
        log.append(batch("b", 2), leader_epoch=0, producer=ProducerState(1, 0, 2),
                   timeout_ms=100)
    assert not first.done()  # the first is still lingering: the refusal did not wait for it
    log.close()  # commits what is queued
    assert first.result(10).base_offset == 0
    reopened = open_log(tmp_path)
    assert values(reopened) == [b"a-0", b"a-1"]
    retry = reopened.append(batch("b", 2), leader_epoch=1, producer=ProducerState(1, 0, 2),
                            timeout_ms=1_000).result(10)
    assert retry.base_offset == 2
    reopened.close()


def test_an_invalid_batch_uses_up_its_sequence_so_later_ones_flow(tmp_path):
    log = open_log(tmp_path, sequence_wait_ms=200)
    with pytest.raises(errors.MessageTooLargeError):  # the batch is about 1000 bytes
        log.append(batch("big" * 100, 3), leader_epoch=0, producer=ProducerState(2, 0, 0),
                   max_message_bytes=200)
    after = log.append(batch("ok", 1), leader_epoch=0, producer=ProducerState(2, 0, 3),
                       max_message_bytes=200).result(10)
    assert after.base_offset == 0
    log.close()


def test_a_batch_with_bad_columns_uses_up_its_sequence_so_later_ones_flow(tmp_path):
    """The door hands the batch over as the client sent it; the log refuses an unknown column
    only after taking the sequence numbers, so the producer's next batch is not held up."""
    log = open_log(tmp_path, sequence_wait_ms=60_000)
    odd = pa.table({"value": [b"v", b"w"], "colour": [b"red", b"blue"]})
    with pytest.raises(errors.InvalidRecordError, match="colour"):
        log.append(odd, leader_epoch=0, producer=ProducerState(4, 0, 0))
    raw = pa.table({"value": [b"next"]})  # a subset of the columns is completed, not refused
    after = log.append(raw, leader_epoch=0, producer=ProducerState(4, 0, 2)).result(10)
    assert after.base_offset == 0 and values(log) == [b"next"]
    log.close()


def test_producer_state_is_recovered_from_the_table_after_reopen(tmp_path):
    log = open_log(tmp_path)
    for i in range(3):
        log.append(batch(f"r{i}", 4), leader_epoch=0,
                   producer=ProducerState(9, 0, 4 * i)).result(10)
    log.close()
    reopened = open_log(tmp_path, sequence_wait_ms=200)
    # A retry of a batch written before the restart gets the offsets it was written at.
    retry = reopened.append(batch("r1", 4), leader_epoch=1,
                            producer=ProducerState(9, 0, 4)).result(10)
    assert (retry.base_offset, retry.last_offset) == (4, 7)
    nxt = reopened.append(batch("r3", 4), leader_epoch=1,
                          producer=ProducerState(9, 0, 12)).result(10)
    assert nxt.base_offset == 12
    assert len(values(reopened)) == 16
    reopened.close()


def test_first_batch_retried_after_a_restart_is_not_written_twice(tmp_path):
    log = open_log(tmp_path)
    log.append(batch("first", 3), leader_epoch=0, producer=ProducerState(5, 0, 0)).result(10)
    log.close()
    reopened = open_log(tmp_path)
    retry = reopened.append(batch("first", 3), leader_epoch=1,
                            producer=ProducerState(5, 0, 0)).result(10)
    assert retry.base_offset == 0
    new = reopened.append(batch("new", 1), leader_epoch=1,  # a new producer: starts at 0
                          producer=ProducerState(6, 0, 0)).result(10)
    assert new.base_offset == 3
    assert len(values(reopened)) == 4
    reopened.close()


def test_a_producer_id_above_every_id_in_the_table_is_not_looked_up(tmp_path, monkeypatch):
    from deltabus.log_tables import producer_state
    log = open_log(tmp_path)
    log.append(batch("old", 3), leader_epoch=0, producer=ProducerState(5, 0, 0)).result(10)
    log.close()
    looked_up: list[int] = []
    real = producer_state.recent_producer_rows
    monkeypatch.setattr(producer_state, "recent_producer_rows",
                        lambda files, pid: looked_up.append(pid) or real(files, pid))
    reopened = open_log(tmp_path, sequence_wait_ms=200)
    for pid in (6, 7, 8):  # newer producers, as InitProducerId hands them out
        reopened.append(batch(f"p{pid}", 2), leader_epoch=1,
                        producer=ProducerState(pid, 0, 0)).result(10)
    assert looked_up == []
    # An id at or below the bound is looked up, and its retry still answered from the table.
    retry = reopened.append(batch("old", 3), leader_epoch=1,
                            producer=ProducerState(5, 0, 0)).result(10)
    assert looked_up == [5] and retry.base_offset == 0
    assert len(values(reopened)) == 9
    reopened.close()


def test_a_new_leader_reads_a_producer_from_its_newest_files_only(tmp_path, monkeypatch):
    """A producer's retries repeat its last batches only (five at most in flight, as Kafka's
    broker remembers five), and each batch is one commit's file at most: a leader taking over a
    long log reads the newest files holding it, not the whole table, and a retry of an older
    batch is still never written twice."""
    from deltabus.log_tables import producer_state
    log = open_log(tmp_path)
    for i in range(8):
        log.append(batch(f"b{i}", 2), leader_epoch=0,
                   producer=ProducerState(3, 0, 2 * i)).result(10)
    log.close()
    files_read: list[int] = []
    real = producer_state._rows_of
    monkeypatch.setattr(producer_state, "_rows_of",
                        lambda reader, pid: files_read.append(pid) or real(reader, pid))
    reopened = open_log(tmp_path, sequence_wait_ms=200)
    recent = reopened.append(batch("b5", 2), leader_epoch=1,
                             producer=ProducerState(3, 0, 10)).result(10)
    assert (recent.base_offset, recent.last_offset) == (10, 11)  # answered with its offsets
    assert len(files_read) == producer_state.PRODUCER_BATCHES_REMEMBERED  # of 8 files
    with pytest.raises(errors.DuplicateSequenceNumberError):  # written: not again
        reopened.append(batch("b1", 2), leader_epoch=1, producer=ProducerState(3, 0, 2))
    nxt = reopened.append(batch("b8", 2), leader_epoch=1,
                          producer=ProducerState(3, 0, 16)).result(10)
    assert nxt.base_offset == 16 and len(values(reopened)) == 18
    reopened.close()


def test_the_producer_id_bound_comes_from_the_files_statistics(tmp_path):
    import pyarrow.parquet as pq

    from deltabus.log_tables.log_reader import producer_id_max
    log = open_log(tmp_path)
    assert producer_id_max([]) == -1
    for pid in (12, 4):
        log.append(batch(f"p{pid}", 2), leader_epoch=0,
                   producer=ProducerState(pid, 0, 0)).result(10)
    log.append(batch("plain", 2), leader_epoch=0).result(10)  # not idempotent: id -1
    files = sorted((tmp_path / "log").glob("*.parquet"))
    assert producer_id_max(pq.ParquetFile(f) for f in files) == 12
    log.close()


def test_the_log_tells_each_producers_last_sequence_and_timestamp(tmp_path):
    """DescribeProducers' answer: each idempotent producer with its epoch, the last sequence
    it wrote and its last batch's newest timestamp (as Kafka's); records of no producer add
    none."""
    log = open_log(tmp_path)
    assert log.active_producers() == []
    log.append(normalize_produce(produce_batch([b"a", b"b"], timestamps_ms=[5_000, 9_000])),
               leader_epoch=0, producer=ProducerState(7, 2, 0)).result(10)
    log.append(normalize_produce(produce_batch([b"c"], timestamps_ms=[8_000])), leader_epoch=0,
               producer=ProducerState(7, 2, 2)).result(10)
    log.append(batch("plain", 3), leader_epoch=0).result(10)
    log.append(batch("other", 4), leader_epoch=0, producer=ProducerState(9, 0, 0)).result(10)
    assert [(p.producer_id, p.producer_epoch, p.last_sequence, p.last_timestamp_ms)
            for p in log.active_producers()][0] == (7, 2, 2, 8_000)
    assert [p.producer_id for p in log.active_producers()] == [7, 9]
    log.close()


def test_a_batch_reaching_past_what_was_written_is_out_of_order_not_a_duplicate(tmp_path):
    """A batch whose base sequence was written but whose later records were not (here 0-5
    after 0-3, to a log that knows the producer only from its table, as a new leader knows
    one from the records it copied) is no duplicate: clients take DUPLICATE_SEQUENCE_NUMBER
    as "written", and would drop records 4 and 5 (the transactions soak lost a committed
    transaction's records so). Kafka's broker answers OUT_OF_ORDER_SEQUENCE_NUMBER."""
    log = open_log(tmp_path)
    log.append(batch("a", 4), leader_epoch=0, producer=ProducerState(8, 0, 0)).result(10)
    log.close()
    reopened = open_log(tmp_path, sequence_wait_ms=200)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        reopened.append(batch("b", 6), leader_epoch=1,
                        producer=ProducerState(8, 0, 0)).result(10)
    assert len(values(reopened)) == 4
    retry = reopened.append(batch("a", 4), leader_epoch=1,  # the batch written: answered
                            producer=ProducerState(8, 0, 0)).result(10)
    assert (retry.base_offset, retry.last_offset) == (0, 3)
    reopened.close()


def test_a_retry_matches_a_remembered_batch_only_with_its_length(tmp_path):
    """As Kafka's broker finds a duplicate batch by its first and last sequence: a batch with
    a remembered batch's base sequence but more records is out of order, not that batch's
    retry (whose answer would tell the client its extra records were written)."""
    log = open_log(tmp_path, sequence_wait_ms=200)
    log.append(batch("a", 4), leader_epoch=0, producer=ProducerState(8, 0, 0)).result(10)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        log.append(batch("b", 6), leader_epoch=0, producer=ProducerState(8, 0, 0)).result(10)
    assert len(values(log)) == 4
    retry = log.append(batch("a", 4), leader_epoch=0, producer=ProducerState(8, 0, 0)).result(10)
    assert (retry.base_offset, retry.last_offset) == (0, 3)
    log.close()
