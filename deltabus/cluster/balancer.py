"""The balancer: a plan of replica moves that spreads partitions over the brokers, by Cruise
Control's goals in their order: rack, replica count, leader count, bytes in. Pure: runs in the
driver, called by the controller (`deltabus cluster balance`, a broker joining or leaving).

A plan is the target replica list of each partition it changes, Kafka's reassignment JSON; the
controller carries it out as a reassignment (copy, join the ISR, drop) and then elects the
preferred leaders. Moving a leader costs nothing (a new order of the same replicas), moving a
replica costs a copy, so the plan moves as few replicas as its goals need.

Invariants:
- a partition's replicas stay distinct brokers, all of them in `racks` (the brokers that stay);
- a goal is never made worse to better a later one (a move that would break rack awareness or
  push a broker's replica count out of bounds is not taken for leaders or bytes);
- every loop is bounded (at most MOVES_MAX steps per goal), so a plan always ends;
- a cluster already within its goals gets an empty plan.

A goal holds when every broker is within `tolerance` (10 %) of the mean in whole replicas or
leaders, or, where 10 % is less than one, on one of the whole numbers either side of the mean
(`bounds`). Bytes in are measured load and may not split evenly (one hot partition): what a
plan cannot meet it says (`unmet`).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Mapping, Sequence

from deltabus import errors
from deltabus.metadata import BalancePlan, BrokerLoad

TopicPartition = tuple[str, int]
Assignment = dict[TopicPartition, list[int]]
__all__ = ["BalancePlan", "BrokerLoad", "plan", "broker_loads", "bounds"]

TOLERANCE = 0.10  # each goal: within 10 % of the mean
MOVES_MAX = 100_000  # steps per goal, whatever the cluster's size
SWAP_CANDIDATES = 200  # the busiest partitions of the busiest broker a bytes-in swap weighs
SWAP_NEIGHBOURS = 8  # partners weighed for each: those nearest the load that halves the gap
RACK, REPLICAS, LEADERS, BYTES_IN = "rack", "replica count", "leader count", "bytes in"


def plan(assignment: Mapping[TopicPartition, Sequence[int]], racks: Mapping[int, str],
         bytes_in_per_s: Mapping[TopicPartition, float] | None = None,
         tolerance: float = TOLERANCE) -> BalancePlan:
    """The moves that take `assignment` to a balanced one over the brokers of `racks` (broker id
    -> rack, "" where none is set). Replicas on brokers not in `racks` (leaving, or gone) move
    first. Raises InvalidReplicationFactorError when a partition has more replicas than there
    are brokers to hold them."""
    if not racks:
        raise errors.InvalidReplicationFactorError("no broker is left to hold the replicas")
    load = dict(bytes_in_per_s or {})
    target: Assignment = {tp: list(replicas) for tp, replicas in assignment.items()}
    for tp, replicas in target.items():
        if len(replicas) > len(racks):
            raise errors.InvalidReplicationFactorError(
                f"{tp[0]}-{tp[1]} has {len(replicas)} replicas but only {len(racks)} brokers "
                "would hold them")
    spread = _Spread(target, racks, load)
    spread.evacuate()
    spread.spread_racks()
    unmet = []
    for name, step in ((REPLICAS, spread.balance_replicas), (LEADERS, spread.balance_leaders),
                       (BYTES_IN, spread.balance_bytes_in)):
        if not step(tolerance):
            unmet.append(name)
    if not spread.racks_spread():
        unmet.insert(0, RACK)
    moves = {tp: replicas for tp, replicas in target.items()
             if replicas != list(assignment[tp])}
    copies = sum(len(set(target) - set(assignment[tp])) for tp, target in moves.items())
    return BalancePlan(moves, broker_loads(assignment, racks, load),
                       broker_loads(target, racks, load), unmet, copies)


def broker_loads(assignment: Mapping[TopicPartition, Sequence[int]], racks: Mapping[int, str],
                 bytes_in_per_s: Mapping[TopicPartition, float] | None = None
                 ) -> list[BrokerLoad]:
    """The spread of `assignment` over the brokers of `racks` (and any other broker it names),
    in broker id order: what `deltabus cluster balance` prints."""
    load = bytes_in_per_s or {}
    brokers = set(racks) | {b for replicas in assignment.values() for b in replicas}
    replicas = dict.fromkeys(brokers, 0)
    leaders = dict.fromkeys(brokers, 0)
    bytes_in = dict.fromkeys(brokers, 0.0)
    for tp, rs in assignment.items():
        for b in rs:
            replicas[b] += 1
            bytes_in[b] += load.get(tp, 0.0)
        if rs:
            leaders[rs[0]] += 1
    return [BrokerLoad(b, racks.get(b, ""), replicas[b], leaders[b], bytes_in[b])
            for b in sorted(brokers)]


def bounds(total: float, brokers: int, tolerance: float = TOLERANCE) -> tuple[int, int]:
    """A goal's bounds per broker: the mean less and plus `tolerance` in whole units
    (replicas, leaders), but never tighter than the whole numbers either side of the mean: a
    mean of 2 allows 2 only, 7.5 allows 7 or 8, 30 allows 27 to 33."""
    mean = total / brokers
    slack = 1e-9  # 30 * 0.9 is 27.000000000000004 in floating point
    return (min(math.floor(mean), math.ceil(mean * (1 - tolerance) - slack)),
            max(math.ceil(mean), math.floor(mean * (1 + tolerance) + slack)))


class _Spread:
    """The target assignment being planned, with each broker's counts kept up to date."""

    def __init__(self, target: Assignment, racks: Mapping[int, str],
                 load: Mapping[TopicPartition, float]) -> None:
        self.target = target
        self.racks = dict(racks)
        self.load = load
        self.brokers = sorted(racks)
        self.replicas = dict.fromkeys(self.brokers, 0)
        self.leaders = dict.fromkeys(self.brokers, 0)
        self.bytes_in = dict.fromkeys(self.brokers, 0.0)
        self.held: dict[int, set[TopicPartition]] = {b: set() for b in self.brokers}
        for tp, replicas in target.items():
            for i, b in enumerate(replicas):
                self._count(tp, b, i == 0, 1)

    def _count(self, tp: TopicPartition, broker: int, leader: bool, sign: int) -> None:
        if broker not in self.replicas:  # a leaving broker: nothing to balance there
            return
        self.replicas[broker] += sign
        if sign > 0:
            self.held[broker].add(tp)
        else:
            self.held[broker].discard(tp)
        self.leaders[broker] += sign if leader else 0
        self.bytes_in[broker] += sign * self.load.get(tp, 0.0)

    def _move(self, tp: TopicPartition, source: int, dest: int) -> None:
        """The replica of `tp` on `source` goes to `dest`, keeping its place in the list."""
        replicas = self.target[tp]
        i = replicas.index(source)
        self._count(tp, source, i == 0, -1)
        replicas[i] = dest
        self._count(tp, dest, i == 0, 1)

    def _distinct_racks(self, replicas: Sequence[int]) -> int:
        return len({self.racks.get(b, "") for b in replicas})

    def _rack_ok(self, tp: TopicPartition, source: int, dest: int) -> bool:
        """Moving `tp`'s replica from `source` to `dest` keeps as many racks as it had."""
        if self.racks.get(source) == self.racks[dest]:
            return True
        replicas = self.target[tp]
        after = [dest if b == source else b for b in replicas]
        return self._distinct_racks(after) >= self._distinct_racks(replicas)

    def _rack_count(self) -> int:
        return len(set(self.racks.values()))

    # ---- the goals, in order -------------------------------------------------------------

    def evacuate(self) -> None:
        """Replicas on brokers that are not staying go to the least loaded broker that keeps
        the partition's racks apart, as followers: a leaving leader's place goes to the next
        replica, already in sync, rather than to the new copy."""
        for tp, replicas in sorted(self.target.items()):
            for source in [b for b in replicas if b not in self.racks]:
                used = {self.racks[b] for b in replicas if b in self.racks}
                dest = min((b for b in self.brokers if b not in replicas),
                           key=lambda b: (self.racks[b] in used, self.replicas[b],
                                          self.bytes_in[b], b))
                if replicas[0] == source and len(replicas) > 1:
                    self._count(tp, replicas[1], False, -1)
                    self._count(tp, replicas[1], True, 1)
                replicas.remove(source)
                replicas.append(dest)
                self._count(tp, dest, len(replicas) == 1, 1)

    def racks_spread(self) -> bool:
        want = self._rack_count()
        return all(self._distinct_racks(rs) >= min(len(rs), want) for rs in self.target.values())

    def spread_racks(self) -> None:
        """A partition with two replicas on one rack while another rack holds none of them
        moves one there (to that rack's least loaded broker)."""
        want = self._rack_count()
        if want < 2:
            return
        for tp, replicas in sorted(self.target.items()):
            while self._distinct_racks(replicas) < min(len(replicas), want):
                used = [self.racks[b] for b in replicas]
                source = next(b for b in reversed(replicas) if used.count(self.racks[b]) > 1)
                dest = min((b for b in self.brokers if self.racks[b] not in used),
                           key=lambda b: (self.replicas[b], b))
                self._move(tp, source, dest)

    @staticmethod
    def _within_bounds(counts: dict[int, int], tolerance: float,
                       step: Callable[[float, float], bool]) -> bool:
        """Take `step(lo, hi)` until every broker's count is within bounds (True), or a step
        finds nothing to move or MOVES_MAX steps were taken (False)."""
        lo, hi = bounds(sum(counts.values()), len(counts), tolerance)
        for _ in range(MOVES_MAX):
            if min(counts.values()) >= lo and max(counts.values()) <= hi:
                return True
            if not step(lo, hi):
                return False
        return False

    def balance_replicas(self, tolerance: float) -> bool:
        """Move replicas from the most loaded brokers to the least, followers first and the
        lightest first (the cheapest copies), until every broker is within bounds."""
        return self._within_bounds(self.replicas, tolerance, self._move_one_replica)

    def _move_one_replica(self, lo: float, hi: float) -> bool:
        sources = sorted(self.brokers, key=lambda b: -self.replicas[b])
        dests = sorted(self.brokers, key=lambda b: self.replicas[b])
        for source in sources:
            for dest in dests:
                over, under = self.replicas[source] > hi, self.replicas[dest] < lo
                if not (over or under) or self.replicas[source] - self.replicas[dest] < 2:
                    continue
                candidates = sorted(self.held[source] - self.held[dest],
                                    key=lambda t: (self.target[t][0] == source,
                                                   self.load.get(t, 0.0), t))
                tp = next((t for t in candidates if self._rack_ok(t, source, dest)), None)
                if tp is not None:
                    self._move(tp, source, dest)
                    return True
        return False

    def balance_leaders(self, tolerance: float) -> bool:
        """Reorder replica lists (no copy) so each broker is preferred leader of its share."""
        return self._within_bounds(self.leaders, tolerance, self._move_one_leader)

    def _move_one_leader(self, lo: float, hi: float) -> bool:
        """Hand one leadership from a broker above its share to one below it: straight to a
        replica of one of its partitions, else along a chain of hand-overs where each broker
        between gives one leadership and takes one (a broker's partitions may share no replica
        with the broker that is short)."""
        def wanted(source: int, dest: int) -> bool:
            return (self.leaders[source] - self.leaders[dest] >= 2
                    and (self.leaders[source] > hi or self.leaders[dest] < lo))

        for source in sorted(self.brokers, key=lambda b: -self.leaders[b]):
            for tp in sorted(self.held[source]):
                replicas = self.target[tp]
                if replicas[0] != source:
                    continue
                others = [b for b in replicas[1:] if b in self.leaders and wanted(source, b)]
                if others:
                    self._hand_over(tp, min(others, key=lambda b: (self.leaders[b], b)))
                    return True
        for source in sorted(self.brokers, key=lambda b: -self.leaders[b]):
            chain = self._leader_chain(source, functools.partial(wanted, source))
            if chain:
                for tp, dest in chain:
                    self._hand_over(tp, dest)
                return True
        return False

    def _leader_chain(self, source: int, wanted: Callable[[int], bool]
                      ) -> list[tuple[TopicPartition, int]]:
        """The shortest chain of hand-overs (partition, its new leader) from `source` to a
        broker `wanted` takes, breadth first over "leads a partition the other also holds";
        empty when there is none."""
        led: dict[int, list[TopicPartition]] = {}
        for tp, replicas in sorted(self.target.items()):
            if replicas and replicas[0] in self.leaders:
                led.setdefault(replicas[0], []).append(tp)
        came_from: dict[int, tuple[int, TopicPartition]] = {}
        frontier = [source]
        while frontier:
            reached = []
            for broker in frontier:
                for tp in led.get(broker, ()):
                    for dest in self.target[tp][1:]:
                        if dest == source or dest in came_from or dest not in self.leaders:
                            continue
                        came_from[dest] = (broker, tp)
                        if wanted(dest):
                            chain = []
                            while dest != source:
                                broker, tp = came_from[dest]
                                chain.append((tp, dest))
                                dest = broker
                            return chain[::-1]
                        reached.append(dest)
            frontier = reached
        return []

    def _hand_over(self, tp: TopicPartition, dest: int) -> None:
        """Make replica `dest` the preferred leader of `tp` (the leader takes its place)."""
        replicas = self.target[tp]
        source, i = replicas[0], replicas.index(dest)
        self._count(tp, source, True, -1)
        self._count(tp, dest, False, -1)
        replicas[0], replicas[i] = dest, source
        self._count(tp, dest, True, 1)
        self._count(tp, source, False, 1)

    def balance_bytes_in(self, tolerance: float) -> bool:
        """Swap replicas of equal standing (both leaders or both followers) between the
        busiest and the idlest broker, so replica and leader counts stay as they are."""
        total = sum(self.bytes_in.values())
        if total <= 0:
            return True
        mean = total / len(self.brokers)
        for _ in range(MOVES_MAX):
            if max(self.bytes_in.values()) <= mean * (1 + tolerance) and \
                    min(self.bytes_in.values()) >= mean * (1 - tolerance):
                return True
            if not self._swap_one():
                return False
        return False

    def _swap_one(self) -> bool:
        source = max(self.brokers, key=lambda b: (self.bytes_in[b], -b))
        dest = min(self.brokers, key=lambda b: (self.bytes_in[b], b))
        gap = self.bytes_in[source] - self.bytes_in[dest]
        best: tuple[float, TopicPartition, TopicPartition] | None = None
        hot = sorted(self.held[source] - self.held[dest],
                     key=lambda t: -self.load.get(t, 0.0))[:SWAP_CANDIDATES]
        cold = sorted(self.held[dest] - self.held[source], key=lambda t: self.load.get(t, 0.0))
        cold_loads = [self.load.get(t, 0.0) for t in cold]
        for a in hot:
            lead_a = self.target[a][0] == source
            # the best partner carries `gap / 2` less than `a`: look around that load
            at = bisect.bisect_left(cold_loads, self.load.get(a, 0.0) - gap / 2)
            for b in cold[max(0, at - SWAP_NEIGHBOURS):at + SWAP_NEIGHBOURS]:
                delta = self.load.get(a, 0.0) - self.load.get(b, 0.0)
                if not 0 < delta < gap or (best is not None and abs(gap / 2 - delta) >= best[0]):
                    continue
                if (self.target[b][0] == dest) == lead_a and self._rack_ok(a, source, dest) \
                        and self._rack_ok(b, dest, source):
                    best = (abs(gap / 2 - delta), a, b)
        if best is None:
            return False
        _, a, b = best
        self._move(a, source, dest)
        self._move(b, dest, source)
        return True
