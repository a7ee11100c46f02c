"""Kafka's delayed operations for the Kafka door: a request whose answer waits for something
other than its handler (a Produce for its acks, a JoinGroup or SyncGroup for the rest of the
group, a Fetch for records: the broker's delayed fetch) returns a `DelayedResponse`, and the
`Purgatory` completes it when what it waits for is done or its deadline passes, with no thread
waiting for it meanwhile (Kafka's DelayedOperationPurgatory, DelayedProduce, DelayedJoin,
DelayedFetch).

What must stay true: each delayed response completes exactly once, on a request handler thread,
as soon as its last future is done or at its deadline, whichever comes first; a future's
callback (which runs on whatever thread finished the future, sometimes under its lock) only
counts and queues, never blocks.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from deltabus import errors

log = logging.getLogger(__name__)

# The purgatory rebuilds its heap without the completed operations once it holds this many.
PURGE_OPERATIONS_MIN = 1_000


@dataclass(frozen=True)
class DelayedResponse:
    """An answer that waits for `waiting_on`: `complete()` builds it once they are all done or
    at `deadline_s` (time.monotonic()), whichever is first; it reads them with `result_of`."""

    waiting_on: Sequence[Future[Any]]
    deadline_s: float
    complete: Callable[[], Any]


def result_of(future: Future[Any], timeout_s: float, what: str) -> Any:
    """A done future's result (its exception raised), or REQUEST_TIMED_OUT if it is not done:
    its delayed response's deadline (`timeout_s` after the request) passed first."""
    if not future.done():
        raise errors.RequestTimedOutError(f"{what} did not complete in {timeout_s:.0f} s")
    return future.result()


class _Operation:
    __slots__ = ("ready", "waiting", "completed", "lock")

    def __init__(self, delayed: DelayedResponse, ready: Callable[[], None]) -> None:
        self.ready = ready
        self.waiting = len(delayed.waiting_on)
        self.completed = False
        self.lock = threading.Lock()

    def one_done(self, _: Future[Any]) -> None:
        with self.lock:
            self.waiting -= 1
            ready = self.waiting <= 0 and not self.completed
            self.completed = self.completed or ready
        if ready:
            self.ready()

    def expire(self) -> None:
        with self.lock:
            ready, self.completed = not self.completed, True
        if ready:
            self.ready()


class Purgatory:
    """Delayed responses waiting for their futures or deadlines. Thread-safe; one expiration
    thread (Kafka's ExpirationReaper) completes those whose deadline passed."""

    def __init__(self, name: str) -> None:
        self._heap: list[tuple[float, int, _Operation]] = []
        self._order = itertools.count()
        self._purge_at = PURGE_OPERATIONS_MIN
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._expire_loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def held(self) -> int:
        """Delayed responses the purgatory holds (completed ones too, until purged)."""
        with self._changed:
            return len(self._heap)

    def watch(self, delayed: DelayedResponse, ready: Callable[[], None]) -> None:
        """Call `ready()` once, when `delayed`'s futures are done or at its deadline, from
        whichever thread saw it first; it must return at once (it queues `delayed.complete`
        for a handler thread)."""
        operation = _Operation(delayed, ready)
        with self._changed:
            if len(self._heap) >= self._purge_at:
                self._purge()
            heapq.heappush(self._heap, (delayed.deadline_s, next(self._order), operation))
            if self._heap[0][2] is operation:
                self._changed.notify_all()
        if not delayed.waiting_on:
            operation.expire()
        for future in delayed.waiting_on:
            future.add_done_callback(operation.one_done)

    def _purge(self) -> None:
        """Drop completed operations, so a busy producer's completed Produces do not stay in
        the heap until their deadlines (called with the lock held)."""
        self._heap = [entry for entry in self._heap if not entry[2].completed]
        heapq.heapify(self._heap)
        self._purge_at = max(PURGE_OPERATIONS_MIN, 2 * len(self._heap))

    def _expire_loop(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and (
                        not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._changed.wait(wait)
                if self._stopped:
                    return
                _, _, operation = heapq.heappop(self._heap)
            operation.expire()
