"""Kafka's delayed fetch (DelayedFetch in its fetch purgatory): a fetch that did not find
min_bytes waits for an append to one of its partitions, or for its max wait, with no thread of
its own meanwhile. A broker's ReplicaManager.fetch_delayed hands one in; the doors await its
future.

How it waits: the fetch is watched under each of its partitions (`FetchPurgatory.watch`). When a
partition's log changes, `check(key)` asks each fetch watching it a cheap question (`has_news`:
did the high watermark, or a follower's log end, pass its offset? did its leader go away?) on the
thread that changed the log; only a fetch with news is read again (`try_complete`), on one of a
few completion threads, and completed if the read is enough. One expiration thread (Kafka's
ExpirationReaper) hands fetches whose max wait passed to the completion threads for a last read
(`on_expiration`). So waiting fetches cost memory, not threads: threads are the reaper and at
most `completion_threads_max`, however many fetches wait.

What must stay true: each future completes exactly once, by its deadline give or take a read,
or when the purgatory stops (with the fetch's `on_stop` answer, read no more); an append after a
fetch's first read and before it was watched is seen (`watch` checks once more after watching);
a check arriving while a read runs leads to one more read, never to a lost wake-up.
Runs on executors (in brokers) and in test fakes; thread-safe.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from deltabus.cluster.handler import FetchResult

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]
# The reaper rebuilds its heap without completed fetches once it holds this many.
PURGE_FETCHES_MIN = 1_000


@dataclass(frozen=True)
class DelayedFetch:
    """A fetch waiting for records: what the purgatory needs to know about it.

    `keys`: the partitions whose changes may complete it; `deadline_s`: its max wait's end
    (time.monotonic()); `has_news()`: a cheap test, run on the thread that changed a log, of
    whether reading again may help; `try_complete()`: the read again, the answer if it is
    enough, else None; `on_expiration()`: the answer at the deadline; `on_stop()`: the answer
    when the broker stops (no read)."""

    keys: Collection[PartitionKey]
    deadline_s: float
    has_news: Callable[[], bool]
    try_complete: Callable[[], list[FetchResult] | None]
    on_expiration: Callable[[], list[FetchResult]]
    on_stop: Callable[[], list[FetchResult]]


class _Waiter:
    __slots__ = ("fetch", "future", "lock", "done", "reading", "read_again")

    def __init__(self, fetch: DelayedFetch) -> None:
        self.fetch = fetch
        self.future: Future[list[FetchResult]] = Future()
        self.lock = threading.Lock()
        self.done = False
        self.reading = False  # a try_complete is queued or running
        self.read_again = False  # news came while it was


class FetchPurgatory:
    """Fetches waiting for appends or their deadlines. Thread-safe."""

    def __init__(self, name: str, completion_threads_max: int) -> None:
        self._name = name
        self._lock = threading.Condition()
        self._watchers: dict[PartitionKey, set[_Waiter]] = {}
        self._heap: list[tuple[float, int, _Waiter]] = []
        self._order = itertools.count()
        self._purge_at = PURGE_FETCHES_MIN
        self._waiting = 0
        self._stopped = False
        self._pool = ThreadPoolExecutor(max_workers=completion_threads_max,
                                        thread_name_prefix=f"{name}-completion")
        self._reaper = threading.Thread(target=self._expire_loop, name=f"{name}-reaper",
                                        daemon=True)
        self._reaper.start()

    def waiting(self) -> int:
        """Fetches watched and not yet completed."""
        with self._lock:
            return self._waiting

    def watch(self, fetch: DelayedFetch) -> Future[list[FetchResult]]:
        """Wait for `fetch`: its future completes with its answer (see the module docstring).
        After `stop`, it completes at once with `on_stop()`."""
        waiter = _Waiter(fetch)
        with self._lock:
            stopped = self._stopped
            if not stopped:
                for key in fetch.keys:
                    self._watchers.setdefault(key, set()).add(waiter)
                if len(self._heap) >= self._purge_at:
                    self._purge()
                heapq.heappush(self._heap, (fetch.deadline_s, next(self._order), waiter))
                self._waiting += 1
                if self._heap[0][2] is waiter:
                    self._lock.notify_all()
        if stopped:  # never watched, so never counted as waiting
            waiter.done = True
            try:
                waiter.future.set_result(fetch.on_stop())
            except Exception as e:  # a bug: the door answers with a failure
                waiter.future.set_exception(e)
        else:
            self._check(waiter)  # an append may have come between the first read and now
        return waiter.future

    def check(self, key: PartitionKey) -> None:
        """`key`'s log changed (on the thread that changed it: must not block): the fetches
        watching it with news are read again on the completion threads."""
        with self._lock:
            waiters = list(self._watchers.get(key, ()))
        for waiter in waiters:
            self._check(waiter)

    def stop(self) -> None:
        """Complete every waiting fetch at once with its `on_stop()` answer; no more waits."""
        with self._lock:
            self._stopped = True
            waiters = [w for _, _, w in self._heap]
            self._heap = []
            self._lock.notify_all()
        for waiter in waiters:
            self._complete(waiter, waiter.fetch.on_stop)
        self._pool.shutdown(wait=False)

    def _check(self, waiter: _Waiter) -> None:
        try:
            news = waiter.fetch.has_news()
        except Exception:  # a bug: read again, and the read says what is wrong
            log.exception("%s: a delayed fetch's check failed", self._name)
            news = True
        if not news:
            return
        with waiter.lock:
            if waiter.done:
                return
            if waiter.reading:
                waiter.read_again = True
                return
            waiter.reading = True
        self._submit(self._read, waiter)

    def _read(self, waiter: _Waiter) -> None:
        """On a completion thread: read again until the answer is enough, or no news came
        meanwhile."""
        while True:
            with waiter.lock:
                if waiter.done:
                    return
                waiter.read_again = False
            try:
                results = waiter.fetch.try_complete()
            except Exception as e:  # a bug: the door answers with a failure, the log says why
                log.exception("%s: a delayed fetch's read failed", self._name)
                self._fail(waiter, e)
                return
            if results is not None:
                self._resolve(waiter, results)
                return
            with waiter.lock:
                if not waiter.read_again:
                    waiter.reading = False
                    return

    def _expire(self, waiter: _Waiter) -> None:
        """On a completion thread: the fetch's max wait passed."""
        self._complete(waiter, waiter.fetch.on_expiration)

    def _complete(self, waiter: _Waiter, answer: Callable[[], list[FetchResult]]) -> None:
        if waiter.done:
            return
        try:
            results = answer()
        except Exception as e:  # a bug: the door answers with a failure, the log says why
            log.exception("%s: a delayed fetch's answer failed", self._name)
            self._fail(waiter, e)
            return
        self._resolve(waiter, results)

    def _resolve(self, waiter: _Waiter, results: list[FetchResult]) -> None:
        if self._finish(waiter):
            waiter.future.set_result(results)

    def _fail(self, waiter: _Waiter, error: Exception) -> None:
        if self._finish(waiter):
            waiter.future.set_exception(error)

    def _finish(self, waiter: _Waiter) -> bool:
        """Mark `waiter` done and stop watching it; False if it already was."""
        with waiter.lock:
            if waiter.done:
                return False
            waiter.done = True
        with self._lock:
            self._waiting -= 1
            for key in waiter.fetch.keys:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(waiter)
                    if not watchers:
                        del self._watchers[key]
        return True

    def _submit(self, work: Callable[[_Waiter], None], waiter: _Waiter) -> None:
        try:
            self._pool.submit(work, waiter)
        except RuntimeError:  # stopped meanwhile: answered as `stop` answers
            self._complete(waiter, waiter.fetch.on_stop)

    def _purge(self) -> None:
        """Drop completed fetches from the heap (lock held), so fetches answered early do not
        stay until their deadlines."""
        self._heap = [entry for entry in self._heap if not entry[2].done]
        heapq.heapify(self._heap)
        self._purge_at = max(PURGE_FETCHES_MIN, 2 * len(self._heap))

    def _expire_loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopped and (
                        not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._lock.wait(wait)
                if self._stopped:
                    return
                _, _, waiter = heapq.heappop(self._heap)
            if not waiter.done:
                self._submit(self._expire, waiter)
