"""`OffsetFetcher`: the consumer's offset lookups and position checks (Kafka's OffsetFetcher).

Resets positions (the group's committed offset, else `auto_offset_reset`), lists offsets by
timestamp with ListOffsets against each partition's leader, and validates positions after a
leader change with OffsetForLeaderEpoch (KIP-320): only when the new leader's log ends the
position's epoch below the position were records the consumer read truncated away (an unclean
election), and the position moves to where the logs part, saying so in the log. Separate from
the `Fetcher`, which fetches records: these calls move positions without fetching, and both
the consumer's public offset methods and the fetch path use them.

Invariant: every request goes to the partition's leader as the cached metadata names it;
partitions whose leader is unknown, unreachable or answered a retriable error are retried
(after a metadata refresh), never answered from a stale leader. Not thread-safe: owned by one
Consumer and run on its polling thread.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from deltabus import errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.consumer_coordinator import ConsumerCoordinator, TopicPartition
from deltabus.client.subscription_state import SubscriptionState
from deltabus.rpc.v1 import deltabus_pb2 as pb

__all__ = ["OffsetFetcher"]

# The consumer's logger: applications (and tests) configure and watch that one for resets.
log = logging.getLogger("deltabus.client.consumer")


class OffsetFetcher:
    """ListOffsets and OffsetForLeaderEpoch for one Consumer's positions. Runs in the user's
    process; not thread-safe (the consumer's polling thread only)."""

    def __init__(self, client: ClusterClient, assignment: SubscriptionState,
                 group: ConsumerCoordinator | None, *, auto_offset_reset: str,
                 isolation: int) -> None:
        """`group`: the consumer's group coordinator client (committed offsets), if any;
        `isolation`: the isolation level's number on the wire."""
        self._client = client
        self._assignment = assignment
        self._group = group
        self.auto_offset_reset = auto_offset_reset
        self._isolation = isolation

    def reset(self, tps: list[TopicPartition], *, committed: bool = True) -> None:
        """Positions for partitions with none: the group's committed offsets, else
        auto_offset_reset (Kafka's order: committed offsets win over the reset policy). A
        position out of range (below a log start offset retention moved) follows the policy
        alone (`committed` False): the committed offset may be that very position."""
        if self._group is not None and committed:
            for tp, om in self._group.committed(tps).items():
                if om is not None:  # validated before the first fetch when it has an epoch
                    self._assignment.set_position(tp, om.offset, epoch=om.leader_epoch)
            tps = [tp for tp in tps if self._assignment.positions.get(tp) is None]
            if not tps:
                return
        if self.auto_offset_reset == "none":
            raise errors.OffsetOutOfRangeError(
                f"no position for {[f'{t.topic}-{t.partition}' for t in tps]} and "
                "auto_offset_reset is none")
        timestamp = -2 if self.auto_offset_reset == "earliest" else -1
        for tp, offset in self.list_offsets(tps, timestamp).items():
            self._assignment.set_position(tp, offset)

    def list_offsets(self, tps: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        """ListOffsets against each partition's leader, retrying while leaders move."""
        out: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + self._client.request_timeout_ms / 1000
        pending = list(tps)
        while pending:
            retry: list[TopicPartition] = []
            for tp, answer in self._ask_leaders(pending, "ListOffsets", lambda group: (
                    pb.ListOffsetsRequest(isolation_level=self._isolation, partitions=[
                        pb.ListOffsetsPartition(topic=t.topic, partition=t.partition,
                                                timestamp=timestamp) for t in group])), retry):
                out[tp] = answer.offset
            if retry and time.monotonic() > deadline:
                raise errors.KafkaTimeoutError(
                    f"could not list offsets of {retry} in {self._client.request_timeout_ms} ms")
            if retry:
                time.sleep(self._client.retry_backoff_ms / 1000)
                self._client.refresh_metadata()
            pending = retry
        return out

    def _ask_leaders(self, tps: list[TopicPartition], method: str,
                     request_for: Callable[[list[TopicPartition]], Any],
                     retry: list[TopicPartition]) -> Iterator[tuple[TopicPartition, Any]]:
        """One `method` call to each leader of `tps`; yields each partition's answer that
        carries no error. Partitions whose leader is unknown, unreachable or answered a
        retriable error go to `retry`; any other error raises."""
        for address, group in self.by_leader(tps, retry).items():
            try:
                response = self._client.call(address, method, request_for(group))
            except errors.DeltaBusError as e:
                if not e.retriable:
                    raise
                retry.extend(group)
                continue
            for p in response.partitions:
                tp = TopicPartition(p.topic, p.partition)
                if p.error_code:
                    error = errors.error_for_code(p.error_code, p.error_message)
                    if not error.retriable:
                        raise error
                    retry.append(tp)
                else:
                    yield tp, p

    def by_leader(self, tps: list[TopicPartition],
                  retry: list[TopicPartition]) -> dict[str, list[TopicPartition]]:
        """`tps` grouped by their leader's address; those with no known leader go to `retry`
        (a non-retriable error raises)."""
        groups: dict[str, list[TopicPartition]] = collections.defaultdict(list)
        for tp in tps:
            try:
                broker, _ = self._client.leader(tp.topic, tp.partition)
            except errors.DeltaBusError as e:
                if not e.retriable:
                    raise
                retry.append(tp)
                continue
            groups[broker.address].append(tp)
        return groups

    def leader_epoch(self, tp: TopicPartition) -> int:
        """The partition's leader epoch in the cached metadata (-1: unknown)."""
        state = self._client.image.partition(tp.topic, tp.partition)
        return state.leader_epoch if state is not None else -1

    def needs_validation(self, tp: TopicPartition) -> bool:
        """A position with a known epoch not yet checked against the current leader."""
        return (self._assignment.position_epochs.get(tp, -1) >= 0
                and self._assignment.validated_epochs.get(tp) != self.leader_epoch(tp))

    def validate_positions(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Check positions against their new leaders (OffsetForLeaderEpoch); returns the
        partitions that could not be checked yet (not fetched until they are)."""
        retry: list[TopicPartition] = []
        current = {tp: self.leader_epoch(tp) for tp in tps}
        for tp, answer in self._ask_leaders(tps, "OffsetForLeaderEpoch", lambda group: (
                pb.OffsetForLeaderEpochRequest(partitions=[
                    pb.OffsetForLeaderEpochPartition(
                        topic=t.topic, partition=t.partition, current_leader_epoch=current[t],
                        leader_epoch=self._assignment.position_epochs[t]) for t in group])),
                retry):
            if tp in current:
                self._complete_validation(tp, answer.leader_epoch, answer.end_offset, current[tp])
        return retry

    def _complete_validation(self, tp: TopicPartition, epoch: int, end_offset: int,
                             leader_epoch: int) -> None:
        """Kafka's rules: a position within the epoch's end in the leader's log stands; one past
        it was truncated and moves back to where the logs part (with auto_offset_reset none,
        LogTruncationError); an epoch the leader does not know resets by auto_offset_reset."""
        position = self._assignment.positions[tp]
        assert position is not None
        if epoch >= 0 and end_offset >= position:
            self._assignment.validated_epochs[tp] = leader_epoch
            return
        where = f"{tp.topic}-{tp.partition}"
        if self.auto_offset_reset == "none":
            raise errors.LogTruncationError(
                f"Truncation detected for partition {where} at offset {position} (epoch "
                f"{self._assignment.position_epochs[tp]}): the leader's log ends that epoch at "
                f"{end_offset}, and auto_offset_reset is none")
        if epoch < 0 or end_offset < 0:
            log.warning("Truncation detected for partition %s at offset %d: the leader knows no "
                        "epoch at or before %d; resetting with auto_offset_reset=%s", where,
                        position, self._assignment.position_epochs[tp], self.auto_offset_reset)
            self.reset([tp], committed=False)
            return
        log.warning("Truncation detected for partition %s at offset %d, resetting offset to the "
                    "first offset known to diverge %d", where, position, end_offset)
        self._assignment.set_position(tp, end_offset, epoch=epoch, validated_epoch=leader_epoch)
