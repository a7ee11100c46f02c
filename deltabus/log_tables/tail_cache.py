"""A log's most recent commits in memory, so tail fetches never read Parquet, and the bytes all
of a process's logs may keep there together.

Each log keeps up to `log_cache_bytes_max` (64 MiB) of its newest commits. With thousands of
partitions a broker could then hold hundreds of gigabytes, so every cache of a process also
draws on one `TailCacheBudget` of `log_cache_total_bytes_max`: past it, the caches appended to
least recently give up their oldest commits first (a cold partition's tail is read from Parquet
again, as any older range is). Kafka leaves this to the page cache; a Python broker has to
bound it itself.

What must hold: a cache is always a suffix of its log (a commit that does not continue it
empties it, and eviction only ever drops its oldest commit), and the budget's count is the sum
of what the caches hold. A cache's own lock is a leaf: nothing else is taken while it is held,
so the budget may evict from any cache while another is appended to.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import threading

import numpy as np
import pyarrow as pa

from deltabus.records import LOG_SCHEMA


class TailCacheBudget:
    """The bytes every tail cache of a process may hold together. Thread-safe."""

    def __init__(self, bytes_max: int) -> None:
        if bytes_max < 0:
            raise ValueError(f"log.cache.total.bytes.max must not be negative, not {bytes_max}")
        self.bytes_max = bytes_max
        self._lock = threading.Lock()
        self._caches: collections.OrderedDict[TailCache, None] = collections.OrderedDict()
        self._bytes = 0

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return self._bytes

    def grow(self, bytes_max: int) -> None:
        """Allow at least `bytes_max` (a config asking for more than the budget has)."""
        with self._lock:
            self.bytes_max = max(self.bytes_max, bytes_max)

    def charge(self, cache: TailCache, delta: int, *, appended: bool) -> None:
        """`cache` now holds `delta` bytes more (or fewer); an append makes it the most recently
        used. Evicts the oldest commits of the least recently appended caches while the budget
        is exceeded."""
        with self._lock:
            self._bytes += delta
            if appended:
                self._caches[cache] = None
                self._caches.move_to_end(cache)
            elif not cache:
                self._caches.pop(cache, None)
            while self._bytes > self.bytes_max and self._caches:
                coldest = next(iter(self._caches))
                freed = coldest.drop_oldest()
                self._bytes -= freed
                if not freed or not coldest:
                    del self._caches[coldest]


class TailCache:
    """A log's most recent commits, up to `bytes_max` (at least the last commit while the budget
    allows it). Its mutations come from its log's lock holder; `drop_oldest` from the budget."""

    def __init__(self, bytes_max: int, budget: TailCacheBudget | None = None) -> None:
        self._bytes_max = bytes_max
        self._budget = budget
        self._lock = threading.Lock()
        self._tables: collections.deque[pa.Table] = collections.deque()
        # Each cached commit's first offset, so a read finds its commit by bisection: a log
        # committing a record at a time caches tens of thousands of commits.
        self._firsts: collections.deque[int] = collections.deque()
        self._bytes = 0

    def __bool__(self) -> bool:
        return bool(self._tables)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def append(self, table: pa.Table) -> None:
        with self._lock:
            before = self._bytes
            self._tables.append(table)
            self._firsts.append(int(table.column("offset")[0].as_py()))
            self._bytes += table.nbytes
            while self._bytes > self._bytes_max and len(self._tables) > 1:
                self._bytes -= self._pop_oldest()
            delta = self._bytes - before
        self._charge(delta, appended=True)

    def clear(self) -> None:
        with self._lock:
            delta = -self._bytes
            self._tables.clear()
            self._firsts.clear()
            self._bytes = 0
        self._charge(delta, appended=False)

    def truncate(self, offset: int) -> None:
        """Drop the records at or after `offset`."""
        with self._lock:
            before = self._bytes
            kept: collections.deque[pa.Table] = collections.deque()
            for table in self._tables:
                below = int(np.searchsorted(table.column("offset").to_numpy(), offset))
                if below:
                    kept.append(table.slice(0, below))
            self._tables = kept
            self._firsts = collections.deque(int(t.column("offset")[0].as_py()) for t in kept)
            self._bytes = sum(t.nbytes for t in kept)
            delta = self._bytes - before
        self._charge(delta, appended=False)

    def drop_oldest(self) -> int:
        """Give up the oldest commit for the budget; returns the bytes freed (0: none held)."""
        with self._lock:
            if not self._tables:
                return 0
            freed = self._pop_oldest()
            self._bytes -= freed
            return freed

    def _pop_oldest(self) -> int:
        self._firsts.popleft()
        return self._tables.popleft().nbytes

    def read(self, offset: int, end: int, max_bytes: int) -> pa.Table | None:
        """Records [offset, end), about `max_bytes` of them, as `read_cached`; None when the
        cache does not reach back to `offset`. Finds the first commit by bisection and takes
        only the commits the read needs, so a tail read costs the same however many commits
        the cache holds."""
        with self._lock:
            if not self._firsts or self._firsts[0] > offset:
                return None
            first = bisect.bisect_right(self._firsts, offset) - 1
            needed, size = [], 0
            for table in itertools.islice(self._tables, first, None):
                needed.append(table)
                size += table.nbytes
                if size >= max_bytes:
                    break
        return read_cached(needed, offset, end, max_bytes)

    def holds_from(self, offset: int, max_bytes: int) -> bool:
        """Whether the cache holds the log from `offset` to its end in fewer than `max_bytes`
        (about: whole commits). Looks at the newest commits only, back to `offset` or to
        `max_bytes`."""
        with self._lock:
            held = 0
            for first, table in zip(reversed(self._firsts), reversed(self._tables),
                                    strict=True):
                if table.column("offset")[-1].as_py() < offset:  # newer ones hold it all
                    return True
                held += table.nbytes
                if held >= max_bytes:
                    return False
                if first <= offset:
                    return True
            return False

    def snapshot(self) -> list[pa.Table]:
        """The cached commits now, to read outside the lock (tables never change)."""
        with self._lock:
            return list(self._tables)

    def _charge(self, delta: int, *, appended: bool) -> None:
        if self._budget is not None and (delta or appended):
            self._budget.charge(self, delta, appended=appended)


def read_cached(cache: list[pa.Table], offset: int, end: int, max_bytes: int) -> pa.Table:
    """Records [offset, end) of a `TailCache.snapshot`, about `max_bytes` of them."""
    parts: list[pa.Table] = []
    size = 0
    for table in cache:
        offsets = table.column("offset").to_numpy()
        if offsets[-1] < offset:
            continue
        lo, hi = np.searchsorted(offsets, [offset, end])  # copies may have gaps
        if hi <= lo:
            break
        part = table.slice(int(lo), int(hi - lo))
        parts.append(part)
        size += part.nbytes
        if size >= max_bytes or offsets[-1] + 1 >= end:
            break
    # a typed topic's commits may hold its values in several versions' struct types: unified
    return (pa.concat_tables(parts, promote_options="permissive") if parts
            else LOG_SCHEMA.empty_table())


_shared: TailCacheBudget | None = None
_shared_lock = threading.Lock()


def shared_budget(bytes_max: int) -> TailCacheBudget:
    """The process's budget (a broker's logs, a catch-up task's, a test's), allowing at least
    `bytes_max`."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TailCacheBudget(bytes_max)
        else:
            _shared.grow(bytes_max)
        return _shared
