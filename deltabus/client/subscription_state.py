"""`SubscriptionState`: where a consumer stands in each assigned partition (Kafka's
SubscriptionState).

Per assigned partition: the position (the offset of the next record poll returns; None until
it is reset), the leader epoch of the record before it, the leader epoch of the leader that
position is known to be valid with, the leader epoch of the last record poll returned, and the
records fetched ahead of the position that poll has not returned yet. The consumer's parts that
move positions (the `Fetcher` by fetching, the `OffsetFetcher` by resets and validation, the
`Consumer` by seeks and rebalances) share this one state instead of reaching into each other.

Invariants: a partition is assigned exactly when it has an entry in `positions`; a position
moved other than by fetching (`set_position`) drops what was fetched ahead of the old one, so
poll never returns records from before a seek. Not thread-safe: owned by one Consumer and used
on its polling thread.
"""

from __future__ import annotations

import collections

import pyarrow as pa

from deltabus.client.consumer_coordinator import TopicPartition

__all__ = ["SubscriptionState"]


class SubscriptionState:
    """The positions of one Consumer's assigned partitions and what was fetched ahead of them.
    Runs in the user's process; not thread-safe (the consumer's polling thread only)."""

    def __init__(self) -> None:
        self.positions: dict[TopicPartition, int | None] = {}
        # The leader epoch of the record before each position (-1: unknown, not validated), and
        # the leader epoch of the leader that position is known to be valid with.
        self.position_epochs: dict[TopicPartition, int] = {}
        self.validated_epochs: dict[TopicPartition, int] = {}
        self.consumed_epochs: dict[TopicPartition, int] = {}  # of the last record poll returned
        # Fetched ahead, not yet returned by poll: each table starts at its partition's position.
        self.buffer: collections.OrderedDict[TopicPartition, pa.Table] = collections.OrderedDict()

    def set_position(self, tp: TopicPartition, offset: int, *, epoch: int = -1,
                     validated_epoch: int = -1) -> None:
        """Move a position other than by fetching (seek, reset, committed offset, truncation):
        what was fetched ahead of the old position goes."""
        self.positions[tp] = offset
        self.position_epochs[tp] = epoch
        self.validated_epochs[tp] = validated_epoch
        self.consumed_epochs.pop(tp, None)
        self.buffer.pop(tp, None)

    def has_position(self, tp: TopicPartition) -> bool:
        return tp in self.buffer or self.positions.get(tp) is not None
