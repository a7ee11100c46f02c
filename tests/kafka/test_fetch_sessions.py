"""Incremental fetch sessions (KIP-227) in a listener's cache, driven directly with a controlled
clock (no Spark, no sockets): a session opens on a full fetch, moves on epoch by epoch, keeps the
partitions a consumer stops naming, answers only what changed, and the cache stays within its
slots and partitions, evicting only sessions idle past the eviction time."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.cluster.handler import FetchResult, FetchSpec
from deltabus.rpc.kafka.fetch_sessions import FetchSessionCache

ALICE = "User:alice"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def spec(partition: int, offset: int = 0, topic: str = "t") -> FetchSpec:
    return FetchSpec(topic, partition, offset, 1024, -1)


def result(partition: int, hw: int, topic: str = "t") -> FetchResult:
    return FetchResult(topic, partition, high_watermark=hw, log_start_offset=0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> FetchSessionCache:
    return FetchSessionCache(slots=2, partitions_max=10, eviction_idle_ms=60_000, clock=clock)


def opened(cache: FetchSessionCache, partitions: int = 3) -> int:
    context = cache.context(0, 0, [spec(p) for p in range(partitions)], [], ALICE)
    assert context.session is not None and not context.incremental
    cache.answered(context, [result(p, 5) for p in range(partitions)], set())
    return context.session_id


def test_an_incremental_fetch_reads_every_partition_of_its_session(cache) -> None:
    session_id = opened(cache)
    context = cache.context(session_id, 1, [spec(1, offset=5)], [], ALICE)
    assert context.incremental and context.session_id == session_id
    assert [(s.partition, s.offset) for s in context.specs] == [(0, 0), (1, 5), (2, 0)]
    forgot = cache.context(session_id, 2, [spec(3)], [("t", 0)], ALICE)
    assert [s.partition for s in forgot.specs] == [1, 2, 3]


def test_an_incremental_answer_carries_only_partitions_with_news(cache) -> None:
    session_id = opened(cache)
    context = cache.context(session_id, 1, [], [], ALICE)
    answer = cache.answered(context, [result(0, 5), result(1, 6), result(2, 5)], {("t", 2)})
    assert [r.partition for r in answer] == [1, 2]  # a new high watermark; records
    again = cache.context(session_id, 2, [], [], ALICE)
    assert [s.partition for s in again.specs] == [0, 1, 2]  # 2 had records: now last
    nothing = cache.answered(again, [result(0, 5), result(1, 6), result(2, 5)], set())
    assert nothing == []


def test_a_wrong_epoch_or_an_unknown_session_is_refused(cache) -> None:
    session_id = opened(cache)
    stale = cache.context(session_id, 2, [], [], ALICE)
    assert isinstance(stale.error, errors.InvalidFetchSessionEpochError) and not stale.specs
    assert isinstance(cache.context(session_id + 1, 1, [], [], ALICE).error,
                      errors.FetchSessionIdNotFoundError)
    assert isinstance(cache.context(session_id, 1, [], [], "User:mallory").error,
                      errors.FetchSessionIdNotFoundError)  # another principal's is not there
    assert isinstance(cache.context(0, 3, [], [], ALICE).error,
                      errors.InvalidFetchSessionEpochError)
    assert cache.context(session_id, 1, [], [], ALICE).error is None  # still expected


def test_epoch_minus_one_closes_the_session_and_fetches_without_one(cache) -> None:
    session_id = opened(cache)
    closed = cache.context(session_id, -1, [spec(0)], [], ALICE)
    assert closed.session is None and closed.session_id == 0 and len(cache) == 0
    assert isinstance(cache.context(session_id, 1, [], [], ALICE).error,
                      errors.FetchSessionIdNotFoundError)


def test_a_full_cache_evicts_only_idle_sessions(cache, clock) -> None:
    opened(cache)
    opened(cache)
    full = cache.context(0, 0, [spec(0)], [], ALICE)
    assert full.session is None and full.specs == [spec(0)]  # served without a session
    clock.now += 61
    assert cache.context(0, 0, [spec(0)], [], ALICE).session is not None
    assert len(cache) == 2


def test_the_cache_holds_at_most_its_partitions(cache) -> None:
    session_id = opened(cache, partitions=8)
    assert cache.context(0, 0, [spec(p) for p in range(3)], [], ALICE).session is None
    grown = cache.context(session_id, 1, [spec(p) for p in range(8, 11)], [], ALICE)
    assert isinstance(grown.error, errors.InvalidRequestError)
    assert cache.context(session_id, 1, [spec(8)], [], ALICE).error is None
