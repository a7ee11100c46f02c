"""Kafka's default partitioner: keyed records land where a Kafka client would put them, unkeyed
records stick to one partition per batch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deltabus.client.partitioner import StickyPartitioner, murmur2, partition_for_key

# Vectors from Kafka's UtilsTest.testMurmur2 (clients/src/test/.../utils/UtilsTest.java).
KAFKA_MURMUR2_VECTORS = [
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka(key: str, expected: int) -> None:
    assert murmur2(key.encode("utf-8")) == expected


@given(st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int(data: bytes) -> None:
    h = murmur2(data)
    assert -(2**31) <= h < 2**31


def test_partition_for_key_matches_kafka_to_positive() -> None:
    # Kafka: Utils.toPositive(murmur2(key)) % numPartitions, toPositive = h & 0x7fffffff.
    for key, h in KAFKA_MURMUR2_VECTORS:
        for n in (1, 3, 7, 12):
            assert partition_for_key(key.encode(), n) == (h & 0x7FFFFFFF) % n


@given(st.binary(max_size=128), st.integers(min_value=1, max_value=10_000))
def test_partition_for_key_in_range_and_deterministic(key: bytes, num_partitions: int) -> None:
    p = partition_for_key(key, num_partitions)
    assert 0 <= p < num_partitions
    assert partition_for_key(key, num_partitions) == p
    assert partition_for_key(bytes(key), num_partitions) == p  # a copy of the key, same partition


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=20))
def test_sticky_partitioner_sticks_until_new_batch_then_moves(
    num_partitions: int, batches: int
) -> None:
    sticky = StickyPartitioner()
    for _ in range(batches):
        first = sticky.partition("t", num_partitions)
        assert 0 <= first < num_partitions
        for _ in range(5):
            assert sticky.partition("t", num_partitions) == first
        sticky.on_new_batch("t", num_partitions, first)
        after = sticky.partition("t", num_partitions)
        assert 0 <= after < num_partitions
        if num_partitions > 1:
            assert after != first
        else:
            assert after == 0


def test_sticky_partitioner_spreads_over_partitions() -> None:
    sticky = StickyPartitioner()
    seen = set()
    for _ in range(200):
        p = sticky.partition("t", 4)
        seen.add(p)
        sticky.on_new_batch("t", 4, p)
    assert seen == {0, 1, 2, 3}


def test_sticky_partitioner_topics_are_independent() -> None:
    sticky = StickyPartitioner()
    a = sticky.partition("a", 8)
    b = sticky.partition("b", 8)
    sticky.on_new_batch("b", 8, b)
    assert sticky.partition("a", 8) == a


def test_sticky_partitioner_ignores_stale_new_batch() -> None:
    # A new-batch notice for a partition that is no longer current must not move the topic again.
    sticky = StickyPartitioner()
    p = sticky.partition("t", 5)
    sticky.on_new_batch("t", 5, p)
    q = sticky.partition("t", 5)
    sticky.on_new_batch("t", 5, p)  # stale
    assert sticky.partition("t", 5) == q


def test_sticky_partitioner_stays_in_range_when_partitions_shrink() -> None:
    sticky = StickyPartitioner()
    for _ in range(10):
        p = sticky.partition("t", 10)
        sticky.on_new_batch("t", 10, p)
    for n in (10, 3, 1):
        assert 0 <= sticky.partition("t", n) < n
