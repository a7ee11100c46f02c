"""Kafka's default partitioner, so a key lands on the partition a Kafka user expects.

A keyed record goes to `toPositive(murmur2(key)) % num_partitions`, bit for bit as Kafka's Java
client computes it (seed 0x9747b28c). Records without a key stick to one partition until their batch
is sent, then move to the next one (Kafka's sticky partitioner, rotating rather than random so the
spread is even), so unkeyed load spreads across partitions without
making many small batches.
"""

from __future__ import annotations

import itertools

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data`, as a signed 32-bit int (Utils.murmur2)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    blocks = length // 4
    for i in range(blocks):
        k = int.from_bytes(data[4 * i: 4 * i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[4 * blocks:]
    extra = len(tail)
    if extra == 3:
        h ^= tail[2] << 16
    if extra >= 2:
        h ^= tail[1] << 8
    if extra >= 1:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's DefaultPartitioner picks for a key."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Picks the partition for unkeyed records: one partition per batch, rotating between batches.

    Not thread-safe: the producer calls it under its own lock.
    """

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._current: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= num_partitions:
            current = next(self._counter) % num_partitions
            self._current[topic] = current
        return current

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> None:
        """The sticky batch for `topic` was sent: move to the next partition."""
        if self._current.get(topic) == previous:
            self._current[topic] = (previous + 1) % num_partitions
