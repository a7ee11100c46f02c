"""Kafka's "consumer" embedded protocol: what members put in JoinGroup metadata
(ConsumerProtocolSubscription) and what the leader hands out in SyncGroup
(ConsumerProtocolAssignment), byte for byte as Apache Kafka encodes them (classic, non-flexible
versions), so Kafka clients and deltabus consumers can share a group.

Pure functions, no state. Invariants: `decode(encode(x)) == x` for every version written; decoding
accepts any version from 0 up and ignores what a newer version appends (Kafka's forward
compatibility); anything truncated or malformed raises InvalidRequestError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from deltabus import errors

SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 1

TopicPartitions = list[tuple[str, list[int]]]


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def int16(self, v: int) -> None:
        self.parts.append(struct.pack(">h", v))

    def int32(self, v: int) -> None:
        self.parts.append(struct.pack(">i", v))

    def string(self, s: str | None) -> None:
        if s is None:
            self.int16(-1)
            return
        data = s.encode()
        self.int16(len(data))
        self.parts.append(data)

    def bytes_(self, b: bytes | None) -> None:
        if b is None:
            self.int32(-1)
            return
        self.int32(len(b))
        self.parts.append(b)

    def topic_partitions(self, tps: TopicPartitions) -> None:
        self.int32(len(tps))
        for topic, partitions in tps:
            self.string(topic)
            self.int32(len(partitions))
            for p in partitions:
                self.int32(p)

    def value(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise errors.InvalidRequestError(f"truncated or malformed {self.what}")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        try:
            return self._take(n).decode()
        except UnicodeDecodeError:
            raise errors.InvalidRequestError(f"malformed string in {self.what}") from None

    def bytes_(self) -> bytes | None:
        n = self.int32()
        return None if n == -1 else self._take(n)

    def count(self) -> int:
        n = self.int32()
        if n > len(self.data):  # each item takes at least a byte: garbage, not a real count
            raise errors.InvalidRequestError(f"malformed array length in {self.what}")
        return max(n, 0)

    def topic_partitions(self) -> TopicPartitions:
        out = []
        for _ in range(self.count()):
            topic = self.string() or ""
            out.append((topic, [self.int32() for _ in range(self.count())]))
        return out

    def at_end(self) -> bool:
        return self.pos >= len(self.data)


@dataclass(frozen=True)
class Subscription:
    """A member's subscription: its topics, and (v1+) what it owns, for sticky assignors."""

    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: TopicPartitions = field(default_factory=list)
    generation_id: int = -1
    rack_id: str | None = None

    def encode(self, version: int = SUBSCRIPTION_VERSION) -> bytes:
        w = _Writer()
        w.int16(version)
        w.int32(len(self.topics))
        for t in self.topics:
            w.string(t)
        w.bytes_(self.user_data)
        if version >= 1:
            w.topic_partitions(self.owned_partitions)
        if version >= 2:
            w.int32(self.generation_id)
        if version >= 3:
            w.string(self.rack_id)
        return w.value()

    @staticmethod
    def decode(data: bytes) -> Subscription:
        r = _Reader(data, "consumer subscription")
        version = r.int16()
        if version < 0:
            raise errors.InvalidRequestError(f"consumer subscription version {version}")
        topics = [r.string() or "" for _ in range(r.count())]
        user_data = r.bytes_()
        owned = r.topic_partitions() if version >= 1 and not r.at_end() else []
        generation = r.int32() if version >= 2 and not r.at_end() else -1
        rack = r.string() if version >= 3 and not r.at_end() else None
        return Subscription(topics, user_data, owned, generation, rack)


@dataclass(frozen=True)
class Assignment:
    """What the leader gives a member: (topic, partitions) pairs."""

    partitions: TopicPartitions
    user_data: bytes | None = None

    def encode(self, version: int = ASSIGNMENT_VERSION) -> bytes:
        w = _Writer()
        w.int16(version)
        w.topic_partitions(self.partitions)
        w.bytes_(self.user_data)
        return w.value()

    @staticmethod
    def decode(data: bytes) -> Assignment:
        if not data:  # Kafka sends members that got nothing an empty assignment
            return Assignment([])
        r = _Reader(data, "consumer assignment")
        if r.int16() < 0:
            raise errors.InvalidRequestError("malformed consumer assignment version")
        partitions = r.topic_partitions()
        user_data = r.bytes_() if not r.at_end() else None
        return Assignment(partitions, user_data)
