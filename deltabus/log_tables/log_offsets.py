"""A partition log's offsets and who waits on its high watermark: Kafka's LogOffsetSnapshot, and
the purgatory where acks=all produce requests wait (DelayedProduce) and long-polls sleep.

Separate from the log (partition_log.py) because these few numbers are what every other part
reads or moves: the commit round (commit_round.py) moves them as commits land, the reader
raises the log start offset as the cleaner removes files, and the broker's Partition, which
knows the ISR, advances the high watermark. Holding them in one small object lets those parts
be handed it instead of the whole log.

Invariants: neither the high watermark nor the log start offset passes the log end offset, and
raising the log start raises the high watermark with it; the high watermark moves back only
with the log end offset (a truncation, a reload after a failed commit); a waiter is resolved,
outside the lock, once the high watermark passes its offset, or failed when the log loses
leadership or closes.

Not locked itself: the log's lock (a Condition) guards every change, and `wait_for_data` waits
on it. The offsets are single int stores, read without the lock where the log says so.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from deltabus import errors, trace


class LogOffsets:
    """The log start offset, log end offset, high watermark and committed version of one
    replica's log, and the futures waiting on its high watermark. Runs on executors."""

    def __init__(self, lock: threading.Condition, *, topic: str, partition: int,
                 version: int, log_start_offset: int, log_end_offset: int,
                 high_watermark: int, on_append: Callable[[], None] | None,
                 traced: bool) -> None:
        """`lock` is the log's. `on_append` runs after every change of the log end offset or
        high watermark (`after_change`)."""
        self.topic = topic
        self.partition = partition
        self._lock = lock
        self._on_append = on_append
        self._traced = traced
        self.version = version  # the last committed version
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.high_watermark = high_watermark
        self._hw_waiters: list[tuple[int, int, Future[int]]] = []  # heap: (offset, id, future)

    def await_high_watermark(self, offset: int) -> Future[int]:
        """A future resolved (with the high watermark) once the high watermark passes `offset`:
        acks=all waits on it. It fails when the log closes or `fail_waiters` is called."""
        future: Future[int] = Future()
        with self._lock:
            if self.high_watermark > offset:
                future.set_result(self.high_watermark)
            else:
                heapq.heappush(self._hw_waiters, (offset, id(future), future))
        return future

    def fail_waiters(self, error: errors.DeltaBusError) -> None:
        """Fail every high-watermark waiter (the broker lost leadership: acks=all cannot be
        promised any more)."""
        with self._lock:
            waiters, self._hw_waiters = self._hw_waiters, []
        for _, _, future in waiters:
            future.set_exception(error)

    def set_high_watermark(self, offset: int) -> list[Future[int]]:
        """Lock held. Returns the waiters now satisfied (resolved outside the lock)."""
        offset = min(offset, self.log_end_offset)
        if offset <= self.high_watermark:
            return []
        if self._traced:
            trace.stamp("hw", self.topic, self.partition, self.high_watermark, offset - 1,
                        moved=trace.now_ns())
        self.high_watermark = offset
        self._lock.notify_all()
        ready = []
        while self._hw_waiters and self._hw_waiters[0][0] < offset:
            ready.append(heapq.heappop(self._hw_waiters)[2])
        return ready

    def after_change(self, ready: list[Future[int]]) -> None:
        """Lock not held: tell the owner (`on_append`), then resolve the waiters `ready`."""
        if self._on_append is not None:
            self._on_append()
        for future in ready:
            future.set_result(self.high_watermark)

    def raise_log_start(self, offset: int) -> None:
        """Move the log start offset up to `offset` (never down, never past the log end). Called
        by the reader with its lock held, so it takes no other lock: single int stores."""
        offset = min(offset, self.log_end_offset)
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            if self.high_watermark < offset:
                self.high_watermark = offset

    def wait_for_data(self, offset: int, timeout_s: float, closed: Callable[[], bool]) -> bool:
        """Block until the high watermark passes `offset`, the log closes (`closed()`), or the
        time is up."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self.high_watermark <= offset and not closed():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return self.high_watermark > offset
