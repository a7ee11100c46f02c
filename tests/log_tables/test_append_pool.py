"""The append pool: a few threads commit any number of partition logs, each log's commits one at
a time and in order (append_pool.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa

from deltabus.config import LogConfig
from deltabus.log_tables.append_pool import AppendPool
from deltabus.log_tables.partition_log import PartitionLog
from tests.conftest import wait_until


def test_a_log_never_has_two_rounds_at_once_and_a_round_asked_meanwhile_runs_after() -> None:
    pool = AppendPool(4, name="test-pool")
    inside, most, runs = [0], [0], []
    lock = threading.Lock()
    release = threading.Event()

    def round_() -> float | None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        release.wait()
        runs.append(time.monotonic())
        with lock:
            inside[0] -= 1
        return None

    pool.schedule("log", round_, 0.0)
    wait_until(lambda: inside[0] == 1, "the first round to start")
    for _ in range(10):  # asked while it runs: one more round, after it, on another thread
        pool.schedule("log", round_, 0.0)
    release.set()
    wait_until(lambda: len(runs) == 2, "the round asked for meanwhile")
    assert most[0] == 1


def test_rounds_wait_for_their_time_and_an_earlier_time_moves_them_up() -> None:
    pool = AppendPool(2, name="test-pool")
    ran = threading.Event()
    pool.schedule("log", lambda: ran.set(), time.monotonic() + 3600)
    assert not ran.wait(0.2)  # an hour from now
    pool.schedule("log", lambda: ran.set(), time.monotonic())
    assert ran.wait(30)


def test_one_idle_thread_times_the_next_round_and_an_earlier_one_is_not_missed() -> None:
    pool = AppendPool(8, name="test-pool")
    later, sooner, now_ = threading.Event(), threading.Event(), threading.Event()
    pool.schedule("later", lambda: later.set(), time.monotonic() + 3600)
    time.sleep(0.1)  # the idle threads settle: one of them times the round an hour away
    pool.schedule("sooner", lambda: sooner.set(), time.monotonic() + 0.3)
    assert sooner.wait(30) and not later.is_set()
    pool.schedule("now", lambda: now_.set(), 0.0)
    assert now_.wait(30)
    with pool._lock:  # noqa: SLF001 - the pool's state between rounds
        assert pool._timer  # noqa: SLF001 - a thread times the round an hour away


def test_a_round_that_raises_is_tried_again_and_the_pool_goes_on() -> None:
    pool = AppendPool(1, name="test-pool")
    calls: list[int] = []

    def flaky() -> float | None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("storage hiccup")
        return None

    pool.schedule("flaky", flaky, 0.0)
    wait_until(lambda: len(calls) == 2, "the failed round to be tried again")
    other = threading.Event()
    pool.schedule("other", lambda: other.set(), 0.0)
    assert other.wait(30)


def test_many_logs_commit_on_a_few_threads(tmp_path: Path) -> None:
    """A thread per log grew a broker's threads with its partitions; the pool's do not."""
    config = LogConfig(group_commit_linger_ms=5, append_threads=4)
    before = threading.active_count()
    logs = [PartitionLog(str(tmp_path / f"p{i}"), topic="t", partition=i, config=config)
            for i in range(60)]
    try:
        futures = [log.append(pa.table({"value": [f"{i}-{n}".encode() for n in range(3)]}),
                              leader_epoch=0) for i, log in enumerate(logs) for _ in range(2)]
        results = [f.result(60) for f in futures]
        assert threading.active_count() - before <= 4  # the pool's, at most
    finally:
        for log in logs:
            log.close()
    for i, log in enumerate(logs):
        assert log.log_end_offset == 6
        assert sorted((r.base_offset, r.last_offset) for r in results[2 * i:2 * i + 2]) == [
            (0, 2), (3, 5)]
