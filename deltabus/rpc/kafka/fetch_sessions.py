"""Kafka's incremental fetch sessions (KIP-227), for one Kafka listener.

A consumer fetching many partitions over and over names them all, and gets them all back, in
every Fetch unless it has a session: then the broker remembers the partitions and their fetch
offsets, the consumer sends only what changed (partitions added, moved on or forgotten), and the
answer carries only partitions with records or news (a new high watermark or log start offset,
an error). kafka-python and Kafka's Java clients use them; librdkafka fetches without one.

A request's (session id, epoch) says what it is:

    (0, -1)        no session: a full fetch, nothing kept
    (0, 0)         a full fetch that opens a session (its id is in the answer; 0 where the
                   cache has no room: the consumer goes on without one)
    (id, 0)        close session id, and open a new one, as (0, 0)
    (id, -1)       close session id; a full fetch without one
    (id, epoch)    an incremental fetch in session id: the epoch must be the one that session
                   expects next (INVALID_FETCH_SESSION_EPOCH otherwise), and the session must
                   be there (FETCH_SESSION_ID_NOT_FOUND: evicted, or another principal's)

Invariants: at most `slots` sessions (Kafka's max.incremental.fetch.session.cache.slots) and
`partitions_max` partitions in all of them, so no client can grow the cache without bound; a
full cache makes room only by evicting a session idle for `eviction_idle_ms`; a session's epoch
moves on once per request it accepts. Thread-safe: the listener's handler threads and delayed
answers use one cache.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import FetchResult, FetchSpec

INVALID_SESSION_ID, FINAL_EPOCH, INITIAL_EPOCH = 0, -1, 0
EPOCH_MAX = 2**31 - 1

Partition = tuple[str, int]


@dataclass
class CachedPartition:
    """A partition of a session: where the consumer fetches from, and what it was last told."""

    spec: FetchSpec
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1


@dataclass
class FetchSession:
    session_id: int
    principal: str
    next_epoch: int
    partitions: dict[Partition, CachedPartition] = field(default_factory=dict)  # fetch order
    last_used_s: float = 0.0


@dataclass
class FetchContext:
    """What one Fetch reads (`specs`, in order) and how its answer is cut: a full answer names
    every partition, an incremental one only those with records or news."""

    specs: list[FetchSpec]
    session: FetchSession | None = None
    incremental: bool = False
    error: errors.DeltaBusError | None = None  # the whole request's: nothing is read

    @property
    def session_id(self) -> int:
        return self.session.session_id if self.session is not None else INVALID_SESSION_ID


class FetchSessionCache:
    """The sessions of one listener, by id."""

    def __init__(self, slots: int = cfg.FETCH_SESSION_CACHE_SLOTS,
                 partitions_max: int = cfg.FETCH_SESSION_CACHE_PARTITIONS_MAX,
                 eviction_idle_ms: int = cfg.FETCH_SESSION_EVICTION_MS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._slots = slots
        self._partitions_max = partitions_max
        self._eviction_idle_s = eviction_idle_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[int, FetchSession] = {}
        self._partitions = 0  # in every session together

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def context(self, session_id: int, epoch: int, specs: list[FetchSpec],
                forgotten: list[Partition], principal: str) -> FetchContext:
        """The context of a Fetch with this (session id, epoch), naming `specs` and forgetting
        `forgotten` (incremental fetches only)."""
        with self._lock:
            if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
                self._close(session_id)
                if epoch == FINAL_EPOCH or not specs:
                    return FetchContext(specs)
                return FetchContext(specs, self._open(specs, principal))
            if session_id == INVALID_SESSION_ID:
                return FetchContext([], error=errors.InvalidFetchSessionEpochError(
                    f"a fetch without a session has epoch 0 or -1, not {epoch}"))
            session = self._sessions.get(session_id)
            if session is None or session.principal != principal:
                return FetchContext([], error=errors.FetchSessionIdNotFoundError(
                    f"fetch session {session_id} is not in this broker's cache"))
            if epoch != session.next_epoch:
                return FetchContext([], error=errors.InvalidFetchSessionEpochError(
                    f"fetch session {session_id} expects epoch {session.next_epoch}, "
                    f"not {epoch}"))
            return self._update(session, specs, forgotten)

    def _open(self, specs: list[FetchSpec], principal: str) -> FetchSession | None:
        """Lock held. A new session of `specs`, or None where the cache has no room for it (the
        consumer then fetches without one, as Kafka lets it)."""
        now = self._clock()
        while len(self._sessions) >= self._slots or \
                self._partitions + len(specs) > self._partitions_max:
            idle = min(self._sessions.values(), key=lambda s: s.last_used_s, default=None)
            if idle is None or now - idle.last_used_s < self._eviction_idle_s:
                return None
            self._close(idle.session_id)
        session_id = INVALID_SESSION_ID
        while session_id == INVALID_SESSION_ID or session_id in self._sessions:
            session_id = random.randint(1, EPOCH_MAX)
        session = FetchSession(session_id, principal, 1, last_used_s=now)
        session.partitions = {(s.topic, s.partition): CachedPartition(s) for s in specs}
        self._sessions[session_id] = session
        self._partitions += len(session.partitions)
        return session

    def _close(self, session_id: int) -> None:
        """Lock held."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._partitions -= len(session.partitions)

    def _update(self, session: FetchSession, specs: list[FetchSpec],
                forgotten: list[Partition]) -> FetchContext:
        """Lock held. An incremental fetch: forgotten partitions leave the session, named ones
        join it or move to their new fetch offsets; the session's epoch moves on."""
        parts = session.partitions
        added = {(s.topic, s.partition) for s in specs} - parts.keys()
        grown = len(added) - sum(1 for p in set(forgotten) if p in parts)
        if len(parts) + grown > cfg.REQUEST_PARTITIONS_MAX or \
                self._partitions + grown > self._partitions_max:
            return FetchContext([], error=errors.InvalidRequestError(
                f"fetch session {session.session_id} would hold {len(parts) + grown} "
                f"partitions, past the limit of {cfg.REQUEST_PARTITIONS_MAX} "
                f"(REQUEST_PARTITIONS_MAX) or the cache's {self._partitions_max}"))
        before = len(parts)
        for p in forgotten:
            parts.pop(p, None)
        for s in specs:
            cached = parts.get((s.topic, s.partition))
            if cached is None:
                parts[(s.topic, s.partition)] = CachedPartition(s)
            else:
                cached.spec = s
        self._partitions += len(parts) - before
        session.next_epoch = 1 if session.next_epoch == EPOCH_MAX else session.next_epoch + 1
        session.last_used_s = self._clock()
        return FetchContext([c.spec for c in parts.values()], session, incremental=True)

    def answered(self, context: FetchContext, results: list[FetchResult],
                 with_records: set[Partition]) -> list[FetchResult]:
        """The results the answer carries: every one for a full fetch; for an incremental one
        those with records, an error, or a high watermark or log start offset the consumer has
        not been told. What is told is kept, and partitions that got records go to the back of
        the session's order, so the next answers give the others their turn at the byte limit
        (Kafka's round robin)."""
        session = context.session
        if session is None:
            return results
        with self._lock:
            out = []
            for r in results:
                key = (r.topic, r.partition)
                cached = session.partitions.get(key)
                if cached is None:  # forgotten meanwhile by a newer request
                    continue
                news = (r.error is not None or key in with_records
                        or r.high_watermark != cached.high_watermark
                        or r.log_start_offset != cached.log_start_offset
                        or r.last_stable_offset != cached.last_stable_offset)
                if context.incremental and not news:
                    continue
                cached.high_watermark, cached.log_start_offset = (r.high_watermark,
                                                                  r.log_start_offset)
                cached.last_stable_offset = r.last_stable_offset
                out.append(r)
                if key in with_records:
                    session.partitions[key] = session.partitions.pop(key)
            session.last_used_s = self._clock()
            return out

    def discard(self, context: FetchContext) -> None:
        """A full fetch's session that will not be answered (the consumer is throttled: Kafka
        opens none then)."""
        if context.session is not None and not context.incremental:
            with self._lock:
                self._close(context.session.session_id)
