"""Replication throttles for moves: Kafka's `leader.replication.throttled.rate` and
`follower.replication.throttled.rate` (its ReplicationQuotaManager), in bytes per second per
broker.

Which replicas are throttled: the ones a reassignment adds, whatever started it (a plan, a
balance, a scale-in draining brokers), as `kafka-reassign-partitions --throttle` marks the
moving replicas in Kafka's `*.replication.throttled.replicas` topic configs. In-sync followers
never are: acks=all waits on them. A moving replica copies in two steps, both throttled:
- the catch-up job (catch_up.py) copies the bulk before it joins, each task paced at its share
  of its leader's and its new broker's rates (`move_rates`);
- then its broker's fetcher copies what was written meanwhile until it joins the ISR: the
  follower leaves its fetch out while its broker's follower rate is exceeded, and the leader
  answers it without records while its own leader rate is exceeded (Kafka's
  shouldFollowerThrottle and shouldLeaderThrottle); a throttled fetch carries at most a second
  of the rate.

The rate is measured as Kafka measures it (replication.quota.window.num windows of
replication.quota.window.size.seconds), so a move starts at full speed and settles at the rate.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from deltabus.cluster.catch_up import CatchUpTask
from deltabus.quotas import QuotaRate

UNTHROTTLED = 2**63 - 1  # Kafka's Long.MAX_VALUE: no throttle
REPLICATION_QUOTA_WINDOW_NUM = 11  # Kafka's replication.quota.window.num
REPLICATION_QUOTA_WINDOW_SIZE_S = 1.0  # Kafka's replication.quota.window.size.seconds


class ReplicationQuota:
    """One broker's rate for one side of throttled replication. Thread-safe: every fetcher
    thread of a follower, or every fetch a leader answers, records into the same one."""

    def __init__(self, bytes_per_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.bound = bytes_per_s
        self._clock = clock
        self._rate = QuotaRate(REPLICATION_QUOTA_WINDOW_NUM, REPLICATION_QUOTA_WINDOW_SIZE_S)
        self._lock = threading.Lock()

    @property
    def throttles(self) -> bool:
        return self.bound < UNTHROTTLED

    def exceeded(self) -> bool:
        """Whether throttled replicas have copied faster than the bound of late."""
        if not self.throttles:
            return False
        with self._lock:
            return self._rate.measure(self._clock()) > self.bound

    def record(self, size_bytes: int) -> None:
        """Count bytes a throttled replica copied."""
        if self.throttles and size_bytes > 0:
            with self._lock:
                self._rate.record(size_bytes, self._clock())

    def fetch_bytes(self, max_bytes: int) -> int:
        """What one fetch of a throttled replica may carry: a second of the rate, so the rate
        holds fetch by fetch rather than in bursts of a whole answer."""
        return max(1, min(max_bytes, self.bound))


def move_rates(tasks: list[CatchUpTask], leader_rate: int, follower_rate: int,
               parallel: int | None = None) -> list[CatchUpTask]:
    """The catch-up tasks of a reassignment, each paced at its share of its source broker's
    leader rate and its target broker's follower rate: shared by the broker's tasks that run
    at once (all of them, or at most `parallel`, the job's task slots); unchanged when neither
    rate throttles."""
    if leader_rate >= UNTHROTTLED and follower_rate >= UNTHROTTLED:
        return tasks
    at_once = len(tasks) if parallel is None else max(1, parallel)
    sources = Counter(t.source for t in tasks)
    targets = Counter(t.target for t in tasks)
    return [replace(t, bytes_per_s=min(leader_rate / min(sources[t.source], at_once),
                                       follower_rate / min(targets[t.target], at_once)))
            for t in tasks]
