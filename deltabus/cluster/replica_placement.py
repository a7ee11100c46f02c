"""Where a new partition's replicas go (Kafka's replica placer). Pure: runs in the driver, called
by the controller's topic and partition handlers.

Invariants: a partition's replicas are distinct brokers; leaders (first replicas) spread
round-robin; with brokers on more than one rack, a partition's replicas take distinct racks first.
"""

from __future__ import annotations

import random


def assign_replicas(brokers: list[int], partitions: int, rf: int,
                    racks: dict[int, str] | None = None) -> list[list[int]]:
    """Kafka's replica assignment: leaders round-robin from a random start, followers shifted so
    that replicas spread evenly. With brokers on more than one rack (executor host), brokers are
    ordered alternating racks and each partition's replicas take distinct racks first, so losing
    one host never takes every replica of a partition."""
    racks = racks or {}
    if len(set(racks.get(b, "") for b in brokers)) > 1:
        brokers = _rack_alternating(brokers, racks)
    n = len(brokers)
    start = random.randrange(n)
    shift = random.randrange(n)
    out = []
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        candidates = [brokers[(first + 1 + (shift + j) % (n - 1)) % n] for j in range(n - 1)]
        replicas = [brokers[first]]
        used = {racks.get(brokers[first], "")}
        for broker in candidates:  # other racks first, then whatever is left
            if len(replicas) < rf and racks.get(broker, "") not in used:
                replicas.append(broker)
                used.add(racks.get(broker, ""))
        for broker in candidates:
            if len(replicas) < rf and broker not in replicas:
                replicas.append(broker)
        out.append(replicas)
    return out


def _rack_alternating(brokers: list[int], racks: dict[int, str]) -> list[int]:
    """Brokers ordered rack by rack in turn: [a1, b1, c1, a2, b2, ...] (as Kafka orders them)."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers):
        by_rack.setdefault(racks.get(b, ""), []).append(b)
    queues = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    while len(out) < len(brokers):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out
