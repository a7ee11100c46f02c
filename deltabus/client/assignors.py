"""Partition assignors, run by the group leader's consumer, as Kafka's clients run them.

- `range` (Kafka's default): per topic, contiguous ranges over the members subscribed to it, in
  member id order; the first members get one more when the division is uneven.
- `roundrobin`: every subscribed partition dealt in turn to the members subscribed to its topic.
- `cooperative-sticky`: balanced, and keeping each partition with its current owner where
  balance allows; with the cooperative protocol a partition that changes owner is left out of
  this round (its owner revokes it first, then a follow-up rebalance hands it over).

Pure and deterministic: the same subscriptions give the same assignment on every member.
Invariants (tests check them for random inputs): a partition goes to at most one member, only to
a member subscribed to its topic, and every member appears in the result.
"""

from __future__ import annotations

from typing import Protocol

from deltabus import errors
from deltabus.client.consumer_protocol import Subscription

TopicPartition = tuple[str, int]
Plan = dict[str, list[TopicPartition]]


class Assignor(Protocol):
    name: str
    rebalance_protocol: str  # EAGER or COOPERATIVE

    def assign(self, partitions_per_topic: dict[str, int],
               subscriptions: dict[str, Subscription]) -> Plan: ...


def _subscribers(topic: str, subscriptions: dict[str, Subscription]) -> list[str]:
    return sorted(m for m, s in subscriptions.items() if topic in s.topics)


class RangeAssignor:
    name = "range"
    rebalance_protocol = "EAGER"

    def assign(self, partitions_per_topic: dict[str, int],
               subscriptions: dict[str, Subscription]) -> Plan:
        plan: Plan = {m: [] for m in subscriptions}
        for topic, count in sorted(partitions_per_topic.items()):
            members = _subscribers(topic, subscriptions)
            if not members:
                continue
            per_member, extra = divmod(count, len(members))
            start = 0
            for i, member in enumerate(members):
                n = per_member + (1 if i < extra else 0)
                plan[member] += [(topic, p) for p in range(start, start + n)]
                start += n
        return {m: sorted(tps) for m, tps in plan.items()}


class RoundRobinAssignor:
    name = "roundrobin"
    rebalance_protocol = "EAGER"

    def assign(self, partitions_per_topic: dict[str, int],
               subscriptions: dict[str, Subscription]) -> Plan:
        plan: Plan = {m: [] for m in subscriptions}
        members = sorted(subscriptions)
        if not members:
            return plan
        turn = 0
        for topic, count in sorted(partitions_per_topic.items()):
            if not _subscribers(topic, subscriptions):
                continue
            for p in range(count):
                while topic not in subscriptions[members[turn % len(members)]].topics:
                    turn += 1
                plan[members[turn % len(members)]].append((topic, p))
                turn += 1
        return {m: sorted(tps) for m, tps in plan.items()}


class CooperativeStickyAssignor:
    name = "cooperative-sticky"
    rebalance_protocol = "COOPERATIVE"

    def assign(self, partitions_per_topic: dict[str, int],
               subscriptions: dict[str, Subscription]) -> Plan:
        owners = _current_owners(partitions_per_topic, subscriptions)
        plan = sticky_balance(partitions_per_topic, subscriptions, owners)
        # Cooperative: what moves between two members is only revoked this round.
        return {m: sorted(tp for tp in tps if owners.get(tp, m) == m)
                for m, tps in plan.items()}


def _current_owners(partitions_per_topic: dict[str, int],
                    subscriptions: dict[str, Subscription]) -> dict[TopicPartition, str]:
    """Who owns what now, by the members' claims: a claim counts if the partition exists and
    the member still subscribes to its topic; of two claims the higher generation wins."""
    owners: dict[TopicPartition, tuple[int, str]] = {}
    for member in sorted(subscriptions):
        s = subscriptions[member]
        for topic, partitions in s.owned_partitions:
            if topic not in s.topics:
                continue
            for p in partitions:
                if not 0 <= p < partitions_per_topic.get(topic, 0):
                    continue
                held = owners.get((topic, p))
                if held is None or s.generation_id > held[0]:
                    owners[(topic, p)] = (s.generation_id, member)
    return {tp: member for tp, (_, member) in owners.items()}


def sticky_balance(partitions_per_topic: dict[str, int], subscriptions: dict[str, Subscription],
                   owners: dict[TopicPartition, str]) -> Plan:
    """Keep current owners, hand out the rest to the least loaded eligible member, then move
    partitions from the most to the least loaded member until no move improves balance."""
    plan: Plan = {m: [] for m in subscriptions}
    everything = [(t, p) for t, n in sorted(partitions_per_topic.items()) for p in range(n)
                  if _subscribers(t, subscriptions)]
    for tp in everything:
        if tp in owners:
            plan[owners[tp]].append(tp)
    for tp in everything:
        if tp not in owners:
            eligible = _subscribers(tp[0], subscriptions)
            plan[min(eligible, key=lambda m: (len(plan[m]), m))].append(tp)
    for _ in range(len(everything) ** 2 + 1):  # bounded: each move narrows the spread
        move = _best_move(plan, subscriptions)
        if move is None:
            break
        tp, source, target = move
        plan[source].remove(tp)
        plan[target].append(tp)
    return {m: sorted(tps) for m, tps in plan.items()}


def _best_move(plan: Plan, subscriptions: dict[str, Subscription]
               ) -> tuple[TopicPartition, str, str] | None:
    """A partition that can go from a member to one holding at least two fewer."""
    by_load = sorted(plan, key=lambda m: (-len(plan[m]), m))
    for source in by_load:
        for target in reversed(by_load):
            if len(plan[source]) - len(plan[target]) < 2:
                continue
            for tp in sorted(plan[source], reverse=True):
                if tp[0] in subscriptions[target].topics:
                    return tp, source, target
    return None


ASSIGNORS: dict[str, Assignor] = {
    a.name: a for a in (RangeAssignor(), RoundRobinAssignor(), CooperativeStickyAssignor())}


def assignor(name: str) -> Assignor:
    """The assignor Kafka calls `name` (its class name works too, as in Kafka's configs)."""
    short = {"RangeAssignor": "range", "RoundRobinAssignor": "roundrobin",
             "CooperativeStickyAssignor": "cooperative-sticky"}
    key = short.get(name.rsplit(".", 1)[-1], name)
    if key not in ASSIGNORS:
        raise errors.InvalidConfigError(
            f"unknown partition.assignment.strategy {name!r}: choose from {sorted(ASSIGNORS)}")
    return ASSIGNORS[key]
