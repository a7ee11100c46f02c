"""The commit threads of a process's partition logs: a few threads for any number of logs.

A thread per log made a broker's thread count grow with its partitions (4,000 partitions, 4,000
threads, most asleep). Kafka writes its logs from a fixed pool of request handler threads
(`num.io.threads`); deltabus's Delta commits are I/O waits as well, so a fixed pool of
`log.append.threads` serves every log of the process, the way Kafka's do.

A log asks for a round (`schedule`) when work is queued, at the time its group commit may go
(after its linger, or at once). A round (the log's `CommitRound.run`, commit_round.py) takes what
is ready, commits it, and says when it wants the next round, or None when its queue is empty.
What must hold:
- At most one round of a log runs at a time: its commits stay in order, and a log is never
  committed by two threads at once.
- A round asked for while one runs is not lost: it runs after it.
- A round is never run before its time, and an earlier time asked for moves it up.
- A round that raises is logged and tried again a second later; the pool's threads never die.

Idle threads do not all wait for the earliest round's time: one does (the timer), the others
until told. With every idle thread timing the same round, each round woke them all, and all
but one went back to sleep: thousands of logs' rounds a second made a broker's CPU mostly
wake-ups (bench step (p)). A round due at once wakes one thread; one due before the round the
timer waits for wakes them all, so the timer sees it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

Round = Callable[[], float | None]  # returns when (time.monotonic) it wants to run again
RETRY_AFTER_FAILURE_S = 1.0


class AppendPool:
    """Runs the commit rounds of many logs on `threads` daemon threads."""

    def __init__(self, threads: int, name: str = "log-append") -> None:
        if threads < 1:
            raise ValueError(f"log.append.threads must be at least 1, not {threads}")
        self._name = name
        self._lock = threading.Condition()
        self._due: dict[Hashable, tuple[float, Round]] = {}  # queued: when, and what
        self._heap: list[tuple[float, int, Hashable]] = []  # (when, tie-break, key); stale ok
        self._running: set[Hashable] = set()
        self._again: dict[Hashable, tuple[float, Round]] = {}  # asked for while running
        self._order = itertools.count()
        self._timer = False  # an idle thread waits for the earliest round's time
        self._threads: list[threading.Thread] = []
        self.grow(threads)

    @property
    def threads(self) -> int:
        return len(self._threads)

    def grow(self, threads: int) -> None:
        """Have at least `threads` threads (a config asking for more than the pool has)."""
        with self._lock:
            while len(self._threads) < threads:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()

    def schedule(self, key: Hashable, round_: Round, at: float) -> None:
        """Run `round_` for `key` at `at` (time.monotonic) or earlier if already asked."""
        with self._lock:
            if key in self._running:
                again = self._again.get(key)
                if again is None or at < again[0]:
                    self._again[key] = (at, round_)
                return
            queued = self._due.get(key)
            if queued is not None and queued[0] <= at:
                return
            self._push(key, round_, at)

    def _push(self, key: Hashable, round_: Round, at: float) -> None:
        """Lock held. Wakes a thread unless the timer already waits for an earlier round."""
        earliest = not self._heap or at < self._heap[0][0]
        self._due[key] = (at, round_)
        heapq.heappush(self._heap, (at, next(self._order), key))
        if not self._timer or at <= time.monotonic():  # whoever wakes takes a due round
            self._lock.notify()
        elif earliest:
            self._lock.notify_all()  # the timer waits for a later time

    def _next(self) -> tuple[Hashable, Round]:
        """Wait for the earliest round whose time has come; mark it running."""
        with self._lock:
            while True:
                while self._heap and self._stale(self._heap[0]):
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._lock.wait()
                    continue
                at, _, key = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    if self._timer:  # another idle thread waits for it
                        self._lock.wait()
                        continue
                    self._timer = True
                    try:
                        self._lock.wait(wait)
                    finally:
                        self._timer = False
                    continue
                heapq.heappop(self._heap)
                _, round_ = self._due.pop(key)
                self._running.add(key)
                if self._heap:  # another thread may take the next one
                    self._lock.notify()
                return key, round_

    def _stale(self, entry: tuple[float, int, Hashable]) -> bool:
        queued = self._due.get(entry[2])
        return queued is None or queued[0] != entry[0]

    def _work(self) -> None:
        while True:
            key, round_ = self._next()
            try:
                at = round_()
            except Exception:  # noqa: BLE001 - a pool thread must outlive any round
                log.exception("a commit round of %s failed; trying again", key)
                at = time.monotonic() + RETRY_AFTER_FAILURE_S
            with self._lock:
                self._running.discard(key)
                again = self._again.pop(key, None)
                if again is not None and (at is None or again[0] < at):
                    self._push(key, again[1], again[0])
                elif at is not None:
                    self._push(key, round_, at)


_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def process_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """The process's pool `name`, started on first use and shared by every log: threads for
    the logs' work beside their commit rounds (checkpoints, a follower's file copies)."""
    with _pools_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(threads, thread_name_prefix=name)
        return _pools[name]


_shared: AppendPool | None = None
_shared_lock = threading.Lock()


def shared_pool(threads: int) -> AppendPool:
    """The process's pool (a broker's logs, a catch-up task's, a test's), with at least
    `threads` threads."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = AppendPool(threads)
        else:
            _shared.grow(threads)
        return _shared
