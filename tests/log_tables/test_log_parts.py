"""The parts a PartitionLog is made of, each on its own (no Delta table): the producer state,
the leader epochs and the tail cache."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pyarrow as pa
import pytest

from deltabus import errors
from deltabus.log_tables.appender import AppendResult
from deltabus.log_tables.leader_epochs import LeaderEpochCache, epoch_starts
from deltabus.log_tables.producer_state import ProducerStateManager
from deltabus.log_tables.tail_cache import TailCache, TailCacheBudget, read_cached
from deltabus.records import ProducerState


def _records(offsets: list[int], epochs: list[int] | None = None, pid: int = -1,
             seqs: list[int] | None = None) -> pa.Table:
    n = len(offsets)
    return pa.table({
        "offset": pa.array(offsets, pa.int64()),
        "leader_epoch": pa.array(epochs or [0] * n, pa.int32()),
        "producer_id": pa.array([pid] * n, pa.int64()),
        "producer_epoch": pa.array([0] * n, pa.int16()),
        "sequence": pa.array(seqs or [-1] * n, pa.int32()),
    })


def _manager(wait_ms: int = 10_000) -> tuple[ProducerStateManager, threading.Condition]:
    lock = threading.Condition()
    return ProducerStateManager("t-0", lock, lambda pid: [], lambda: -1, wait_ms), lock


def _take(manager: ProducerStateManager, producer: ProducerState, records: int,
          future: Future[AppendResult]) -> Future[AppendResult] | None:
    """What PartitionLog.append does with the producer state: wait for the turn, then take."""
    entry, duplicate = manager.await_turn(producer, records, lambda: False)
    if duplicate is not None:
        return duplicate
    entry.next_sequence = producer.base_sequence + records
    entry.remember(producer.base_sequence, records, future)
    return None


def test_a_retried_batch_gets_its_first_result_and_an_old_epoch_is_fenced() -> None:
    manager, lock = _manager()
    first: Future[AppendResult] = Future()
    with lock:
        assert _take(manager, ProducerState(7, 0, 0), 5, first) is None
        assert _take(manager, ProducerState(7, 0, 0), 5, Future()) is first
        assert _take(manager, ProducerState(7, 1, 0), 3, Future()) is None  # a new epoch
        with pytest.raises(errors.InvalidProducerEpochError):
            manager.await_turn(ProducerState(7, 0, 5), 1, lambda: False)


def test_a_batch_ahead_of_its_predecessor_waits_then_fails_out_of_order() -> None:
    manager, lock = _manager(wait_ms=50)
    with lock:
        _take(manager, ProducerState(3, 0, 0), 2, Future())
        with pytest.raises(errors.OutOfOrderSequenceNumberError):
            manager.await_turn(ProducerState(3, 0, 4), 1, lambda: False)  # 2 and 3 never came


def test_a_waiting_batch_goes_once_its_predecessor_is_taken() -> None:
    manager, lock = _manager()
    with lock:
        _take(manager, ProducerState(3, 0, 0), 1, Future())
    waiting = threading.Event()
    turns: list[int] = []

    def checked() -> bool:  # await_turn asks this just before it waits (its lock held)
        waiting.set()
        return False

    def later() -> None:
        with lock:
            entry, _ = manager.await_turn(ProducerState(3, 0, 2), 1, checked)
            turns.append(entry.next_sequence)

    waiter = threading.Thread(target=later)
    waiter.start()
    assert waiting.wait(60), "the batch ahead of its turn did not wait"
    with lock:  # the waiter released the lock to wait: sequence 1 comes now
        assert turns == []
        _take(manager, ProducerState(3, 0, 1), 1, Future())
        lock.notify_all()
    waiter.join()
    assert turns == [2]


def test_copied_records_answer_a_retry_with_the_old_leaders_offsets() -> None:
    manager, lock = _manager()
    with lock:
        manager.note_copied(_records([40, 41, 42], pid=9, seqs=[0, 1, 2]))
        retry = manager.await_turn(ProducerState(9, 0, 1), 2, lambda: False)[1]
        assert retry is not None and retry.result() == AppendResult(41, 42, -1, -1)
        manager.clear()  # forgotten, and nothing in the table to rebuild it from
        assert manager.await_turn(ProducerState(9, 0, 0), 1, lambda: False)[1] is None


def test_leader_epochs_answer_where_an_epoch_ends() -> None:
    epochs = LeaderEpochCache("t-0", [])
    assert epochs.end_offset_for(3, 0) == (-1, -1) and epochs.latest == -1
    epochs.assign(_records([0, 1, 2, 3, 4], epochs=[1, 1, 3, 3, 3]))
    epochs.assign(_records([5, 6], epochs=[2, 5]))  # an older epoch is refused (logged)
    assert epochs.latest == 5
    assert epochs.end_offset_for(1, 7) == (1, 2)
    assert epochs.end_offset_for(2, 7) == (1, 2)  # no epoch 2: the largest below it
    assert epochs.end_offset_for(4, 7) == (3, 6)
    assert epochs.end_offset_for(9, 7) == (5, 7)
    assert epochs.end_offset_for(0, 7) == (0, 0)  # older than all: the first epoch's start
    epochs.truncate_from(2)
    assert epochs.latest == 1 and epochs.end_offset_for(9, 2) == (1, 2)
    assert epoch_starts(_records([8, 9, 10], epochs=[4, 4, 6])) == [(4, 8), (6, 10)]


def test_the_tail_cache_keeps_the_newest_commits_and_truncates() -> None:
    commits = [_records(list(range(i * 10, i * 10 + 10))) for i in range(4)]
    cache = TailCache(bytes_max=commits[0].nbytes * 2)
    for table in commits:
        cache.append(table)
    held = cache.snapshot()
    assert [t.column("offset")[0].as_py() for t in held] == [20, 30]  # the newest two
    assert read_cached(held, 25, 35, 1 << 20).column("offset").to_pylist() == list(range(25, 35))
    cache.truncate(33)
    assert read_cached(cache.snapshot(), 20, 40, 1 << 20).column("offset").to_pylist() == list(
        range(20, 33))
    cache.clear()
    assert not cache


def test_the_tail_cache_finds_a_read_among_many_commits_and_misses_what_it_lost() -> None:
    """A log committing a record at a time caches thousands of commits: a read from any of
    them starts at the commit holding its offset, and one from before the cache (evicted,
    truncated) goes to the table instead (None)."""
    cache = TailCache(bytes_max=1 << 30)
    for i in range(0, 3000, 3):
        cache.append(_records([i, i + 1, i + 2]))
    assert cache.read(1501, 1505, 1 << 20).column("offset").to_pylist() == list(range(1501, 1505))
    assert cache.read(2998, 3000, 1 << 20).column("offset").to_pylist() == [2998, 2999]
    assert cache.read(0, 3000, 1 << 20).num_rows == 3000
    assert cache.read(100, 3000, 1).column("offset").to_pylist() == [100, 101]  # its commit
    assert cache.holds_from(2990, 1 << 20) and not cache.holds_from(0, 100)
    for _ in range(10):
        cache.drop_oldest()
    assert cache.read(29, 40, 1 << 20) is None
    assert cache.read(30, 33, 1 << 20).column("offset").to_pylist() == [30, 31, 32]
    cache.truncate(1000)
    assert cache.read(997, 1010, 1 << 20).column("offset").to_pylist() == [997, 998, 999]
    assert cache.holds_from(1000, 1 << 20)  # the log end: nothing past it to miss


def test_the_tail_caches_of_a_process_share_one_budget_coldest_first() -> None:
    """Thousands of partitions at 64 MiB of tail each would outgrow any broker: together they
    hold at most the budget, the partitions appended to least recently giving up theirs first,
    and each cache stays a suffix of its log."""
    commit = _records(list(range(10)))
    budget = TailCacheBudget(bytes_max=commit.nbytes * 5)
    caches = [TailCache(bytes_max=commit.nbytes * 100, budget=budget) for _ in range(3)]
    for cache in caches:  # cache 0 is the coldest
        for n in range(2):
            cache.append(_records(list(range(n * 10, n * 10 + 10))))
    assert budget.bytes_held == 5 * commit.nbytes
    assert [len(c.snapshot()) for c in caches] == [1, 2, 2]
    assert caches[0].snapshot()[0].column("offset")[0].as_py() == 10  # its newest is kept
    caches[1].append(_records(list(range(20, 30))))  # cache 0 goes, then cache 2 gives one
    assert [len(c.snapshot()) for c in caches] == [0, 3, 2]
    assert budget.bytes_held == 5 * commit.nbytes
    caches[1].clear()
    caches[2].truncate(15)
    assert budget.bytes_held == sum(t.nbytes for c in caches for t in c.snapshot())
    assert read_cached(caches[2].snapshot(), 0, 20, 1 << 20).column("offset").to_pylist() == \
        list(range(0, 15))
