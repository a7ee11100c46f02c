"""The fetch purgatory (issue 17): a waiting fetch holds no thread; it completes when a check of
one of its partitions finds news and its read is enough, or at its deadline and not before, or
at once when the purgatory stops; a check that arrives while a read runs leads to one more read.
No Spark, no broker: the fetches here are test doubles."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from deltabus.cluster.delayed_fetch import DelayedFetch, FetchPurgatory
from deltabus.cluster.handler import FetchResult

WAIT_S = 10.0  # how long a test waits for what must happen
KEY = ("t", 0)
COMPLETION_THREADS = 2


@pytest.fixture
def purgatory() -> Iterator[FetchPurgatory]:
    p = FetchPurgatory("test-delayed-fetch", completion_threads_max=COMPLETION_THREADS)
    yield p
    p.stop()


class Log:
    """A partition's log end, as far as a waiting fetch of it cares."""

    def __init__(self) -> None:
        self.end = 0
        self.reads = 0

    def fetch(self, offset: int, deadline_s: float, min_records: int = 1) -> DelayedFetch:
        def read() -> list[FetchResult]:
            self.reads += 1
            return [FetchResult(*KEY, high_watermark=self.end)]

        def read_if_enough() -> list[FetchResult] | None:
            results = read()
            return results if self.end - offset >= min_records else None

        return DelayedFetch(keys={KEY}, deadline_s=deadline_s,
                            has_news=lambda: self.end > offset, try_complete=read_if_enough,
                            on_expiration=read, on_stop=lambda: [FetchResult(*KEY)])


def test_a_fetch_completes_when_a_check_finds_enough(purgatory: FetchPurgatory) -> None:
    log = Log()
    future = purgatory.watch(log.fetch(0, time.monotonic() + 60, min_records=2))
    purgatory.check(KEY)  # no news: not even read
    assert log.reads == 0 and not future.done()
    log.end = 1
    purgatory.check(KEY)  # news, but not enough: read, still waiting
    time.sleep(0.2)
    assert not future.done() and purgatory.waiting() == 1
    purgatory.check(("t", 1))  # another partition: nothing happens
    log.end = 2
    purgatory.check(KEY)
    assert future.result(WAIT_S)[0].high_watermark == 2
    assert purgatory.waiting() == 0


def test_an_append_before_the_watch_is_seen(purgatory: FetchPurgatory) -> None:
    """The records came between the fetch's first read and its watch: it does not wait."""
    log = Log()
    log.end = 1
    future = purgatory.watch(log.fetch(0, time.monotonic() + 60))
    assert future.result(WAIT_S)[0].high_watermark == 1


def test_a_fetch_completes_at_its_deadline_and_not_before(purgatory: FetchPurgatory) -> None:
    log = Log()
    deadline = time.monotonic() + 0.3
    future = purgatory.watch(log.fetch(0, deadline))
    assert future.result(WAIT_S)[0].high_watermark == 0
    assert time.monotonic() >= deadline
    assert purgatory.waiting() == 0


def test_stopping_answers_every_fetch_at_once(purgatory: FetchPurgatory) -> None:
    log = Log()
    futures = [purgatory.watch(log.fetch(0, time.monotonic() + 60)) for _ in range(10)]
    purgatory.stop()
    assert all(f.result(WAIT_S) == [FetchResult(*KEY)] for f in futures)
    late = purgatory.watch(log.fetch(0, time.monotonic() + 60))
    assert late.result(WAIT_S) == [FetchResult(*KEY)]
    assert purgatory.waiting() == 0


def test_news_during_a_read_leads_to_one_more_read(purgatory: FetchPurgatory) -> None:
    """The first read is not enough and, while it runs, the records that are arrive: the check
    they bring is not lost."""
    reading, release = threading.Event(), threading.Event()
    end = [1]

    def slow_read() -> list[FetchResult] | None:
        enough = end[0] >= 2
        reading.set()
        release.wait(WAIT_S)
        return [FetchResult(*KEY, high_watermark=end[0])] if enough else None

    future = purgatory.watch(DelayedFetch(
        keys={KEY}, deadline_s=time.monotonic() + 60, has_news=lambda: True,
        try_complete=slow_read, on_expiration=lambda: [], on_stop=lambda: []))
    assert reading.wait(WAIT_S)  # the watch's own check: reading, with end 1
    end[0] = 2
    purgatory.check(KEY)  # arrives during the read
    release.set()
    assert future.result(WAIT_S)[0].high_watermark == 2


def test_a_thousand_waiting_fetches_hold_no_threads(purgatory: FetchPurgatory) -> None:
    before = threading.active_count()
    log = Log()
    futures = [purgatory.watch(log.fetch(0, time.monotonic() + 60)) for _ in range(1_000)]
    assert purgatory.waiting() == 1_000
    log.end = 1
    purgatory.check(KEY)
    assert all(f.result(WAIT_S)[0].high_watermark == 1 for f in futures)
    assert threading.active_count() - before <= COMPLETION_THREADS
